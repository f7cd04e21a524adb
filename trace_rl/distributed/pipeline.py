"""`DistributedPipeline`: the `Pipeline` loop with Ray rollout workers, FSDP2 trainer ranks and async overlap.

Per step, on trainer rank 0 (the driver): collect the batch (through a `RayRolloutEngine` or the local
engine), draw the sample from the replay buffer. With several trainer ranks the sample is broadcast; each
rank computes trainer log-probs for its rows (`fsdp.rank_micro_batches`), they are all-gathered, and
corrections and drift metrics run on the whole sample (the same numbers on every rank). Each rank then
trains on its rows; FSDP sums the gradients. The weight sync gathers the full weights (collective) and
rank 0 ships them to the engine(s).

Async (`distributed.async`): right after collecting step k's batch, rank 0 launches the rollout of step
k+1 (`RayRolloutEngine.prefetch`), so it runs while step k trains. That batch was sampled by version k
and is trained on at version k+1: one version of staleness, inside the replay buffer's bound. The trainer
recomputes log-probs with its current weights, so ρ = π_trainer / π_rollout carries both the quantization
mismatch and the policy lag, and the configured corrections (TIS, masks) handle both. Records carry
"rollout_lag" (trainer version minus the batch's oldest) and "sample_lag" (the same for the sample).

Only rank 0 logs, evaluates and writes metrics. Checkpoints have one format for one process and for FSDP
ranks (`trace_rl.pipelines.checkpoint`: safetensors + JSON, nothing unpickled): every rank takes part in
gathering the full model and optimizer state, rank 0 writes `checkpoint/`, and on resume every rank reads
it and keeps its shards. SIGINT/SIGTERM are not intercepted here (ranks must stop together: use
checkpoint_every).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trace_rl.data import schema as K
from trace_rl.distributed import fsdp
from trace_rl.engine.base import RolloutEngine
from trace_rl.pipelines.checkpoint import CHECKPOINT_DIR, check_same_run, find_checkpoint, promote, read_checkpoint
from trace_rl.pipelines.checkpoint import save_checkpoint as write_checkpoint
from trace_rl.pipelines.export import keep_model_snapshot
from trace_rl.pipelines.pipeline import Pipeline

log = logging.getLogger("trace_rl.distributed")


class FollowerEngine(RolloutEngine):
    """The engine slot of trainer ranks > 0: they never generate; it tracks the policy version and holds
    rank 0's `guidance_sites` (guided plans: which trainer layer reads which record)."""

    def __init__(self, rank: int, guidance_sites: dict | None = None):
        self.rank, self.policy_version = rank, 0
        self.guidance_sites = dict(guidance_sites or {})

    def generate(self, prompts, sampling):
        raise RuntimeError(f"trainer rank {self.rank} does not generate: rollouts run on rank 0")

    def load_weights(self, state_dict, version: int) -> None:
        self.policy_version = int(version)


