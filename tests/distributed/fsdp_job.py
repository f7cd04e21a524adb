"""Run by tests/distributed/test_fsdp.py under `torchrun --nproc-per-node 2` (gloo, loopback). Not a test module.

    fsdp_job.py OUT_DIR SEED

1. One GRPO step of `tiny-llama` sharded with FSDP2, data-parallel over the ranks with
   `rank_micro_batches`, for three trainer variants (float32 with the plain trainer, float32 with the
   aligned nvfp4 trainer, bf16 mixed precision); rank 0 writes the loss and the full gradients.
2. A 2-step pipeline run with distributed.trainer_gpus=2 (metrics.jsonl in OUT_DIR/run), its checkpoint
   (gathered from the shards; safetensors + JSON) reloaded into a fresh sharded pipeline (weights compared)
   that continues to step 3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trace_rl.distributed import fsdp


def step_batch(seed: int):
    """A fixed GRPO batch on `tiny-llama`: 10 rows of random prompts/responses, advantages, old log-probs."""
    from tensordict import TensorDict

    from trace_rl.data import schema as K

    g = torch.Generator().manual_seed(seed)
    rows, lp, lr = 10, 7, 5
    prompt_len = torch.randint(2, lp + 1, (rows,), generator=g)
    resp_len = torch.randint(1, lr + 1, (rows,), generator=g)
    prompt_mask = torch.arange(lp)[None] < prompt_len[:, None]
    resp_mask = torch.arange(lr)[None] < resp_len[:, None]
    return TensorDict({
        K.TOKENS_PROMPT: torch.randint(3, 128, (rows, lp), generator=g).masked_fill(~prompt_mask, 0),
        K.MASK_PROMPT: prompt_mask,
        K.TOKENS_RESPONSE: torch.randint(3, 128, (rows, lr), generator=g).masked_fill(~resp_mask, 0),
        K.MASK_RESPONSE: resp_mask,
        K.ADVANTAGE: torch.randn(rows, generator=g),
        # old log-probs near the model's (about log 1/128), so ratios sit on both sides of the clip
        K.LOGP_OLD: (-4.85 + 0.3 * torch.randn(rows, lr, generator=g)).masked_fill(~resp_mask, 0.0),
    }, batch_size=[rows])


VARIANTS = {"fp32": ("bf16", "off"), "aligned_nvfp4": ("aligned", "off"), "mp_bf16": ("bf16", "bf16")}
MICRO = 3     # 10 rows -> micro-batches 3, 3, 3, 1: rank 0 takes two, rank 1 two


def step_model(trainer_mode: str, seed: int):
    from trace_rl.models.presets import tiny_model
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan(rollout_weights="nvfp4", rollout_activations="nvfp4", kv_cache="nvfp4",
                         trainer=trainer_mode) if trainer_mode != "bf16" else PrecisionPlan()
    model, _ = tiny_model("tiny-llama", seed=seed, plan=plan)
    return model


def grpo_step(model, batch, rank: int, world: int) -> torch.Tensor:
    """Sum over this rank's micro-batches of weight * loss, backward; returns the summed loss (detached)."""
    from trace_rl.objectives import GRPOLoss

    loss_fn = GRPOLoss(model)
    rows = batch.batch_size[0]
    micros = (fsdp.rank_micro_batches(rows, MICRO, rank, world) if world > 1 else
              [(slice(s, min(s + MICRO, rows)), (min(s + MICRO, rows) - s) / rows) for s in range(0, rows, MICRO)])
    total = torch.zeros(())
    for part, weight in micros:
        loss = loss_fn(batch[part])["loss_objective"] * weight
        loss.backward()
        total += loss.detach().float()
    return total


def full_grads(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = (g.full_tensor() if isinstance(g, DTensor) else g).float().clone()
    return out


def fsdp_steps(out: Path, seed: int, rank: int, world: int) -> None:
    batch = step_batch(seed)
    for name, (mode, mp) in VARIANTS.items():
        model = step_model(mode, seed)
        fsdp.shard_model(model, torch.device("cpu"), mp)
        loss = grpo_step(model, batch, rank, world)
        dist.all_reduce(loss)          # each rank holds its micro-batches' share
        grads = full_grads(model)
        if rank == 0:
            torch.save({"loss": loss, "grads": grads}, out / f"step_{name}.pt")


PIPELINE_SEED = 2        # a seed whose first two steps have mixed rewards (non-zero GRPO gradients)


def pipeline_config(steps: int, world: int, run_name: str):
    from tests.distributed.configs import small_pipeline  # the test puts the repo root on PYTHONPATH

    return small_pipeline(steps, seed=PIPELINE_SEED,
                          **{"distributed.trainer_gpus": world, "logging.name": run_name})


def pipeline_runs(out: Path, rank: int, world: int) -> None:
    from trace_rl.pipelines import build

    first = build(pipeline_config(2, world, "run"), run_dir=out / "run")
    first.run()
    saved = fsdp.full_state_dict(first.model)
    second = build(pipeline_config(3, world, "run"), run_dir=out / "run")
    second.resume()
    loaded = fsdp.full_state_dict(second.model)
    resumed_at = second.step
    second.run(resume=True)          # resumes again (the same checkpoint), with the run directory's checks
    if rank == 0:
        same = all(torch.equal(saved[k], loaded[k]) for k in saved)
        (out / "resume.json").write_text(json.dumps({"weights_equal": same, "resumed_at": resumed_at,
                                                     "engine_version": second.engine.policy_version}))


def main() -> None:
    out, seed = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    fsdp_steps(out, seed, rank, world)
    pipeline_runs(out, rank, world)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
