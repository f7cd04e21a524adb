"""`quantize(..., fast=True)` (the weight sync's re-quantization: nvfp4 / mxfp4 by the block-tile kernel,
weight_quantize.py; nvfp4 / nvfp4:row dividing by the block scales as a reciprocal per block plus exact FMA
corrections) against the torch reference and the default path: codes and scales bit for bit, on random odd
shapes and on the edges: elements on and next to every E2M1 rounding boundary under non-power-of-two block
scales, zero / -0.0 / subnormal blocks, blocks whose scale rounds to zero, NaN and Inf blocks, and tensor
amaxes at and past the ends of the fast division's range (2**-58, 2**99).

Inputs are made in float32 on the CPU and fed as float32 (or bf16 built on the CPU): the interpreter's own
BF16 casts are not used on anything compared (see fp_bits.py)."""

import pytest
import torch
import triton
import triton.language as tl

from trace_rl.formats import get_format, unpack_nibbles
from trace_rl.kernels import quantize
from trace_rl.kernels.fp_bits import e2m1_code, e2m1_encode

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN blocks, interpreter

FORMATS = ["nvfp4", "nvfp4:row", "mxfp4"]


def _finite_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    b = torch.isfinite(x.float()).reshape(*x.shape[:-1], -1, block).all(-1)
    return b.repeat_interleave(block, dim=-1)


def _check(x: torch.Tensor, fmt: str, device: str) -> None:
    """The fast path and the default path both equal the reference: codes of finite blocks, every scale (NaN
    blocks' included), the global scale."""
    ref = get_format(fmt).quantize(x)
    fast = quantize(x.to(device), fmt, fast=True)
    slow = quantize(x.to(device), fmt, fast=False)
    ok = _finite_blocks(x, 32 if fmt == "mxfp4" else 16)
    ref_codes = unpack_nibbles(ref.codes)
    for q, what in ((fast, "fast"), (slow, "default")):
        assert q.shape == ref.shape and q.codes.shape == ref.codes.shape and q.scales.dtype == ref.scales.dtype
        codes = unpack_nibbles(q.codes.cpu())
        assert torch.equal(codes[ok], ref_codes[ok]), f"{what}: E2M1 codes differ in finite blocks"
        assert torch.equal(q.scales.cpu().view(torch.uint8), ref.scales.view(torch.uint8)), f"{what}: scales"
        if ref.global_scale is None:
            assert q.global_scale is None
        else:
            assert torch.equal(q.global_scale.cpu(), ref.global_scale), f"{what}: global scale"


def _boundary_rows(n_rows: int, gen: torch.Generator) -> torch.Tensor:
    """float32 [n_rows, 96]: per row, one block holding the row (and tensor) amax 2688 * s, then blocks with
    amax 6 * scale for non-power-of-two E4M3 block scales, their other elements every E2M1 midpoint and
    magnitude times the block scale, shifted by -2..+2 ulps, both signs."""
    from trace_rl.formats.e2m1 import E2M1_MAGNITUDES, E2M1_MIDPOINTS

    targets = torch.tensor(sorted(set(E2M1_MIDPOINTS + E2M1_MAGNITUDES[1:])), dtype=torch.float32)
    s = float(torch.rand((), generator=gen) * 1.5 + 0.5)          # global scale ~ s (amax 2688 s), every row
    g = torch.tensor(2688 * s, dtype=torch.float32) / 2688              # the reference's global scale
    rows = []
    for r in range(n_rows):
        row = torch.zeros(96)
        row[0] = 2688 * s
        for b in range(1, 6):
            code = int(torch.randint(0x20, 0x7E, (), generator=gen))    # a normal E4M3 scale below 448
            scale = torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
            full = scale * g
            t = targets[torch.randint(0, len(targets), (15,), generator=gen)]
            vals = (t * full).view(torch.int32) + torch.randint(-2, 3, (15,), generator=gen, dtype=torch.int32)
            vals = vals.view(torch.float32) * torch.where(torch.rand(15, generator=gen) < 0.5, -1.0, 1.0)
            row[16 * b] = 6 * full.item() * (1 if r % 2 else -1)           # block amax: scale rounds to `code`
            row[16 * b + 1: 16 * b + 16] = vals
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,K", [(1, 32), (5, 96), (3, 1056)])   # 1056: two K chunks in the interpreter
def test_fast_div_random_odd_shapes(fmt, rows, K, device, gen):
    x = torch.randn(rows, K, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen) * 3)
    _check(x, fmt, device)
    _check(x.to(torch.bfloat16), fmt, device)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fast_weight_kernel_strided_and_batched(fmt, device, gen):
    """The block-tile kernel on a row-strided view (columns of a wider tensor) and on [E, N, K] experts."""
    wide = torch.randn(7, 160, generator=gen) * 3
    _check(wide[:, :96], fmt, device)
    _check(torch.randn(3, 5, 64, generator=gen), fmt, device)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_div_on_e2m1_boundaries(fmt, device, gen):
    _check(_boundary_rows(7, gen), fmt, device)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_div_zero_subnormal_and_nonfinite_blocks(fmt, device, gen):
    x = torch.randn(6, 96, generator=gen)
    x[0] = 0.0                                      # all-zero row (nvfp4:row global scale 1)
    x[1, :16] = -0.0                                # a -0.0 block
    x[1, 16:32] = torch.tensor([1e-40, -1e-41, 1.4e-45, -1.4e-45] * 4)   # subnormal block: scale rounds to 0
    x[1, 32] = 1e-40                                # a subnormal in a normal block
    x[2, :16] *= 1e-6                               # a block whose E4M3 scale is subnormal / zero
    x[3, 5] = float("nan")                          # NaN block
    x[4, 70] = float("inf")                         # +Inf block
    x[5, 17] = -float("inf")
    _check(x, fmt, device)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("amax", [2.0 ** -58, 2.0 ** -58 * (1 - 2 ** -24), 2.0 ** 99, 2.0 ** 99 * (1 + 2 ** -23),
                                  1e-30, 1e35])
