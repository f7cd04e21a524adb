"""`Pipeline`: collector -> replay buffer -> trainer log-probs -> corrections -> loss -> optimizer -> weight
sync, one step at a time, with held-out evaluation, metrics, checkpoints and exact resume.

Build one from a `PipelineConfig` with `trace_rl.pipelines.build(cfg)`, or assemble the same objects in
Python and pass them to `Pipeline(...)` directly (docs/pipelines.md shows both).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trace_rl.collectors import RolloutCollector
from trace_rl.collectors.prompts import PROBLEM, prompt_batch
from trace_rl.correction import DriftMetrics
from trace_rl.correction.guided import guided_trainer
from trace_rl.correction.metrics import correction_fractions
from trace_rl.data import schema as K
from trace_rl.data.replay_buffer import set_policy_version
from trace_rl.engine.base import RolloutEngine, SamplingParams
from trace_rl.objectives import TrainerLogProbs
from trace_rl.pipelines.checkpoint import (
    check_same_run,
    find_checkpoint,
    load_named_optimizer_state,
    named_optimizer_state,
    promote,
    read_checkpoint,
    save_checkpoint,
)
from trace_rl.pipelines.collapse import CollapseMonitor, CollapseSection
from trace_rl.pipelines.export import keep_model_snapshot
from trace_rl.pipelines.preflight import step_seed
from trace_rl.pipelines.run_dir import RunDirectory, write_text_atomic
from trace_rl.pipelines.run_log import (
    RunLog,
    plot_curves,
    read_history,
    summarize,
    summary_table,
    truncate_metrics,
)
from trace_rl.pipelines.schedules import seek

_log = logging.getLogger("trace_rl")


class CorrectionsMaskedAll(RuntimeError):
    """A step's corrections masked (or rejected) at least `loop.masked_alarm` of its tokens and
    `loop.stop_when_masked` is set. The CLI prints it and exits 1."""


def masked_message(record: dict, corrections, limit: float) -> str:
    kinds = ", ".join(repr(c) for c in getattr(corrections, "corrections", [])) or "none"
    return (f"step {record['step']}: the corrections masked {record['frac_masked_tokens']:.1%} of the tokens "
            f"(>= loop.masked_alarm {limit:.0%}; rejected sequences {record.get('frac_rejected_seqs', 0):.1%}), "
            f"so this step learned (almost) nothing; corrections: {kinds}; mismatch_k3 "
            f"{record.get('mismatch_k3', float('nan')):.3g}. Widen their bounds or use a closer rollout precision")


class RunInterrupted(Exception):  # noqa: N818  (not an error: the run stopped on request, with a checkpoint)
    """SIGINT/SIGTERM stopped the run after a step; `saved` is the checkpoint written then (None if no step
    had finished). The CLI prints how to resume and exits 128 + signal number."""

    def __init__(self, signum: int, step: int, run_dir: Path, saved: Path | None, why: str = ""):
        self.signum, self.step, self.run_dir, self.saved = signum, step, run_dir, saved
        where = f"checkpoint saved at step {step} in {saved}" if saved else "no step had finished: nothing saved"
        super().__init__(f"{why or signal.Signals(signum).name}: stopped after step {step}; {where}")


class TimeLimitReached(RunInterrupted):  # noqa: N818
    """The next step would have ended after `Pipeline.deadline` (`trace-rl run --time-limit`): the run stopped
    before it, with a checkpoint, so a driver with a wall-clock budget (a 10-minute job) can continue it later
    with --resume. Like the `timeout` of a job, it counts as SIGALRM: the CLI exits 128 + 14 = 142."""

    def __init__(self, step: int, run_dir: Path, saved: Path | None, deadline: float):
        left = deadline - time.time()
        super().__init__(signal.SIGALRM, step, run_dir, saved,
                         why=f"time limit ({left:.0f} s left, less than the next step needs)")


class _StopRequests:
    """SIGINT/SIGTERM set a flag the loop reads after each step (a second SIGINT stops at once, unsaved).
    Installed only from the main thread of a single-process run."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt       # the second Ctrl-C: stop now; the last checkpoint stays
        self.signum = signum
        print(f"\ntrace-rl: {signal.Signals(signum).name}: stopping after this step and saving a checkpoint "
              f"(Ctrl-C again stops at once without saving)", flush=True)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


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
    checkpoint_every: int = 10
    logging: dict = field(default_factory=dict)
    config: object | None = None
    title: str = ""
    step: int = 0
    drift: DriftMetrics = field(default_factory=DriftMetrics)
    keep_models: int = 0                   # HF model folders of the last N checkpoints under <run>/models/
    masked_alarm: float = 0.99             # warn when corrections mask >= this share of a step's tokens
    stop_when_masked: bool = False         # ... or stop the run (CorrectionsMaskedAll)
    reference: object | None = None        # a ReferencePolicy writing ("log_probs","ref") for the KL term
    lr_scheduler: object | None = None     # a torch LambdaLR stepped once per RL step (trace_rl.pipelines.schedules)
    router_replay: bool = False            # MoE: the trainer's forwards replay the rollout's routing records
    router_aux_loss_coef: float = 0.0      # MoE: transformers' load-balancing loss weight (0: off)
    collapse: CollapseSection = field(default_factory=CollapseSection)   # when the run counts as collapsed
    deadline: float | None = None          # time.time() by which run() stops (TimeLimitReached); None: no limit
    reference_engine: RolloutEngine | None = None   # loop.eval_reference: a bf16 engine for a second evaluation

    def __post_init__(self):
        self._eval_problems = self.task.problems(self.eval_prompts, self.seed, "eval")
        self.pad_token_id = self.tokenizer.pad_token_id
        if getattr(self.trainer_logprobs, "chunk_context", False) is None:
            self.trainer_logprobs.chunk_context = self._guidance   # TRACE: records served per micro-batch

    # -- prompts: a pure function of the step, so a resumed run sees the same ones --
    def _prompts(self, problems) -> object:
        return prompt_batch([self.tokenizer.encode(p.prompt) for p in problems], {PROBLEM: problems},
                            self.pad_token_id)

    def train_prompts(self, step: int):
        return self._prompts(self.task.problems(self.prompts_per_step, step_seed(self.seed, step), "train"))

    # -- one RL step --
    def train_step(self) -> dict:
        t0 = time.perf_counter()
        batch = self.collect_batch()
        t_rollout = time.perf_counter() - t0
        lengths = batch.get(K.MASK_RESPONSE).sum(-1)
        rollout_tokens = int(lengths.sum())
        sample = self.draw_sample(batch)
        report = self.score_sample(sample)
        self.model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        losses, outs, grad_norm = self.optimize(sample)
        self.model.eval()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        self.sync_weights()
        t_total = time.perf_counter() - t0
        record = {
            "kind": "train", "step": self.step, "policy_version": self.engine.policy_version,
            "reward": batch.get(K.REWARD).mean().item(),
            **{k: v for k, v in getattr(self.collector.reward_fn, "last_stats", {}).items()},
            "loss": sum(losses) / len(losses), "grad_norm": grad_norm.item(), "lr": lr,
            **{k: _mean([float(o[k]) for o in outs]) for k in outs[0].keys() if not k.startswith("loss_")},
            **report.flat(),
            **correction_fractions(self.corrections, sample.get(K.LOGP_ROLLOUT), sample.get(K.LOGP_TRAINER),
                                   sample.get(K.MASK_RESPONSE)),
            "response_length": rollout_tokens / batch.batch_size[0],
            # responses cut by max_new_tokens (or ending exactly there): the length blow-up of a collapse
            "response_at_cap": (lengths >= self.sampling.max_new_tokens).float().mean().item(),
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
        self.trainer_logprobs(sample)      # guided: each micro-batch under its records (chunk_context)
        if self.reference is not None:
            self.reference(sample)
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
                with self._guidance(micro), self._moe(micro) as moe:
                    out = self.loss(micro)
                    out.update(moe.aux_loss())
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
            self.check_finite_update(params, grad_norm)
        return losses, outs, grad_norm

    @torch.no_grad()
    def check_finite_update(self, params: list[torch.Tensor], grad_norm: torch.Tensor) -> None:
        """After an optimizer step: one fused norm per parameter (cheap next to the step). Non-finite weights
        after a finite gradient mean the update itself blew up (learning rate, optimizer state): stop now,
        naming it, before the weights reach the engine or a checkpoint."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        norms = torch.stack(torch._foreach_norm(local)) if local else torch.zeros(0)
        if bool(torch.isfinite(norms).all()):
            return
        names = {id(p): n for n, p in self.model.named_parameters()}
        bad = [names.get(id(p), "?") for p, ok in zip(params, torch.isfinite(norms).tolist()) if not ok]
        groups = self.optimizer.param_groups[0]
        hyper = ", ".join(f"{k}={groups[k]}" for k in ("lr", "betas", "weight_decay", "momentum") if k in groups)
        raise FloatingPointError(
            f"step {self.step + 1}: the optimizer step made {len(bad)} parameter tensors non-finite (first: {bad[0]}) "
            f"although the gradient norm was finite ({grad_norm.item():.4g}): the update itself overflowed; check "
            f"the optimizer settings ({hyper}). The run stopped before these weights were used or saved")

    def sync_weights(self) -> None:
        self.engine.load_weights(self.model.state_dict(), self.step)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy accuracy on the held-out prompts, through the rollout engine (at rollout precision); with a
        `reference_engine` (loop.eval_reference) also through it, loaded with the trainer's current weights
        first, under eval_ref_* keys."""
        record = {"kind": "eval", "step": self.step, **self._held_out(self.engine, "eval_")}
        if self.reference_engine is not None:
            t0 = time.perf_counter()
            # its own RNG draw (an unseeded generate draws its seed from torch's global RNG) must not shift the
            # run's: with or without this evaluation, training is the same
            with torch.random.fork_rng(devices=[]):
                self.reference_engine.load_weights(self.model.state_dict(), self.step)
                ref = self._held_out(self.reference_engine, "eval_ref_")
            record.update(ref, eval_ref_seconds=time.perf_counter() - t0)     # the weight load included
        return record

    def _held_out(self, engine: RolloutEngine, prefix: str) -> dict:
        t0 = time.perf_counter()
        greedy = self.sampling.model_copy(update={"n": 1, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                                  "seed": None})
        out = engine.generate(self._prompts(self._eval_problems), greedy)
        tokens, mask = out.get(K.TOKENS_RESPONSE), out.get(K.MASK_RESPONSE)
        scores = [self.task.score(p, self.tokenizer.decode(row[m].tolist()))
                  for p, row, m in zip(self._eval_problems, tokens, mask)]
        n = len(scores)
        return {f"{prefix}accuracy": sum(s.correct for s in scores) / n,
                f"{prefix}reward": sum(s.reward for s in scores) / n,
                f"{prefix}format_ok": sum(s.format_ok for s in scores) / n,
                f"{prefix}seconds": time.perf_counter() - t0}

    def _guidance(self, td):
        """TRACE: serve the rollout's rounding records to the guided trainer layers (no-op otherwise)."""
        sites = getattr(self.engine, "guidance_sites", None)
        if not sites:
            return contextlib.nullcontext()
        return guided_trainer(self.model, td, sites)

    def _moe(self, td):
        """MoE: router replay and/or the auxiliary load-balancing loss around one loss forward on `td`."""
        from trace_rl.objectives.router_replay import MoETrainerForward

        return MoETrainerForward(self.model, td, self.router_replay, self.router_aux_loss_coef, self.pad_token_id)

    # -- checkpoints (trace_rl.pipelines.checkpoint) --
    def state(self) -> dict:
        return {"step": self.step, "policy_version": self.engine.policy_version,
                "batches_collected": self.collector.batches_collected,
                "next_group_id": self.collector.next_group_id}

    def config_dict(self) -> dict | None:
        return self.config.to_dict() if self.config is not None else None

    def hf_parts(self) -> dict:
        """What makes a checkpoint an HF model folder too (our Decoder only)."""
        from trace_rl.models.decoder import Decoder

        if not isinstance(self.model, Decoder):
            return {}
        return {"hf_model": self.model, "tokenizer": self.tokenizer, "sampling": self.sampling}

    def save(self) -> Path:
        path = save_checkpoint(self.run_dir, self.model.state_dict(), named_optimizer_state(self.model, self.optimizer),
                               self.state(), self.config_dict(), **self.hf_parts())
        self._saved_step = self.step
        keep_model_snapshot(self.run_dir, self.step, self.keep_models)
        return path

    def resume(self) -> dict:
        """Load the newest complete checkpoint of `run_dir` into the live objects. Refuses (CheckpointError)
        a checkpoint written under another config; applies the resumable fields that changed (the optimizer's
        lr). Returns {"checkpoint": which one, "changed": {field: [then, now]}}."""
        found = find_checkpoint(self.run_dir)
        changed = check_same_run(found.state, self.config_dict(), found.folder)
        promote(self.run_dir, found)
        weights, optim, rng, state = read_checkpoint(found.folder)
        device = next(self.model.parameters()).device
        weights = {k: v.to(device) for k, v in weights.items()}
        if self.hf_parts():
            from trace_rl.models.loading import load_state_dict_into

            load_state_dict_into(self.model, weights)        # HF names; re-ties a tied lm_head
        else:
            self.model.load_state_dict(weights)
        optim["state"] = {k: {n: v.to(device) if torch.is_tensor(v) and n != "step" else v for n, v in e.items()}
                          for k, e in optim["state"].items()}
        load_named_optimizer_state(self.model, self.optimizer, optim, str(found.folder / "optimizer.safetensors"))
        self._restore(state, rng, changed)
        self.engine.load_weights(self.model.state_dict(), state["policy_version"])
        return {"checkpoint": found.note, "changed": {k: list(v) for k, v in changed.items()}}

    def _restore(self, state: dict, rng: torch.Tensor, changed: dict) -> None:
        self.step = state["step"]
        self._saved_step = self.step
        self.collector.batches_collected = state["batches_collected"]
        self.collector.next_group_id = state["next_group_id"]
        torch.set_rng_state(rng)
        if "trainer.lr" in changed:          # the checkpoint restored the old lr; the config's is the one asked for
            for group in self.optimizer.param_groups:
                group["lr"] = changed["trainer.lr"][1]
                if "initial_lr" in group:
                    group["initial_lr"] = changed["trainer.lr"][1]
        if self.lr_scheduler is not None:     # the schedule's rate at this step, from the (new) base rate
            seek(self.lr_scheduler, self.step)

    # -- the whole run --
    def run(self, resume: bool = False, overwrite: bool = False) -> dict:
        """Train to `steps`, in `run_dir`: a new directory (refused if it holds files, unless `overwrite`, which
        empties it) or, with `resume`, the run's own directory continued from its newest complete checkpoint.
        The directory is locked for the run's duration (a second process is refused)."""
        mode = "resume" if resume else ("overwrite" if overwrite else "new")
        with RunDirectory(self.run_dir, mode):
            return self._run(resume)

    def _run(self, resume: bool) -> dict:
        self._saved_step = None
        resumed = None
        if resume:
            resumed = self.resume()
            truncate_metrics(self.run_dir, self.step)
            (self.run_dir / "summary.json").unlink(missing_ok=True)     # no longer describes the run
            print(f"resuming from {resumed['checkpoint']}"
                  + (f"; changed: {', '.join(f'{k} {a} -> {b}' for k, (a, b) in resumed['changed'].items())}"
                     if resumed["changed"] else ""), flush=True)
        if self.config is not None:
            write_text_atomic(self.run_dir / "config.yaml", self.config.to_yaml())
        log = RunLog(self.run_dir, total_steps=self.steps, start_step=self.step,
                     masked_alarm=(self.masked_alarm, lambda r: masked_message(r, self.corrections, self.masked_alarm)),
                     **{k: v for k, v in self.logging.items()
                        if k in ("jsonl", "tensorboard", "progress", "loggers", "wandb", "mlflow")})
        monitor = CollapseMonitor(self.collapse)
        if resumed is not None:
            monitor.replay(read_history(self.run_dir))     # the rule's state is a function of the records
            log.log({"kind": "resume", "step": self.step, **resumed})

        def record(entry: dict) -> None:
            log.log(entry)
            event = monitor.update(entry)
            if event is not None:
                log.log(event)
                _log.warning("step %s: the run collapsed (%s: %s)", event["step"], event["reason"], event["detail"])

        stop = _StopRequests().install() if getattr(self, "world", 1) == 1 else _StopRequests()
        t0 = time.perf_counter()
        timing = _StepTiming()
        try:
            if self.step == 0:
                record(self.evaluate())
            while self.step < self.steps:
                if stop.signum is not None:
                    raise RunInterrupted(stop.signum, self.step, self.run_dir, self._save_if_needed())
                if self.deadline is not None and timing.steps and time.time() + timing.next_step(self) > self.deadline:
                    raise TimeLimitReached(self.step, self.run_dir, self._save_if_needed(), self.deadline)
                try:
                    entry = self.train_step()
                except FloatingPointError as err:     # the step refused a non-finite gradient or update
                    event = monitor.non_finite(self.step + 1, str(err))
                    if event is not None:
                        log.log(event)
                    raise
                record(entry)
                timing.steps.append(entry["step_seconds"])
                if self.stop_when_masked and entry.get("frac_masked_tokens", 0.0) >= self.masked_alarm:
                    saved = self._save_if_needed()
                    raise CorrectionsMaskedAll(f"{masked_message(entry, self.corrections, self.masked_alarm)}; "
                                               f"stopped (loop.stop_when_masked; checkpoint: {saved})")
                if self.eval_every and self.step % self.eval_every == 0 and self.step < self.steps:
                    entry = self.evaluate()
                    record(entry)
                    timing.evals.append(entry["eval_seconds"] + entry.get("eval_ref_seconds", 0.0))
                if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                    timing.save(self)
                if monitor.collapse is not None and self.collapse.stop:
                    break                          # loop.collapse.stop: the rest of the run would be wasted
            self._save_if_needed()   # before the final eval: the checkpoint holds the state a longer run continues from
            if not log.history or log.history[-1].get("kind") != "eval" or log.history[-1]["step"] != self.step:
                record(self.evaluate())
        finally:
            stop.restore()
            log.close()
        history = read_history(self.run_dir) if self.logging.get("jsonl", True) else log.history
        summary = summarize(history, time.perf_counter() - t0)
        if monitor.collapse is not None and self.collapse.stop and self.step < self.steps:
            summary["stopped"] = f"collapse at step {monitor.collapse['step']} (loop.collapse.stop)"
        if self.logging.get("plot", True) is not False:
            summary["plot"] = str(plot_curves(history, self.run_dir / "curves.png", self.title))
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=float))
        return summary

    def _save_if_needed(self) -> Path | None:
        if self.step == 0:
            return None
        if self._saved_step != self.step:
            self.save()
        return self.run_dir / "checkpoint"


class _StepTiming:
    """What the next step will take, from this process's own measurements (the first step of an invocation
    includes warm-up, so it overestimates): the slowest recent step x 1.1, plus the evaluation that follows
    it when one is due, plus a checkpoint save. The deadline is checked only once a step of this invocation was
    measured, so every invocation makes progress (a driver never loops on a run that cannot start)."""

    def __init__(self):
        self.steps: list[float] = []
        self.evals: list[float] = []
        self.saves: list[float] = []

    def save(self, pipeline: Pipeline) -> None:
        t0 = time.perf_counter()
        pipeline.save()
        self.saves.append(time.perf_counter() - t0)

    def next_step(self, pipeline: Pipeline) -> float:
        need = 1.1 * max(self.steps[-3:])
        nxt = pipeline.step + 1
        if self.evals and pipeline.eval_every and nxt % pipeline.eval_every == 0:
            need += max(self.evals[-3:])
        return need + (max(self.saves[-3:]) if self.saves else 0.0)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


__all__ = ["Pipeline", "RunInterrupted", "TimeLimitReached", "summarize", "summary_table"]