@dataclass
class DistributedPipeline(Pipeline):
    rank: int = 0
    world: int = 1
    asynchronous: bool = False
    device: torch.device | None = None

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    # -- rollouts: rank 0 only --
    def collect_batch(self):
        if not self.is_driver:
            return fsdp.broadcast_object(None)
        t0 = time.perf_counter()
        batch = self.collector.collect(self.train_prompts(self.step))
        self._rollout_wait = time.perf_counter() - t0
        self._rollout_lag = self.step - int(batch.get(K.POLICY_VERSION).min())
        if self.asynchronous and self.step + 1 < self.steps:
            # the exact sampling collect() will pass for the next batch (seed + batch index)
            upcoming = self.collector._sampling_for(self.collector.batches_collected)
            self.engine.prefetch(self.train_prompts(self.step + 1).select(K.TOKENS_PROMPT, K.MASK_PROMPT), upcoming)
        if self.world > 1:
            fsdp.broadcast_object(batch.select(K.REWARD, K.MASK_RESPONSE).cpu())
        return batch

    def draw_sample(self, batch):
        sample = super().draw_sample(batch) if self.is_driver else None
        if self.world > 1:
            sample = fsdp.broadcast_object(None if sample is None else sample.cpu())
            sample = sample.to(self.device)
        self._sample_lag = self.engine.policy_version - int(sample.get(K.POLICY_VERSION).min())
        return sample

    # -- trainer: data parallel over ranks --
    def micro_batches(self, rows: int) -> list[tuple[slice, float]]:
        if self.world == 1:
            return super().micro_batches(rows)
        return fsdp.rank_micro_batches(rows, self.micro_batch_size, self.rank, self.world)

    def score_sample(self, sample):
        if self.world == 1:
            return super().score_sample(sample)
        rows = sample.batch_size[0]
        parts = []
        for rows_slice, weight in self.micro_batches(rows):
            micro = sample[rows_slice]
            with self._guidance(micro):
                lp = self.trainer_logprobs(micro).get(K.LOGP_TRAINER)   # fillers too: FSDP needs every
            if weight:                                                  # rank's forward
                parts.append(lp)
        local = torch.cat(parts)
        full = fsdp.all_gather_rows(local, fsdp.rank_row_counts(rows, self.micro_batch_size, self.world))
        for i, key in enumerate(self.trainer_logprobs.out_keys):
            sample.set(key, full if i == 0 else full.clone())
        if self.reference is not None:      # a full copy on every rank: the whole sample, the same numbers
            self.reference(sample)
        self.corrections(sample)
        return self.drift(sample)

    def optimize(self, sample):
        losses, outs, grad_norm = super().optimize(sample)
        if self.world > 1:      # every rank's micro-batch losses and metrics, for the logged means
            mine = (losses, [{k: float(v.detach()) for k, v in o.items()} for o in outs])
            everyone = fsdp.gathered_floats(mine)
            losses = [x for ls, _ in everyone for x in ls]
            outs = [o for _, os in everyone for o in os]
        return losses, outs, grad_norm

    def sync_weights(self) -> None:
        if self.world == 1:
            return super().sync_weights()
        full = fsdp.full_state_dict(self.model)          # collective: every rank gathers
        if self.is_driver:
            self.engine.load_weights(full, self.step)
        else:
            self.engine.load_weights({}, self.step)

    def train_step(self) -> dict:
        record = super().train_step()
        record["sample_lag"] = self._sample_lag
        if self.is_driver:
            record["rollout_lag"] = self._rollout_lag
            record["rollout_wait_seconds"] = self._rollout_wait
            record.update(getattr(self.engine, "last_sync", {}))
        return record

    # -- the loop: rank 0 logs and evaluates; the other ranks follow its collective schedule --
    def run(self, resume: bool = False, overwrite: bool = False) -> dict:
        if self.is_driver:
            return super().run(resume, overwrite)
        self._saved_step = None
        if resume:
            self.resume()
        while self.step < self.steps:
            self.train_step()
            if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                self.save()
        if self._saved_step != self.step:
            self.save()
        return {}

    def state(self) -> dict:
        return {**super().state(), "world": self.world}

    def save(self) -> Path:
        if self.world == 1:
            return super().save()
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        # collective: full tensors gathered to rank 0 (CPU), keyed by parameter name like one process's
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.is_driver:
            write_checkpoint(self.run_dir, model_sd, (optim_sd["state"], optim_sd["param_groups"]), self.state(),
                             self.config_dict(), **self.hf_parts())
            keep_model_snapshot(self.run_dir, self.step, self.keep_models)
        dist.barrier()
        self._saved_step = self.step
        return Path(self.run_dir) / CHECKPOINT_DIR

    def resume(self) -> dict:
        if self.world == 1:
            return super().resume()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        outcome = None
        if self.is_driver:          # choose, check and promote once; every rank then reads checkpoint/
            try:
                found = find_checkpoint(self.run_dir)
                changed = check_same_run(found.state, self.config_dict(), found.folder)
                promote(self.run_dir, found)
                outcome = {"checkpoint": found.note, "changed": {k: list(v) for k, v in changed.items()}}
            except Exception as err:  # noqa: BLE001  (re-raised on every rank below)
                outcome = {"error": err}
        outcome = fsdp.broadcast_object(outcome)
        if "error" in outcome:
            raise outcome["error"]
        weights, optim, rng, state = read_checkpoint(Path(self.run_dir) / CHECKPOINT_DIR)
        if hasattr(self.model, "experts"):       # MoE: HF files hold one tensor per expert; the model, stacked ones
            from trace_rl.models.loading import fuse_expert_weights

            weights = fuse_expert_weights(self.model, weights)
        if "lm_head.weight" not in weights and getattr(self.model.config, "tie_word_embeddings", False):
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]     # HF files leave the tied head out
        set_state_dict(self.model, self.optimizer, model_state_dict=weights, optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
        self._restore(state, rng, {k: tuple(v) for k, v in outcome["changed"].items()})
        full = fsdp.full_state_dict(self.model)
        self.engine.load_weights(full if self.is_driver else {}, state["policy_version"])
        return outcome
