"""FP8 operand cache (mxfp4 only): the operand cache's GEMM on Hopper's FP8 tensor cores, same operand values.

The operand cache (operand_cache.py) keeps each dense FP4 weight's bf16 operand and runs large-M linears as cuBLAS
bf16 GEMMs (compute-bound at M ~ 300). For **mxfp4** every operand value is an E2M1 code (magnitudes 0, 0.5, 1,
1.5, 2, 3, 4, 6: at most 2 significant bits) times a power of two, so after a power-of-two shift per row it is
EXACTLY an E4M3 (float8_e4m3fn) value as long as the row's block exponents are close enough; E4M3 x E4M3 products
are exact in float32 (4-bit significands), so `torch._scaled_mm` (scales 1, float32 output, `FAST_ACCUM` False)
sums the same exact products as the bf16 GEMM, and everything after the accumulator (the FP4 epilogue: row factor,
row scale, bias, one rounding) is shared. nvfp4 cannot do this (E4M3 block scale x E2M1 code needs up to 6
significant bits, e.g. 1.5 x 1.875 = 10.1101b): nvfp4 stays on the bf16 cache (`rollout.operand_cache: fp8` with an
nvfp4 plan is refused).

**E4M3 range.** Normal values (1 + m/8) 2**e for e in [-6, 8] (largest finite 448), subnormals m 2**-9 (m = 1..7).
A code c x 2**j is exact iff c 2**j <= 448 and c 2**j is a multiple of 2**-9: codes 0.5 and 1.5 need j >= -8, 1 and 3
j >= -9, 2 and 6 j >= -10, 4 j >= -11. The largest block is put at j = 6 (6 x 64 = 384), so every block with j >= -8,
i.e. within 14 binades of its row's largest, is exact.

**Weight** (`OperandCacheFP8`, written at attach and every weight sync): the Hopper layout maps each row's largest
block exponent to b = 254, so the bf16 operand is code x 2**(b - 253) <= 12, and the E4M3 cache holds it x 2**5
(`WEIGHT_SHIFT`): code x 2**(b - 248), at most 6 x 64 = 384. Exact iff every nonzero block has b >= 240 (0.5 x
2**(b - 248) >= 2**-9), i.e. its exponent is within 14 binades of its row's largest (a 15-binade span). Checked
when the cache is written, on the values (E4M3 value == bf16 operand x 2**5, NaN where the operand is not finite;
the writers count the finite values that differ): a weight that does not fit at engine build keeps the bf16 cache
(logged by name, `attach_fp8` returns None; one host read per weight there); one that stops fitting at a later
weight sync raises `InexactWeight` (its FP8 buffer is read by captured CUDA graphs and cannot become bf16 in place;
rounding it silently is not allowed): rebuild the engine with `operand_cache: bf16`. The engine's syncs run inside
`deferred_exactness_check` (`backends.quant_linear.fp8_sync_check`): each refresh adds its count to a device slot and
one host read at the end raises once, naming every weight that does not fit (outside it, a read per refresh).

**Writers.** `_weight_e4m3_direct_kernel` (`WRITER_DIRECT`, the default): per block, the E4M3 bytes of its 8 code
magnitudes x 2**(b - 248) as two int32 words (operand_cache_fp8_direct.py), each code one byte of them: ~16
SASS per element instead of `_weight_e4m3_kernel`'s ~41 (through the bf16 operand `_operand_bits` and `e4m3_round`,
`direct=False`); the same bytes and counts for every code and scale byte (tests/kernels/test_operand_cache_fp8_sync.py,
`direct_e4m3_twin`). Both add their count with one relaxed atomic per tile, only where it is nonzero (not one
atomic per tile on a single address). A NaN block (b = 255: the bf16 operand is +-Inf, its row factor NaN) is stored
as E4M3 NaN (0x7F), never as a saturated 448: the row stays NaN.

**Activations** (W4A4, mxfp4 per token; `row_quantize.quantize_dequant_e4m3`, `rmsnorm_quantize
.add_rms_norm_quantize(e4m3=True)`, `rows_e4m3_reference`): the quantize kernels emit E4M3 instead of bf16 in the
same launch (the row amax they already take gives the row's largest block exponent `top`, `e8m0_scale_code(row
amax)`): code x 2**(e - top + 6) (the largest block at 6 x 64 = 384 <= 448) and the float32 row scale
2**(top - 138) = 2**(top - 133) (the shift) x 2**-5 (the weight's `WEIGHT_SHIFT`), which the epilogue multiplies in
(its HAS_ROW_SCALE product; mxfp4's bf16 path has none). So E4M3 value x 2**(top - 133) == the bf16 operand for
every block within 14 binades of its row's largest (e >= top - 14); a block further below (all its values below
2**-14 x 4 x 2**(top - 127), i.e. < 2**-14 of the row's largest block's smallest top value) rounds to the nearest
E4M3 (ties to even), possibly to 0: it cannot be checked without a host sync, and such blocks contribute < 2**-15
relative to the row's largest products. NaN or Inf in a block makes the block NaN in both paths (never a finite
448). Zero rows: top = 0, row scale 2**-138 (a float32 subnormal), all codes 0.

**GEMM** (`accumulate_fp8`): `torch._scaled_mm(a [M, K] e4m3 row-major, w.t(), scale 1, scale 1,
out_dtype=float32, use_fast_accum=FAST_ACCUM)`, then `fp4_dequant.factor_matmul`'s epilogue with the layout's row
factor and the row scale above: y_fp8 = y_bf16 x 2**(138 - top) exactly up to accumulation order, and
y_fp8 x rf x 2**(top - 138) = y_bf16 x rf (powers of two: exact away from float32 overflow/underflow). Hopper's
FP8 MMA adds products inside one instruction at reduced precision unless cuBLAS promotes (the reason `FAST_ACCUM`
is False); benchmarks/fp8cache_h200.sh measures both against a float64 sum.

Paths: `fp4.operand_cache_fp8` (the linear), `fp4.operand_cache_fp8_cast` (bf16 activations that reached an FP8
cache: converted by `rows_e4m3_reference`'s torch ops; named, never silent). Opt-in: `NativeEngine(operand_cache=
"fp8")`, `rollout.operand_cache: fp8` (engine/operand_cache.py). Cost: 1 byte per weight element (half the bf16
cache's 2).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fp4_dequant import _operand_bits, _use_triton
from trace_rl.kernels.fp_bits import e4m3_round
from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY, operand
from trace_rl.kernels.operand_cache_fp8_direct import _weight_e4m3_direct_kernel, direct_e4m3_twin

log = logging.getLogger(__name__)

KEY = "operand_cache"        # the same layout entry as the bf16 cache: one cache per weight, of either kind
WEIGHT_SHIFT = 5             # E4M3 weight = bf16 operand x 2**5 (row max code x 2**(254 - 248) = 6 x 64)
ACT_TOP_BIAS = 133           # E4M3 activation = value x 2**(133 - top): the row's largest block at code x 2**6
ROW_SCALE_BIAS = ACT_TOP_BIAS + WEIGHT_SHIFT    # activation row scale 2**(top - 138)
# the weight writer's tile: half the dequant kernel's 32 x 256 rows (its E4M3 rounding holds more live values per
# element; at 32 rows Triton 3.9's ptxas spilled 138 local accesses at 255 registers, check test_sass_gate)
WRITER_BN, WRITER_BK = 16, 256
EXACT_SPAN = 14              # blocks within this many binades of their row's largest are exact in E4M3
FAST_ACCUM = False           # torch._scaled_mm use_fast_accum (the A/B of benchmarks/fp8cache_gemm.py)

_UNIT: dict = {}


def unit_scale(device) -> torch.Tensor:
    """float32 scalar 1 on `device` for `_scaled_mm`'s scales, allocated once outside CUDA-graph capture."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    one = _UNIT.get(dev)
    if one is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("FP8 operand cache: its unit scale would be allocated inside a CUDA-graph capture; "
                               "attach the cache (or run the layer once) before capturing")
        one = _UNIT[dev] = torch.ones((), dtype=torch.float32, device=dev)
    return one


