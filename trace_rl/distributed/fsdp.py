"""The sharded trainer: process group, FSDP2 (`fully_shard`) over the decoder, and data-parallel rows.

- One FSDP unit per `DecoderLayer` plus the root (embeddings, final norm, lm_head): a layer's weights are
  all-gathered just before its forward and freed after it; a tied lm_head shares the root's embedding.
- Data parallel: each rank runs its contiguous slice of a batch's rows (`local_rows`). Losses are scaled
  by rows / global rows, and gradients are *summed* across ranks (gradient divide factor 1), so the step
  is the one a single process takes on the whole batch: the same loss and gradients up to float
  summation order (tests/distributed/test_fsdp.py checks it on CPU with gloo).
- The precision plan's trainer stage needs nothing special: FSDP2 swaps the full (unsharded) weight into
  each `Linear` for its forward, so aligned/guided fake quantization sees the same tensor (and per-tensor
  global scale) as in one process.
- Mixed precision: `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)`: parameters stay float32
  shards (the optimizer's copy), compute runs in bf16, gradients are reduced in float32.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("trace_rl.distributed")


def launch_hint(world: int) -> str:
    return f"torchrun --nproc-per-node {world} -m trace_rl run CONFIG"


def init_trainer_group(world: int, device: torch.device) -> tuple[int, int, torch.device]:
    """(rank, world size, this rank's device). Joins the process group torchrun described in the environment
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) unless one is already initialised."""
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            raise RuntimeError(f"distributed.trainer_gpus={world} needs one process per trainer rank; launch with "
                               f"`{launch_hint(world)}` (or set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)")
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, init_method="env://")
    if dist.get_world_size() != world:
        raise RuntimeError(f"distributed.trainer_gpus={world} but the process group has {dist.get_world_size()} "
                           f"ranks; launch with `{launch_hint(world)}`")
    rank = dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        torch.cuda.set_device(device)
    return rank, dist.get_world_size(), device


def shard_model(model: nn.Module, device: torch.device, mixed_precision: str = "off") -> nn.Module:
    """FSDP2 over the default process group: each decoder layer, then the root. In place; returns `model`.

    Build the optimizer after this (it must hold the sharded DTensor parameters)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if getattr(model, "is_rollout", False):
        raise ValueError("shard_model: this is a rollout (packed) model; shard the trainer's model")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif mixed_precision == "off":
        policy = MixedPrecisionPolicy()
    else:
        raise ValueError(f"mixed_precision must be 'off' or 'bf16', got {mixed_precision!r}")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():       # sum, not mean, over ranks: see the module docstring
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)   # gloo has no PREMUL_SUM (a factor-1 sum needs none)
    log.info("FSDP2: %d decoder layers + root sharded over %d ranks (%s), mixed precision %s",
             len(model.model.layers), dist.get_world_size(), device.type, mixed_precision)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@torch.no_grad()
def full_state_dict(model: nn.Module, keep_on: torch.device | str | None = None) -> dict[str, torch.Tensor] | None:
    """The trainer's full (unsharded) state dict, e.g. for a weight sync.

    Sharded: collective (every rank must call it), one tensor gathered at a time; rank 0 keeps them (moved
    to `keep_on` if given), the other ranks get None. Unsharded: `model.state_dict()`."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.tensor import DTensor

    sd = model.state_dict(keep_vars=True)     # the Parameters themselves: a tied one appears twice, one object

    keep = dist.get_rank() == 0
    full, gathered = {}, {}          # gathered: by id, so a tied parameter is all-gathered once
    for key, value in sd.items():
        if id(value) not in gathered:
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            gathered[id(value)] = (whole.detach() if keep_on is None else whole.detach().to(keep_on)) if keep else None
        if keep:
            full[key] = gathered[id(value)]
    return full if keep else None


def local_rows(rows: int, rank: int, world: int) -> slice:
    """This rank's contiguous slice of `rows` items (sizes differ by at most one)."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def rank_micro_batches(rows: int, micro_batch_size: int, rank: int, world: int) -> list[tuple[slice, float]]:
    """(rows, weight) of this rank's micro-batches of a global batch of `rows`.

    The global batch is cut as one process cuts it (micro-batches of `micro_batch_size`, weight rows/`rows`),
    and each rank takes a contiguous block of whole micro-batches: with at least `world` micro-batches the
    step is exactly the single-process one. With fewer, micro-batches shrink to ceil(rows / world) rows so
    every rank has work. FSDP needs every rank to run as many forwards/backwards as the others: a rank
    with one micro-batch fewer runs a filler pass (the batch's first micro-batch, weight 0)."""
    size = min(micro_batch_size, -(-rows // world))
    starts = list(range(0, rows, size))
    every = [(slice(s, min(s + size, rows)), (min(s + size, rows) - s) / rows) for s in starts]
    mine = every[local_rows(len(every), rank, world)]
    passes = -(-len(every) // world)
    return mine + [(every[0][0], 0.0)] * (passes - len(mine))


def rank_row_counts(rows: int, micro_batch_size: int, world: int) -> list[int]:
    """Rows each rank owns under `rank_micro_batches` (their blocks are contiguous, in rank order)."""
    return [sum(s.stop - s.start for s, w in rank_micro_batches(rows, micro_batch_size, r, world) if w)
            for r in range(world)]


def all_gather_rows(local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Concatenate every rank's `local` rows (rank r holds sizes[r] of them) on every rank."""
    width = max(sizes)
    padded = local.new_zeros((width, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s Python object on every rank (pickled; batches and metrics, not weights)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gathered_floats(values: Mapping[str, float] | list[float]) -> list:
    """Every rank's `values` (a list of per-rank objects), for logging."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, values)
    return out
