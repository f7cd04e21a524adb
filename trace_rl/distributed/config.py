"""`DistributedSection`: how a run scales out (PipelineConfig.distributed). The default is one process.

- `trainer_gpus` > 1: the trainer is sharded with FSDP2 over that many ranks (one process each, launched by
  `torchrun`; NCCL on GPUs, gloo on CPU), data-parallel over the rows of each batch.
- `rollout_workers` > 0: generation runs in that many Ray actors, one `NativeEngine` each; the trainer's
  rank 0 splits each prompt batch across them and syncs weights to all of them after every step.
- `async`: the rollout of step k+1 is launched before step k trains, so every batch is one policy version
  old; the replay buffer's bound becomes `max_staleness` and the corrections see the lag in ρ.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from trace_rl.config import TraceConfig


class DistributedSection(TraceConfig):
    """Scale-out of a run (docs/distributed.md). Defaults: one process, the engine in-process, synchronous."""

    # `async` is a Python keyword: the field is `asynchronous`, read and written as `async` in config files.
    model_config = ConfigDict(**TraceConfig.model_config, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    trainer_gpus: int = Field(
        1, ge=1, description="Trainer ranks: FSDP2 shards the policy over them (one process per rank, launched "
                             "with `torchrun --nproc-per-node N`; GPUs with NCCL, CPU processes with gloo).")
    rollout_workers: int = Field(
        0, ge=0, description="Ray rollout actors, one engine each (0: the engine runs inside the trainer's rank 0).")
    gpus_per_worker: float | None = Field(
        None, ge=0, description="GPUs Ray reserves per rollout actor (None: 1 when the trainer sees CUDA, else 0 "
                                "and the actors run on CPU).")
    asynchronous: bool = Field(
        False, alias="async",
        description="Overlap: launch the rollout of step k+1 before training step k (one-step off-policy). "
                    "Needs rollout_workers >= 1.")
    max_staleness: int = Field(
        1, ge=0, description="Async mode: most policy versions a rollout may lag the trainer (older worker results "
                             "are an error: a worker missed a sync) and the replay buffer's bound (TRACE ran with up "
                             "to 3). Synchronous runs accept only the current version from workers.")
    weight_sync: Literal["state_dict", "packed"] = Field(
        "packed", description="'state_dict': ship the trainer's weights, every worker re-quantizes them; "
                              "'packed': quantize once on the trainer and ship the packed buffers "
                              "(docs/distributed.md has the timings).")
    mixed_precision: Literal["off", "bf16"] = Field(
        "off", description="FSDP2 MixedPrecisionPolicy: 'bf16' computes forward/backward with bf16 parameters "
                           "and reduces gradients in float32; 'off' computes in model.dtype.")
    ray_address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://host:port'); None starts a new local one on this "
                          "host, on loopback (unless this process already called ray.init).")

    @model_validator(mode="after")
    def _check(self) -> DistributedSection:
        if self.asynchronous and self.rollout_workers < 1:
            raise ValueError("async: true needs rollout_workers >= 1 (the overlap runs the rollout in Ray actors "
                             "while the trainer trains)")
        if self.asynchronous and self.max_staleness < 1:
            raise ValueError("async: true makes every batch one policy version old; set max_staleness >= 1")
        return self

    @property
    def enabled(self) -> bool:
        """True when anything departs from the single-process default."""
        return self.trainer_gpus > 1 or self.rollout_workers > 0

    def buffer_staleness(self, loop_max_staleness: int | None) -> int | None:
        """The replay buffer's staleness bound: `max_staleness` in async mode, else the loop's own."""
        return self.max_staleness if self.asynchronous else loop_max_staleness
