"""`ScaleOut`: what `trace_rl.pipelines.build` does differently when `cfg.distributed` asks for scale-out.

1. `setup`: join the trainer process group (torchrun) when trainer_gpus > 1; this rank's device.
2. `make_engine`: rank 0 gets a `RayRolloutEngine` (rollout_workers > 0) or the usual local engine; the
   other trainer ranks get a `FollowerEngine` (they never generate). Built from the full model, before
   sharding.
3. `shard`: FSDP2 over the trainer ranks (before the optimizer is built).
4. `pipeline_class`: `DistributedPipeline` and its extra fields (rank 0's run directory on every rank).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from trace_rl.config import ConfigError

log = logging.getLogger("trace_rl.distributed")


@dataclass
class ScaleOut:
    cfg: object                  # the PipelineConfig
    rank: int
    world: int
    device: torch.device

    @classmethod
    def setup(cls, cfg, device: torch.device) -> ScaleOut:
        d = cfg.distributed
        if d.trainer_gpus > 1:
            from trace_rl.distributed.fsdp import init_trainer_group

            try:
                rank, world, device = init_trainer_group(d.trainer_gpus, device)
            except RuntimeError as err:
                raise ConfigError(f"distributed.trainer_gpus: {err}", ("distributed.trainer_gpus",)) from None
            if device.type == "cuda" and torch.cuda.device_count() < 1:
                raise ConfigError("distributed.trainer_gpus: no CUDA device visible to this rank",
                                  ("distributed.trainer_gpus",))
            return cls(cfg, rank, world, device)
        return cls(cfg, 0, 1, device)

    def make_engine(self, model, tokenizer):
        from trace_rl.distributed.pipeline import FollowerEngine

        engine = FollowerEngine(self.rank) if self.rank != 0 else self._driver_engine(model, tokenizer)
        if self.world > 1:          # guided plans: every rank's trainer reads the records the same way
            from trace_rl.distributed.fsdp import broadcast_object

            sites = broadcast_object(getattr(engine, "guidance_sites", {}) if self.rank == 0 else None)
            if self.rank != 0:
                engine.guidance_sites = sites
        return engine

    def _driver_engine(self, model, tokenizer):
        from trace_rl.pipelines.assemble import make_engine

        cfg, d = self.cfg, self.cfg.distributed
        if d.rollout_workers == 0:
            return make_engine(cfg, model, tokenizer, self.device)
        if cfg.rollout.engine != "native":
            raise ConfigError(f"distributed.rollout_workers: Ray workers run the native engine; rollout.engine is "
                              f"{cfg.rollout.engine!r}", ("rollout.engine",))
        from trace_rl.distributed.ray_engine import RayRolloutEngine

        gpus = d.gpus_per_worker if d.gpus_per_worker is not None else float(torch.cuda.is_available())
        return RayRolloutEngine(
            model, cfg.precision, workers=d.rollout_workers, gpus_per_worker=gpus,
            engine_kwargs={"max_batch": cfg.rollout.max_batch, "max_seq_len": cfg.rollout.max_seq_len,
                           "pad_token_id": tokenizer.pad_token_id, "attention": cfg.rollout.attention,
                           "operand_cache": cfg.rollout.operand_cache},
            max_lag=d.max_staleness if d.asynchronous else 0, weight_sync=d.weight_sync,
            packer_device=self.device, ray_address=d.ray_address)

    def shard(self, model) -> None:
        if self.world > 1:
            from trace_rl.distributed.fsdp import shard_model

            shard_model(model, self.device, self.cfg.distributed.mixed_precision)

    def pipeline_class(self, run_dir):
        """(DistributedPipeline, its extra fields); every rank gets rank 0's run_dir (names carry a timestamp)."""
        from trace_rl.distributed.pipeline import DistributedPipeline

        if self.world > 1:
            from trace_rl.distributed.fsdp import broadcast_object

            run_dir = broadcast_object(run_dir)
        return DistributedPipeline, {"rank": self.rank, "world": self.world, "device": self.device,
                                     "asynchronous": self.cfg.distributed.asynchronous, "run_dir": Path(run_dir)}
