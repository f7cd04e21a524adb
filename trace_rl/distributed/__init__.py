"""Scale-out (docs/distributed.md): FSDP2 trainer ranks, Ray rollout workers, weight sync, async overlap.

- `config.DistributedSection`: the `distributed` section of a `PipelineConfig`.
- `fsdp`: process group, `fully_shard` over the decoder, data-parallel micro-batches, full-state gathers.
- `worker.RolloutWorker` / `ray_engine.RayRolloutEngine`: one NativeEngine per Ray actor, driven as one engine.
- `batches`: prompt split / result merge. `weight_sync`: state-dict vs packed payloads.
- `pipeline.DistributedPipeline`, `assemble.ScaleOut`: what `trace_rl.pipelines.build` uses when scaling out.

Nothing here imports Ray until a Ray engine is built.
"""

from trace_rl.distributed.config import DistributedSection

__all__ = ["DistributedSection"]
