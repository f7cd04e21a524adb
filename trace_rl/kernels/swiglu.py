"""SiLU(gate) * up over the stacked gate/up projection output: one launch instead of torch's three.

Input [..., 2I] (gate in the first I columns, up in the last I: `Linear.fuse` stacks gate_proj then
up_proj), output [..., I]. Rounding as torch computes `F.silu(gate) * up` in the input dtype: SiLU in
float32, rounded to the dtype, then the product in float32, rounded again. Torch reference:
`silu_mul_reference`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_rows, I, stride_x, stride_o, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < I)[None, :]
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    g = tl.load(base, mask=mask, other=0.0)
    u = tl.load(base + I, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    out = (s * u.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], out, mask=mask)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Kernel version of `silu_mul_reference`."""
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
                           num_warps=4)
    return out.view(*gate_up.shape[:-1], i)


def sass_gate_cases():
    """The sm_90 compile gate (sass_gate.py): the tile `silu_mul` launches for I >= 1024 (BLOCK_N 1024,
    BLOCK_M 4, 4 warps: 32 elements per thread), bf16. Loop-free: the whole kernel counts. Triton 3.6 today
    (CPU compile, 2026-12-01): 568 SASS instructions / 32 elements = 17.75 per element; budget 20 (~10%)."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(x_ptr="*bf16", out_ptr="*bf16", n_rows="i32", I="i32", stride_x="i32", stride_o="i32")
    return [GateCase("silu_mul bf16 4x1024", _silu_mul_kernel, sig, dict(BLOCK_M=4, BLOCK_N=1024), 4, 1,
                     4 * 1024 / 128, 20.0, divisible=("x_ptr", "out_ptr", "I", "stride_x", "stride_o"),
                     register_a=False, forbid=(), whole_kernel=True)]
