"""SiLU(gate) * up over the stacked gate/up projection output: one launch instead of torch's three.

Input [..., 2I] (gate in the first I columns, up in the last I: `Linear.fuse` stacks gate_proj then
up_proj), output [..., I]. Rounding as torch computes `F.silu(gate) * up` in the input dtype: SiLU in
float32, rounded to the dtype, then the product in float32, rounded again. Torch reference:
`silu_mul_reference`.

**Exact SiLU** (`EXACT_SILU`, on by default; issue 16): torch's CUDA SiLU (aten/src/ATen/native/cuda/
ActivationSiluKernel.cu) is `x / (opmath_t(1) + c10::cuda::compat::exp(-x))` in float32: nvcc's accurate `expf`
(libdevice `__nv_expf`, no fast math) and an IEEE division (div.rn). `silu_f32` with EXACT computes the same
with `libdevice.exp` and `tl.math.div_rn`; the sm_90 SASS is the same instruction sequence as nvcc 13's for
torch's lambda (checked by hand, 2026-12-02: both contract `1 + exp(-x)`'s last multiply into one FFMA with the
1; Triton's libdevice runs with flush-to-zero reflect, which changes only subnormal results of the exp, absorbed
in 1 + e; `tl.math.div_rn` is the non-FTZ div.rn.f32, as nvcc's), so the result is torch's bit for bit
(tests/kernels/test_silu_exact_gpu.py). Without EXACT: the old fast form, `tl.exp` (ex2.approx) and Triton's
approximate division: within ~1 bf16 ulp of torch, not equal.

The CPU Triton interpreter has no libdevice (Triton 3.9: `libdevice.exp` returns None there), so an interpreted
launch takes `tl.exp` with div_rn (`silu_exact_constexpr()` says False and logs it once): numpy's float32 exp,
which may differ from torch's CPU exp in the last bit. Bit-identity is a GPU property, tested on the GPU.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from trace_rl.kernels import interpreting

# SiLU as torch's CUDA kernel computes it (module doc) in every fused SiLU x mul: this file's kernel and the
# W4A4 quantize kernels' SILU_MUL operand (fp4_block_tiles._load_operand). False: the old fast form.
EXACT_SILU = True
_log = logging.getLogger(__name__)
_interp_logged = False


def silu_exact_constexpr() -> bool:
    """The SILU_EXACT constexpr a launch passes: `EXACT_SILU`, except under the interpreter (no libdevice), where
    the exact form's exp cannot run: False there, said once in the log."""
    global _interp_logged
    if EXACT_SILU and interpreting():
        if not _interp_logged:
            _log.info("swiglu: TRITON_INTERPRET=1 has no libdevice exp; fused SiLU runs tl.exp (numpy) + div_rn, "
                      "not torch's CUDA bits (those are a GPU property)")
            _interp_logged = True
        return False
    return EXACT_SILU


@triton.jit
def silu_f32(x, EXACT: tl.constexpr):
    """SiLU of float32 x in float32. EXACT: torch's CUDA formula bit for bit (module doc); else the fast form."""
    if EXACT:
        return tl.math.div_rn(x, 1.0 + libdevice.exp(-x))
    else:
        return x / (1.0 + tl.exp(-x))


@triton.jit
def silu_mul_f32(g, u, EXACT: tl.constexpr, INTERPRETED_EXP: tl.constexpr = False):
    """`F.silu(g) * u` for g, u of one low-precision dtype, rounded as torch rounds it (SiLU in float32 rounded to
    the dtype, then the float32 product rounded to the dtype), returned as float32. INTERPRETED_EXP: the
    interpreter's stand-in for EXACT (tl.exp, div_rn)."""
    gf = g.to(tl.float32)
    if INTERPRETED_EXP:
        s = tl.math.div_rn(gf, 1.0 + tl.exp(-gf))
    else:
        s = silu_f32(gf, EXACT)
    return (s.to(g.dtype).to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)


def silu_launch_args() -> dict:
    """The launch arguments of a kernel with a fused SiLU: SILU_EXACT / SILU_INTERP (the exact form on the GPU, its
    interpreter stand-in when interpreting with EXACT_SILU on, the fast form when EXACT_SILU is off), and
    enable_fp_fusion=True: nvcc contracts torch's `1 + exp(-x)` into an FFMA (module doc), so the exact form needs
    the contraction; Triton 3.9 warns that its default turns to no fusion in 3.10."""
    exact = silu_exact_constexpr()
    return dict(SILU_EXACT=exact, SILU_INTERP=EXACT_SILU and not exact, enable_fp_fusion=True)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_rows, I, stride_x, stride_o, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     SILU_EXACT: tl.constexpr = False, SILU_INTERP: tl.constexpr = False):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < I)[None, :]
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    g = tl.load(base, mask=mask, other=0.0)
    u = tl.load(base + I, mask=mask, other=0.0)
    out = silu_mul_f32(g, u, SILU_EXACT, SILU_INTERP).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], out, mask=mask)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Kernel version of `silu_mul_reference` (bit for bit on CUDA with `EXACT_SILU`)."""
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"silu_mul: the last dimension ({two_i}) must hold gate and up halves")
    i = two_i // 2
    x2 = gate_up.reshape(-1, two_i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, i, device=gate_up.device, dtype=gate_up.dtype)
    block_n = min(1024, triton.next_power_of_2(i))
    block_m = max(1, min(triton.next_power_of_2(rows), 4096 // block_n))
    grid = (triton.cdiv(rows, block_m), triton.cdiv(i, block_n))
    _silu_mul_kernel[grid](x2, out, rows, i, x2.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
                           num_warps=4, **silu_launch_args())
    return out.view(*gate_up.shape[:-1], i)


def sass_gate_cases():
    """The sm_90 compile gate (sass_gate.py): the tile `silu_mul` launches for I >= 1024 (BLOCK_N 1024,
    BLOCK_M 4, 4 warps: 32 elements per thread), bf16. Loop-free: the whole kernel counts. Triton 3.6 (CPU
    compile): fast form 568 SASS instructions / 32 elements = 17.75 per element (2026-12-01), budget 20; exact
    form (shipped, EXACT_SILU) 983 / 32 = 30.7 (2026-12-02; up to the last EXIT: the IEEE division's out-of-line
    slow path is not counted), budget 34."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(x_ptr="*bf16", out_ptr="*bf16", n_rows="i32", I="i32", stride_x="i32", stride_o="i32")
    return [GateCase(f"silu_mul bf16 4x1024{' exact' if exact else ''}", _silu_mul_kernel, sig,
                     dict(BLOCK_M=4, BLOCK_N=1024, SILU_EXACT=exact, SILU_INTERP=False), 4, 1,
                     4 * 1024 / 128, budget, divisible=("x_ptr", "out_ptr", "I", "stride_x", "stride_o"),
                     register_a=False, forbid=(), whole_kernel=True, options=(("enable_fp_fusion", True),))
            for exact, budget in ((False, 20.0), (True, 34.0))]