def test_fast_div_at_the_ends_of_its_range(fmt, amax, device, gen):
    """Tensor / row amax at the fast path's limits (divisors down to 2**-80, up to 2**100) and past them
    (the kernel falls back to div_rn): same bits either way. Rows 1..: spread downwards from amax, so block
    scales run down to subnormal / zero E4M3."""
    x = torch.randn(4, 64, generator=gen) * torch.exp2(-torch.arange(0, 64, dtype=torch.float32)[None, :] / 3)
    x = x / x.abs().amax(1, keepdim=True) * amax
    x[:, 0] = amax
    _check(x.float(), fmt, device)


def _large_shape(fmt: str, N: int, K: int) -> tuple[int, int]:
    """The GPU test's shape for `fmt`: K rounded up to the format's block (the odd case, K = 1040, is 65 nvfp4
    blocks but 32.5 mxfp4 ones; mxfp4 gets 1056 = 33 blocks, still not a multiple of 64 or 128)."""
    G = 32 if fmt == "mxfp4" else 16
    return N, -(-K // G) * G


LARGE_SHAPES = [(1024, 12288), (4096, 4096), (771, 1040)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_large_shapes_are_quantizable(fmt):
    """Every shape the GPU test below quantizes is valid for its format (the H200 run of 2026-12-02 failed on
    mxfp4 771 x 1040: K = 1040 is not a multiple of 32, so the reference and both kernel paths raise)."""
    for N, K in LARGE_SHAPES:
        N, K = _large_shape(fmt, N, K)
        get_format(fmt).quantize(torch.zeros(2, K))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("fast", [False, True])
def test_block_indivisible_k_is_rejected(fmt, fast, device):
    """K not a multiple of the block: the kernels refuse it as the reference does (mxfp4, K = 1040)."""
    K = 1040 if fmt == "mxfp4" else 1032
    with pytest.raises(ValueError, match="blocks of"):
        get_format(fmt).quantize(torch.zeros(3, K))
    with pytest.raises(ValueError, match="blocks of"):
        quantize(torch.zeros(3, K, device=device), fmt, fast=fast)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("N,K", LARGE_SHAPES)
def test_fast_div_large_weight_gpu(fmt, N, K, gen):
    """Qwen3-8B-sized weights (and an odd one) on the GPU: fast path == reference == div_rn path."""
    N, K = _large_shape(fmt, N, K)
    x = (torch.randn(N, K, generator=gen) * 0.02).to(torch.bfloat16)
    x[3, :16] = 0.0
    x[5, 7] = float("nan")
    _check(x, fmt, "cuda")
    _check(_boundary_rows(512, gen), fmt, "cuda")


@triton.jit
def _e2m1_code_probe(q_ptr, out_ptr, ref_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, e2m1_code(q), mask=offs < n)
    tl.store(ref_ptr + offs, e2m1_encode(q), mask=offs < n)


def test_e2m1_code_is_e2m1_encode(device):
    """`fp_bits.e2m1_code` (bit tricks) gives `e2m1_encode`'s code on every float32 within 4096 ulps of each
    E2M1 rounding midpoint and magnitude (both signs), on +-0, subnormals, the largest finite, +-Inf and random
    floats; and the reference's code too. Both are monotone step functions of |q| with the same steps, so
    agreeing around every step is agreeing everywhere."""
    from tests.kernels.test_quantize import _floats_near_e2m1_boundaries, probe_block
    from trace_rl.formats.e2m1 import e2m1_encode as reference_encode

    q = _floats_near_e2m1_boundaries()
    q = torch.cat([q, torch.tensor([float("inf"), -float("inf")])])
    out = torch.empty(q.numel(), dtype=torch.int32, device=device)
    ref = torch.empty_like(out)
    block = probe_block(device)
    _e2m1_code_probe[(triton.cdiv(q.numel(), block),)](q.to(device), out, ref, q.numel(), BLOCK=block)
    assert torch.equal(out.cpu(), ref.cpu())
    assert torch.equal(out.cpu(), reference_encode(q).to(torch.int32))