def accumulate_fp8(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ w [N, K]^T as float32 [M, N], both float8_e4m3fn (cuBLAS FP8, scales 1)."""
    if a.dtype != torch.float8_e4m3fn or w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"accumulate_fp8: takes E4M3 activations and operand, got {a.dtype} and {w.dtype} (an FP8 "
                         f"operand cache needs the activations as quantize_dequant_e4m3 emits them)")
    if a.stride(-1) != 1:
        a = a.contiguous()
    one = unit_scale(a.device)
    return torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=FAST_ACCUM)


# -- weight side --------------------------------------------------------------------------------------------------

@triton.jit
def _weight_e4m3_kernel(codes_ptr, scales_ptr, out_ptr, inexact_ptr, N, K, stride_c, stride_s, stride_o,
                        BN: tl.constexpr, BK: tl.constexpr):
    """out[BN, BK] = E4M3 bytes of the mxfp4 bf16 operand x 2**WEIGHT_SHIFT (`fp4_dequant._operand_bits`: the
    bf16 cache's bits), NaN (0x7F) where the operand is not finite; adds the count of finite values that E4M3 does
    not hold exactly to inexact_ptr (int32)."""
    bits, r64, row_ok = _operand_bits(codes_ptr, scales_ptr, N, K, stride_c, stride_s, True, BN, BK)
    v = (bits << 16).to(tl.float32, bitcast=True) * 32.0             # 2**WEIGHT_SHIFT: exact, <= 384 when finite
    a = tl.abs(v)
    finite = a < float("inf")                                           # False for NaN too
    mag, rounded = e4m3_round(tl.where(finite, a, 0.0))
    code = tl.where(finite, mag | ((bits >> 8) & 0x80), 0x7F)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    ok = row_ok & (cols < K)[None, :]
    tl.store(out_ptr + r64 * stride_o + cols[None, :], code.to(tl.uint8), mask=ok)
    bad = tl.sum(tl.sum((ok & finite & (rounded != a)).to(tl.int32), axis=1), axis=0)
    if bad != 0:                 # no atomic traffic on one address where the tile is exact (the common case)
        tl.atomic_add(inexact_ptr, bad, sem="relaxed")


WRITER_DIRECT = True           # write_weight_e4m3's default: the table-lookup writer (operand_cache_fp8_direct)
DIRECT_BN, DIRECT_BK = 16, 256   # its tile (16.4 SASS per element; 32 x 256 gave 24.0, 64 x 256 22.7: gate CLI)


def weight_e4m3_reference(h) -> tuple[torch.Tensor, int]:
    """(float8_e4m3fn [N, K] = operand(h) x 2**WEIGHT_SHIFT with NaN where the operand is not finite, the number of
    finite operand values it does not hold exactly): the torch spec of `_weight_e4m3_kernel` (mxfp4 layouts)."""
    op = operand(h).float()
    v = op * 2.0 ** WEIGHT_SHIFT
    finite = torch.isfinite(v)
    e4 = torch.where(finite, v, 0.0).to(torch.float8_e4m3fn)
    e4 = torch.where(finite, e4.float(), float("nan")).to(torch.float8_e4m3fn)
    inexact = int((finite & (e4.float() != v)).sum())
    return e4, inexact


def write_weight_e4m3(q, h, out: torch.Tensor, inexact: torch.Tensor, direct: bool | None = None) -> None:
    """Write weight `q`'s E4M3 operand (its Hopper layout `h`, mxfp4) into `out` [N, K] float8_e4m3fn in place and
    add its inexact count to `inexact` (int32 [1]; no host sync here). `direct` (default `WRITER_DIRECT`): the
    table-lookup writer `_weight_e4m3_direct_kernel`; False: `_weight_e4m3_kernel` (through the bf16 operand). Both
    write the same bytes and count."""
    if q.format != "mxfp4" or len(q.shape) != 2:
        raise ValueError(f"FP8 operand cache: takes a dense mxfp4 weight, got {q.format} {tuple(q.shape)} (nvfp4 "
                         f"operands need up to 6 significant bits: keep the bf16 cache)")
    n, k = h.n, h.k
    if not _use_triton(out):
        e4, bad = weight_e4m3_reference(h)
        out.copy_(e4)
        inexact.add_(bad)
        return
    codes = q.codes.reshape(n, k // 2)
    direct = WRITER_DIRECT if direct is None else direct
    kernel, bn, bk = (_weight_e4m3_direct_kernel, DIRECT_BN, DIRECT_BK) if direct else \
        (_weight_e4m3_kernel, WRITER_BN, WRITER_BK)
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    kernel[grid](codes, h.scales, out.view(torch.uint8), inexact, n, k, codes.stride(0), h.scales.stride(0),
                 out.stride(0), BN=bn, BK=bk, num_warps=4)


class InexactWeight(RuntimeError):
    """Weights whose mxfp4 operand E4M3 no longer holds exactly after a weight sync (a row's block exponents span
    > 15 binades): `names` (each weight's cache name) and `counts` (its inexact values), in sync order."""

    def __init__(self, bad: list[tuple[str, int]]):
        self.names = [name for name, _ in bad]
        self.counts = [n for _, n in bad]
        listed = ", ".join(f"{name}: {n} operand values" for name, n in bad[:16])
        more = f" and {len(bad) - 16} more" if len(bad) > 16 else ""
        super().__init__(
            f"FP8 operand cache: {len(bad)} weight(s) do not fit float8_e4m3fn exactly after this weight sync "
            f"({listed}{more}): a row's mxfp4 block exponents span more than {EXACT_SPAN + 1} binades, and the cache "
            f"is read by captured CUDA graphs, so it cannot switch to bf16 in place (rounding it silently is not "
            f"allowed); use the bf16 cache for them: rebuild the engine with rollout.operand_cache: bf16 (or "
            f"NativeEngine(operand_cache='bf16'))")


class _Deferred:
    """One weight sync's inexact counts: an int32 slot per FP8 weight written while it is active, in device buffers
    zeroed once per CHUNK weights; `check` reads them all at once."""

    CHUNK = 1024

    def __init__(self):
        self.names: list[str] = []
        self.chunks: list[torch.Tensor] = []
        self.sizes: list[int] = []        # slots used in each chunk

    def slot(self, device, name: str) -> torch.Tensor:
        device = torch.device(device)
        if not self.chunks or self.sizes[-1] == self.CHUNK or self.chunks[-1].device != device:
            self.chunks.append(torch.zeros(self.CHUNK, dtype=torch.int32, device=device))
            self.sizes.append(0)
        self.names.append(name or "(unnamed)")
        i = self.sizes[-1]
        self.sizes[-1] += 1
        return self.chunks[-1][i:i + 1]

    def check(self) -> None:
        read = {}
        for dev in dict.fromkeys(c.device for c in self.chunks):      # one host read per device (one in practice)
            read[dev] = iter(torch.cat([c[:n] for c, n in zip(self.chunks, self.sizes) if c.device == dev]).tolist())
        counts = [next(read[c.device]) for c, n in zip(self.chunks, self.sizes) for _ in range(n)]
        bad = [(name, n) for name, n in zip(self.names, counts) if n]
        if bad:
            raise InexactWeight(bad)


_LOCAL = threading.local()


def _deferred() -> _Deferred | None:
    return getattr(_LOCAL, "active", None)


@contextlib.contextmanager
def deferred_exactness_check():
    """Within it, every FP8 cache refresh (`OperandCacheFP8.refresh_from`: weight sync) adds its inexact count to a
    device slot instead of reading it back; on leaving, ONE host read checks them all and raises `InexactWeight`
    naming every weight that does not fit (not raised when the body raised). Nested uses join the outermost. The
    engine's syncs run in it (`backends.quant_linear.fp8_sync_check`)."""
    if _deferred() is not None:
        yield _deferred()
        return
    col = _LOCAL.active = _Deferred()
    try:
        yield col
    finally:
        _LOCAL.active = None
    col.check()


class OperandCacheFP8:
    """float8_e4m3fn [N, K] = operand(layout["hopper_fp4"]) x 2**WEIGHT_SHIFT of one dense mxfp4 weight (module doc),
    refreshed in place at weight sync; `name` names the weight in errors and logs."""

    fp8 = True
    stack = None         # never stacked (mxfp4 fuses its shared-input layers: Linear.fuse)
    lo = 0

    def __init__(self, layout: dict, buf: torch.Tensor, name: str = ""):
        self.layout, self.buf, self.name = layout, buf, name
        self.inexact = torch.zeros(1, dtype=torch.int32, device=buf.device)

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def write(self, q) -> int:
        """Write the E4M3 operand of `q` and return how many of its values E4M3 does not hold (one host sync)."""
        self.inexact.zero_()
        write_weight_e4m3(q, self.layout[LAYOUT_KEY], self.buf, self.inexact)
        return int(self.inexact.item())

    def refresh_from(self, q) -> None:
        """Rewrite the cache from `q` (weight sync); inside `deferred_exactness_check` its count goes to the sync's
        slot (checked once at the end), otherwise it is read back here: InexactWeight if any value is inexact."""
        col = _deferred()
        if col is not None:
            write_weight_e4m3(q, self.layout[LAYOUT_KEY], self.buf, col.slot(self.buf.device, self.name))
            return
        bad = self.write(q)
        if bad:
            raise InexactWeight([(self.name or "(unnamed)", bad)])


def attach_fp8(packed, name: str = "") -> OperandCacheFP8 | None:
    """The FP8 operand cache of a dense mxfp4 `packed` weight, allocated, written and checked on first call; None
    (logged by name, nothing attached) when the weight's operand does not fit E4M3 exactly: the caller keeps the
    bf16 cache for it (also for N or K not a multiple of 16, which cuBLAS FP8 does not take). Idempotent for a weight
    that already holds one; an existing bf16 cache is replaced."""
    from trace_rl.kernels.linear import hopper_weight

    oc = packed.layout.get(KEY)
    if getattr(oc, "fp8", False):
        return oc
    if packed.fmt != "mxfp4" or packed.q is None or len(packed.q.shape) != 2:
        raise ValueError(f"FP8 operand cache: takes a dense mxfp4 weight, got {packed.fmt} "
                         f"{None if packed.q is None else tuple(packed.q.shape)} (nvfp4 operands need up to 6 "
                         f"significant bits: keep the bf16 cache)")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("FP8 operand cache: would be allocated inside a CUDA-graph capture; attach it before "
                           "capturing")
    h = hopper_weight(packed)
    if h.n % 16 or h.k % 16:
        log.warning("FP8 operand cache: weight %s keeps the bf16 cache: torch._scaled_mm needs N and K multiples of "
                    "16, it is %dx%d", name or "(unnamed)", h.n, h.k)
        return None
    dev = packed.q.codes.device
    unit_scale(dev)
    oc = OperandCacheFP8(packed.layout, torch.empty(h.n, h.k, dtype=torch.float8_e4m3fn, device=dev), name)
    bad = oc.write(packed.q)
    if bad:
        log.warning("FP8 operand cache: weight %s keeps the bf16 cache: %d of its %d operand values do not fit "
                    "float8_e4m3fn exactly (a row's mxfp4 block exponents span more than %d binades)",
                    name or "(unnamed)", bad, h.n * h.k, EXACT_SPAN + 1)
        return None
    packed.layout[KEY] = oc
    return oc


def is_fp8(packed) -> bool:
    return getattr(packed.layout.get(KEY), "fp8", False)


# -- activation side ----------------------------------------------------------------------------------------------

def rows_e4m3_reference(xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp4 W4A4 operand rows xq [M, K] (bf16 code x block scale, `quantize_dequant_bf16`) -> (float8_e4m3fn
    [M, K], float32 [M] row scale 2**(top - 138)): what the quantize kernels emit with E4M3 on (module doc). top is
    the row's largest block exponent: its largest |value| is code x 2**(top - 127) with code 4 or 6, so top =
    floor(log2(max |xq|)) + 125 (0 for rows whose blocks all have exponent 0, or no finite nonzero value). Also the
    `fp4.operand_cache_fp8_cast` path (bf16 activations that reached an FP8 cache)."""
    v = xq.double()
    finite = torch.isfinite(v)
    amax = torch.where(finite, v.abs(), 0.0).amax(dim=1)
    top = torch.where(amax > 0, torch.frexp(torch.where(amax > 0, amax, 1.0))[1] - 1 + 125, 0).clamp(0, 254)
    shifted = torch.ldexp(torch.where(finite, v, 0.0), (ACT_TOP_BIAS - top)[:, None].double())
    e4 = shifted.float().to(torch.float8_e4m3fn)
    e4 = torch.where(finite, e4.float(), float("nan")).to(torch.float8_e4m3fn)
    row_scale = torch.ldexp(torch.ones_like(amax), (top - ROW_SCALE_BIAS).double()).float()
    return e4, row_scale


def sass_gate_cases():
    """The sm_90 compile gate (sass_gate.py) of the FP8 cache's kernels, loop-free (whole kernel): both weight writers
    (one 16x256 tile a program: the old one through the bf16 operand, the direct one by table lookup), and the E4M3
    stores of the W4A4 quantize at the decoder's widths:
    plain K = 4096, SiLU x mul (exact) K = 12288, RMSNorm-fused 4096. Budgets ~10% over Triton 3.6's counts (CPU
    compile, 2026-12-02), next to the bf16 stores' in the same gate (quantize_dequant mxfp4, add_rms_norm_quantize
    mxfp4)."""
    from trace_rl.kernels.fp4_block_tiles import _dequant_tiles, _quantize_dequant_rows_kernel
    from trace_rl.kernels.rmsnorm import _tiles as norm_tiles
    from trace_rl.kernels.rmsnorm_quantize import _add_rms_norm_quantize_kernel
    from trace_rl.kernels.sass_gate import GateCase

    wsig = dict(codes_ptr="*u8", scales_ptr="*u8", out_ptr="*u8", inexact_ptr="*i32", N="i32", K="i32",
                stride_c="i32", stride_s="i32", stride_o="i32")
    cases = [GateCase(f"{name} mxfp4 {bn}x{bk}", kernel, wsig, dict(BN=bn, BK=bk), 4, 1, bn * bk / 128,
                      GATE_BUDGETS[budget],
                      divisible=("codes_ptr", "scales_ptr", "out_ptr", "K", "stride_c", "stride_s", "stride_o"),
                      register_a=False, forbid=(), whole_kernel=True)
             for name, kernel, bn, bk, budget in (
                 ("weight_e4m3", _weight_e4m3_kernel, WRITER_BN, WRITER_BK, "weight"),
                 ("weight_e4m3_direct", _weight_e4m3_direct_kernel, DIRECT_BN, DIRECT_BK, "weight_direct"))]
    sig = dict(x_ptr="*bf16", out_ptr="*u8", gscale_ptr="*fp32", n_rows="i32", K="i32", stride_x="i32",
               stride_out="i32")
    for name, K, silu in (("K4096", 4096, False), ("silu exact K12288", 12288, True)):
        rows, nb, nch, warps = _dequant_tiles(4096, K, 32, silu)
        cases.append(GateCase(f"quantize_e4m3 mxfp4 {name}", _quantize_dequant_rows_kernel, sig,
                              dict(MX=True, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=silu, SILU_EXACT=silu,
                                   SILU_INTERP=False, E4M3=True), warps, 1, rows * K / (32 * warps),
                              GATE_BUDGETS[name], divisible=("x_ptr", "out_ptr", "gscale_ptr", "K", "stride_x",
                                                             "stride_out"),
                              register_a=False, forbid=(), whole_kernel=True,
                              options=(("enable_fp_fusion", True),) if silu else ()))
    nsig = dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", h_ptr="*bf16", r_out_ptr="*bf16", q_ptr="*u8",
                gscale_ptr="*fp32", n_rows="i32", N="i32", eps="fp32", stride_x="i32", stride_r="i32",
                stride_h="i32", stride_ro="i32", stride_q="i32")
    block_m, block_n, warps = norm_tiles(4096, 4096)
    cases.append(GateCase("add_rms_norm_quantize_e4m3 mxfp4 4096", _add_rms_norm_quantize_kernel, nsig,
                          dict(HAS_RESIDUAL=True, STORE_H=False, MX=True, BLOCK_M=block_m, BLOCK_N=block_n,
                               E4M3=True), warps, 1, block_m * block_n / (32 * warps), GATE_BUDGETS["norm"],
                          divisible=("x_ptr", "r_ptr", "w_ptr", "h_ptr", "r_out_ptr", "q_ptr", "gscale_ptr", "N",
                                     "stride_x", "stride_r", "stride_h", "stride_ro", "stride_q"),
                          register_a=False, forbid=(), whole_kernel=True))
    return cases


# Triton 3.6: weight 41.0 (the old writer, 44 registers), weight_direct 16.4 (71 registers; Triton 3.9: 40.7 / 15.8),
# K4096 42.8 (bf16 stores: 26.0), SiLU exact K12288 73.5,
# norm 51.1 (bf16 stores: 34.2) SASS per element and thread. The E4M3 rounding is done on the bits (`e4m3_round`: exact
# in the interpreter too, whose float8 cast truncates subnormal ties); ~1 us of issue at 313 x 4096, under the launch's
# memory and latency.
GATE_BUDGETS = {"weight": 45.0, "weight_direct": 18.0, "K4096": 47.0, "silu exact K12288": 81.0, "norm": 56.0}


__all__ = ["ACT_TOP_BIAS", "EXACT_SPAN", "FAST_ACCUM", "InexactWeight", "OperandCacheFP8", "ROW_SCALE_BIAS",
           "WEIGHT_SHIFT", "WRITER_DIRECT", "accumulate_fp8", "attach_fp8", "deferred_exactness_check",
           "direct_e4m3_twin", "is_fp8", "rows_e4m3_reference", "unit_scale", "weight_e4m3_reference",
           "write_weight_e4m3"]
