"""`Pipeline`: collector -> replay buffer -> trainer log-probs -> corrections -> loss -> optimizer -> weight
sync, one step at a time, with held-out evaluation, metrics, checkpoints and exact resume.

Build one from a `PipelineConfig` with `trace_rl.pipelines.build(cfg)`, or assemble the same objects in
Python and pass them to `Pipeline(...)` directly (docs/pipelines.md shows both).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trace_rl.collectors import RolloutCollector
from trace_rl.collectors.prompts import PROBLEM, prompt_batch
from trace_rl.correction import DriftMetrics
from trace_rl.correction.guided import guided_trainer
from trace_rl.data import schema as K
from trace_rl.data.replay_buffer import set_policy_version
from trace_rl.engine.base import RolloutEngine, SamplingParams
from trace_rl.objectives import TrainerLogProbs
from trace_rl.pipelines.checkpoint import load_checkpoint, save_checkpoint
from trace_rl.pipelines.run_log import RunLog, plot_curves, read_history, summary_table


@dataclass
class Pipeline:
    """The objects of a run. `run()` trains for `steps`; `train_step()` / `evaluate()` are the pieces."""

    model: nn.Module                       # the trainer's policy (its plan decides the trainer stage)
    tokenizer: object
    task: object
    engine: RolloutEngine
    collector: RolloutCollector
    buffer: object                         # torchrl ReplayBuffer with a GroupSampler
    trainer_logprobs: TrainerLogProbs
    corrections: object                    # trace_rl.correction.Corrections
    loss: nn.Module                        # a PolicyGradientLoss (torchrl LossModule)
    optimizer: torch.optim.Optimizer
    sampling: SamplingParams
    run_dir: Path
    steps: int
    prompts_per_step: int
    seed: int = 0
    epochs_per_batch: int = 1
    micro_batch_size: int = 64
    grad_clip: float | None = 1.0
    eval_every: int = 10
    eval_prompts: int = 128
    checkpoint_every: int = 0
    logging: dict = field(default_factory=dict)
    config: object | None = None
    title: str = ""
    step: int = 0
    drift: DriftMetrics = field(default_factory=DriftMetrics)

    def __post_init__(self):
        self._eval_problems = self.task.problems(self.eval_prompts, self.seed, "eval")
        self.pad_token_id = self.tokenizer.pad_token_id

    # -- prompts: a pure function of the step, so a resumed run sees the same ones --
    def _prompts(self, problems) -> object:
        return prompt_batch([self.tokenizer.encode(p.prompt) for p in problems], {PROBLEM: problems},
                            self.pad_token_id)

    def train_prompts(self, step: int):
        return self._prompts(self.task.problems(self.prompts_per_step, self.seed * 1_000_003 + step, "train"))

    # -- one RL step --
    def train_step(self) -> dict:
        t0 = time.perf_counter()
        batch = self.collect_batch()
        t_rollout = time.perf_counter() - t0
        rollout_tokens = int(batch.get(K.MASK_RESPONSE).sum())
        sample = self.draw_sample(batch)
        report = self.score_sample(sample)
        self.model.train()
        losses, outs, grad_norm = self.optimize(sample)
        self.model.eval()
        self.step += 1
        self.sync_weights()
        t_total = time.perf_counter() - t0
        record = {
            "kind": "train", "step": self.step, "policy_version": self.engine.policy_version,
            "reward": batch.get(K.REWARD).mean().item(),
            **{k: v for k, v in getattr(self.collector.reward_fn, "last_stats", {}).items()},
            "loss": sum(losses) / len(losses), "grad_norm": grad_norm.item(),
            **{k: _mean([float(o[k]) for o in outs]) for k in outs[0].keys() if not k.startswith("loss_")},
            **report.flat(),
            "response_length": rollout_tokens / batch.batch_size[0],
            "rollout_seconds": t_rollout, "step_seconds": t_total,
            "rollout_tokens_per_s": rollout_tokens / max(t_rollout, 1e-9),
        }
        return record

    # The pieces of a step, overridden by trace_rl.distributed.DistributedPipeline (Ray workers, FSDP ranks).
    def collect_batch(self):
        """This step's rollouts, scored and written into the buffer."""
        return self.collector.collect(self.train_prompts(self.step))

    def draw_sample(self, batch):
        set_policy_version(self.buffer, self.engine.policy_version)
        return self.buffer.sample(batch.batch_size[0])

    def score_sample(self, sample):
        """Trainer log-probs, corrections and drift metrics of the sample (in place); returns the drift report."""
        with self._guidance(sample):
            self.trainer_logprobs(sample)
        self.corrections(sample)
        return self.drift(sample)

    def micro_batches(self, rows: int) -> list[tuple[slice, float]]:
        """(rows, weight) of each micro-batch: a micro-batch's loss counts in proportion to its rows."""
        m = self.micro_batch_size
        return [(slice(s, min(s + m, rows)), (min(s + m, rows) - s) / rows) for s in range(0, rows, m)]

    def optimize(self, sample) -> tuple[list[float], list, torch.Tensor]:
        """`epochs_per_batch` optimizer steps on `sample`: (micro-batch losses, their metrics, grad norm)."""
        losses, outs = [], []
        for _ in range(self.epochs_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for rows, weight in self.micro_batches(sample.batch_size[0]):
                micro = sample[rows]
                with self._guidance(micro):
                    out = self.loss(micro)
                loss = sum(v for k, v in out.items() if k.startswith("loss_"))
                (loss * weight).backward()
                if weight:       # weight 0: a data-parallel rank's filler pass, not part of the batch
                    losses.append(loss.item())
                    outs.append(out)
            params = [p for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip or float("inf"))
            if not torch.isfinite(grad_norm):
                raise FloatingPointError(f"step {self.step}: gradient norm is {grad_norm.item()}; stopping "
                                         f"before the weights are corrupted (lower trainer.lr or add a correction)")
            self.optimizer.step()
        return losses, outs, grad_norm

    def sync_weights(self) -> None:
        self.engine.load_weights(self.model.state_dict(), self.step)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy accuracy on the held-out prompts, through the rollout engine (at rollout precision)."""
        greedy = self.sampling.model_copy(update={"n": 1, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                                  "seed": None})
        out = self.engine.generate(self._prompts(self._eval_problems), greedy)
        tokens, mask = out.get(K.TOKENS_RESPONSE), out.get(K.MASK_RESPONSE)
        scores = [self.task.score(p, self.tokenizer.decode(row[m].tolist()))
                  for p, row, m in zip(self._eval_problems, tokens, mask)]
        n = len(scores)
        return {"kind": "eval", "step": self.step, "eval_accuracy": sum(s.correct for s in scores) / n,
                "eval_reward": sum(s.reward for s in scores) / n,
                "eval_format_ok": sum(s.format_ok for s in scores) / n}

    def _guidance(self, td):
        """TRACE: serve the rollout's rounding records to the guided trainer layers (no-op otherwise)."""
        sites = getattr(self.engine, "guidance_sites", None)
        if not sites:
            return contextlib.nullcontext()
        return guided_trainer(self.model, td, sites)

    # -- checkpoints --
    def state(self) -> dict:
        return {"step": self.step, "policy_version": self.engine.policy_version,
                "batches_collected": self.collector.batches_collected,
                "next_group_id": self.collector.next_group_id}

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.model, self.optimizer, self.state(), tokenizer=self.tokenizer,
                               sampling=self.sampling)

    def resume(self) -> None:
        state = load_checkpoint(self.run_dir, self.model, self.optimizer)
        self.step = state["step"]
        self.collector.batches_collected = state["batches_collected"]
        self.collector.next_group_id = state["next_group_id"]
        self.engine.load_weights(self.model.state_dict(), state["policy_version"])

    # -- the whole run --
    def run(self, resume: bool = False) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self.resume()
        log = RunLog(self.run_dir, total_steps=self.steps, start_step=self.step,
                     **{k: v for k, v in self.logging.items() if k in ("jsonl", "tensorboard", "progress")})
        t0 = time.perf_counter()
        try:
            if self.step == 0:
                log.log(self.evaluate())
            while self.step < self.steps:
                record = self.train_step()
                log.log(record)
                if self.eval_every and self.step % self.eval_every == 0 and self.step < self.steps:
                    log.log(self.evaluate())
                if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                    self.save()
            self.save()         # before the final eval: the checkpoint holds the state a longer run continues from
            if not log.history or log.history[-1].get("kind") != "eval" or log.history[-1]["step"] != self.step:
                log.log(self.evaluate())
        finally:
            log.close()
        history = read_history(self.run_dir) if self.logging.get("jsonl", True) else log.history
        summary = summarize(history, time.perf_counter() - t0)
        if self.logging.get("plot", True) is not False:
            summary["plot"] = str(plot_curves(history, self.run_dir / "curves.png", self.title))
        return summary


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(history: list[dict], wall_seconds: float) -> dict:
    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    return {
        "steps": len(train),
        "eval_accuracy_start": evals[0]["eval_accuracy"] if evals else None,
        "eval_accuracy_end": evals[-1]["eval_accuracy"] if evals else None,
        "eval_accuracy_best": max((r["eval_accuracy"] for r in evals), default=None),
        "reward_first": _mean([r["reward"] for r in train[:5]]) if train else None,
        "reward_last": _mean([r["reward"] for r in train[-5:]]) if train else None,
        "mismatch_k3_mean": _mean([r["mismatch_k3"] for r in train]) if train else None,
        "ess_mean": _mean([r["ess"] for r in train]) if train else None,
        "rollout_tokens_per_s": _mean([r["rollout_tokens_per_s"] for r in train]) if train else None,
        "wall_seconds": wall_seconds,
    }


__all__ = ["Pipeline", "summarize", "summary_table"]
