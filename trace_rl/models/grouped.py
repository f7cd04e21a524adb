"""Expert dispatch for mixture-of-experts layers: sort token slots by expert, grouped matmul, un-permute.

A token routed to k experts occupies k *slots*. `permute` lays the slots out sorted by expert, each
expert's group padded to a multiple of `align` rows (grouped GEMM kernels want tile-aligned groups),
in a buffer of a size fixed by the shapes alone: N*k + E*(align-1) rows. Everything is computed on
the device without a host sync (argsort, scatter, cumsum: no `.item()`, `.tolist()`, `nonzero` or
`bincount`), so a decode step that dispatches experts can be captured in a CUDA graph.

The grouped matmuls over this buffer are `trace_rl.backends.grouped_linear` (`grouped_mm` for plain
weights, `GroupedQuantLinear` for packed ones). Rows of the buffer past the last group hold garbage after
`torch._grouped_mm` (it does not write them); the un-permute never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Permutation:
    """Where each slot of `ids [N, k]` went. `rows` = N*k + E*(align-1) (static)."""

    token_of_row: torch.Tensor    # [rows] int64: source token of each buffer row (N = a zero padding row)
    row_of_slot: torch.Tensor     # [N*k] int64: buffer row of slot (token n, choice j) at n*k + j
    ends: torch.Tensor            # [E] int32: end row (exclusive) of each expert's group
    num_tokens: int
    top_k: int
    padded: bool = True           # False: align 1, every row is a slot (no zero padding row is read)

    @property
    def rows(self) -> int:
        return self.token_of_row.shape[0]


def buffer_rows(num_tokens: int, top_k: int, num_experts: int, align: int = 1) -> int:
    return num_tokens * top_k + num_experts * (align - 1)


def permute(ids: torch.Tensor, num_experts: int, align: int = 1) -> Permutation:
    """Sort the slots of `ids [N, k]` (expert ids in [0, E)) by expert; groups padded to `align` rows."""
    if align == 1:
        return _permute_unpadded(ids, num_experts)
    return _permute_padded(ids, num_experts, align)


def _permute_unpadded(ids: torch.Tensor, num_experts: int) -> Permutation:
    """align 1: the stably sorted slots are the buffer, and a group ends where the sorted ids pass its expert
    (searchsorted): the same Permutation as `_permute_padded(ids, E, 1)` in ~half the launches, which the
    decode step of every FP4 MoE layer pays."""
    n, k = ids.shape
    keys, order = torch.sort(ids.reshape(-1), stable=True)
    bounds = torch.arange(1, num_experts + 1, device=ids.device, dtype=keys.dtype)
    ends = torch.searchsorted(keys, bounds, out_int32=True)       # slots with expert < e + 1
    row_of_slot = torch.empty_like(order).scatter_(0, order, torch.arange(n * k, device=ids.device))
    return Permutation(order // k, row_of_slot, ends, n, k, padded=False)


def _permute_padded(ids: torch.Tensor, num_experts: int, align: int) -> Permutation:
    n, k = ids.shape
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)                       # slots, grouped by expert
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + (align - 1)) // align * align
    start = torch.cumsum(counts, 0) - counts                       # first sorted slot of each expert
    ends = torch.cumsum(padded, 0)
    pstart = ends - padded                                         # first buffer row of each expert
    expert = flat[order]
    dest = pstart[expert] + torch.arange(n * k, device=ids.device) - start[expert]
    row_of_slot = torch.empty_like(dest).scatter_(0, order, dest)
    rows = buffer_rows(n, k, num_experts, align)
    token_of_row = torch.full((rows,), n, dtype=torch.long, device=ids.device)
    token_of_row.scatter_(0, dest, order // k)
    return Permutation(token_of_row, row_of_slot, ends.to(torch.int32), n, k)


def gather_rows(x: torch.Tensor, perm: Permutation) -> torch.Tensor:
    """x [N, H] -> the buffer [rows, H]: each row its token's input, padding rows zero."""
    if not perm.padded:
        return x[perm.token_of_row]
    padded = torch.cat([x, x.new_zeros(1, x.shape[1])])
    return padded[perm.token_of_row]


def unpermute(y: torch.Tensor, perm: Permutation, weights: torch.Tensor) -> torch.Tensor:
    """Buffer outputs [rows, H] -> [N, H]: each token's k expert outputs weighted by `weights [N, k]`."""
    per_slot = y[perm.row_of_slot].view(perm.num_tokens, perm.top_k, y.shape[-1])
    return (per_slot * weights.to(y.dtype).unsqueeze(-1)).sum(1)
