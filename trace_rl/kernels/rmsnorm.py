"""Fused residual add + RMSNorm, and plain RMSNorm over rows (the decode step's norms in one launch each).

`add_rms_norm(x, residual, weight, eps) -> (h, new_residual)`: new_residual = x + residual (rounded to the
input dtype, as torch's add), h = weight * (new_residual * rsqrt(mean(new_residual^2) + eps)). The
rounding sequence is the torch module's (`trace_rl.models.norm.RMSNorm`): normalise in float32, cast to
the input dtype, then multiply by the weight and round again. `residual=None` is plain RMSNorm (used for
Qwen3's q/k-norm over [tokens * heads, head_dim] rows). Torch reference: `add_rms_norm_reference`.

One program normalises BLOCK_M rows of the whole hidden size (a decode row of 4096 bf16 is 8 KB), so a
step's norm is one launch instead of the seven elementwise/reduction kernels torch runs (cast, pow, mean,
add, rsqrt, mul, cast, mul, plus the residual add).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_rows(x_ptr, r_ptr, w_ptr, r_out_ptr, n_rows, N, eps, stride_x, stride_r, stride_ro,
                       out_dtype: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """One tile of rows: the residual add (x + residual stored to r_out) and the RMSNorm -> (rows, rows64, cols, mask,
    h in `out_dtype`). Shared by `_add_rms_norm_kernel` and rmsnorm_quantize's fused kernel, so both compute the
    same float ops in the same layout (the fused kernel's bits are this kernel's)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows64 * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)          # torch's add: float32, rounded once
        tl.store(r_out_ptr + rows64 * stride_ro + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / N + eps)
    h = (xf * inv[:, None]).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    return rows, rows64, cols, mask, (h * w[None, :]).to(out_dtype)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, r_out_ptr, n_rows, N, eps, stride_x, stride_r, stride_h,
                         stride_ro, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, rows64, cols, mask, h = _add_rms_norm_rows(x_ptr, r_ptr, w_ptr, r_out_ptr, n_rows, N, eps, stride_x,
                                                     stride_r, stride_ro, h_ptr.dtype.element_ty, HAS_RESIDUAL,
                                                     BLOCK_M, BLOCK_N)
    tl.store(h_ptr + rows64 * stride_h + cols[None, :], h, mask=mask)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch spec (the model's RMSNorm after torch's residual add)."""
    r = x if residual is None else x + residual
    dtype = r.dtype
    h = r if dtype == torch.float64 else r.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype), r


def _tiles(n_rows: int, n: int) -> tuple[int, int, int]:
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(triton.next_power_of_2(n_rows), 4096 // block_n if block_n <= 4096 else 1, 16))
    return block_m, block_n, 4 if block_n * block_m <= 4096 else 8


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel version of `add_rms_norm_reference`: x, residual [..., N] (same shape and dtype)."""
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"add_rms_norm: weight {tuple(weight.shape)} does not match rows of {n}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} {residual.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    if n > 16384:
        raise ValueError(f"add_rms_norm: rows of {n} elements exceed the one-tile kernel (16384)")
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    h = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    if residual is None:
        r2, r_out = x2, x2
    else:
        r2 = residual.reshape(-1, n)
        r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
        r_out = torch.empty_like(h)
    block_m, block_n, warps = _tiles(rows, n)
    _add_rms_norm_kernel[(triton.cdiv(rows, block_m),)](
        x2, r2, weight, h, r_out, rows, n, eps, x2.stride(0), r2.stride(0), h.stride(0), r_out.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return h.view(x.shape), (x if residual is None else r_out.view(x.shape))
