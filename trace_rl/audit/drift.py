"""`DriftAudit`: generate with a rollout plan, rescore the same tokens with the trainer, report the drift.

For each plan: the native engine samples responses under the plan's rollout formats, then the trainer-stage
model (the same weights, `apply_plan(plan)`: plain for `trainer=bf16`, fake-quantized like the rollout for
`aligned`, and for `guided` (TRACE) fake-quantized with the rounding the rollout recorded) recomputes the
log-prob of every sampled token with the *same* temperature / top-k / top-p (`TrainerLogProbs.from_sampling`),
so two identical numerics give δ = 0 exactly up to float error.
Metrics are `trace_rl.correction.metrics` (every name of `METRIC_NAMES`) overall and by response position,
with one set of bins for all plans (up to the longest response of any plan) so the curves line up.

Mixture-of-experts models: the engine records each token's experts; with `router_replay` (default: on for
MoE) the trainer replays them. Either way each plan also reports the routing drift
(`trace_rl.correction.routing_metrics`: the fraction of (token, MoE layer) whose trainer top-k set differs
from the rollout's, the mean overlap, per layer and by response position).

Per layer group (`layer_groups=N`, opt-in: N+1 more rollouts per plan): the plan's KV cache alone
(weights and activations bf16), then each of N contiguous groups of layers alone with the plan's weight and
activation formats (every other layer and the KV cache bf16). It attributes the drift; the parts need not
add up (errors compound through the layers).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from trace_rl.config import ConfigError
from trace_rl.correction.metrics import (
    METRIC_NAMES,
    PositionMismatch,
    drift_metrics,
    mismatch_by_position,
    power_of_two_edges,
)
from trace_rl.correction.routing_metrics import RoutingDrift, routing_drift
from trace_rl.data import schema as K
from trace_rl.plan import PLAN_PRESETS, PrecisionPlan

TRAINER_MODES = ("bf16", "aligned", "guided")


def resolve_plans(names: str | list[str], trainer: str | None = None) -> list[tuple[str, PrecisionPlan]]:
    """[(name, plan)] from preset names ('bf16,fp8,fp4'); `trainer` overrides each preset's trainer mode."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--plans: no plan given; allowed: {', '.join(PLAN_PRESETS)}", ("plans",))
    if len(set(names)) != len(names):
        raise ConfigError(f"--plans: a plan is named twice in {','.join(names)}", ("plans",))
    if trainer is not None and trainer not in TRAINER_MODES:
        raise ConfigError(f"--trainer {trainer!r}: allowed: {', '.join(TRAINER_MODES)}", ("trainer",))
    out = []
    for name in names:
        if name not in PLAN_PRESETS:
            raise ConfigError(f"--plans: unknown plan {name!r}; allowed: {', '.join(PLAN_PRESETS)}", ("plans",))
        data = dict(PLAN_PRESETS[name])
        if trainer is not None:
            data["trainer"] = trainer
        plan = PrecisionPlan.parse(data, f"plan {name!r} with trainer={data.get('trainer', 'bf16')!r}")
        out.append((name, plan))
    return out


def parse_thresholds(items: list[str] | None) -> dict[str, float]:
    """`--fail-above METRIC=VALUE` (repeatable) -> {metric: value}; names are exactly `METRIC_NAMES`."""
    out: dict[str, float] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--fail-above {item!r}: expected METRIC=VALUE, e.g. mismatch_k3=1e-3",
                              ("fail_above",))
        name, value = (s.strip() for s in item.split("=", 1))
        if name not in METRIC_NAMES:
            raise ConfigError(f"--fail-above {item!r}: unknown metric {name!r}; allowed: {', '.join(METRIC_NAMES)}",
                              ("fail_above",))
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError(f"--fail-above {item!r}: {value!r} is not a number", ("fail_above",)) from None
        if math.isnan(out[name]):
            raise ConfigError(f"--fail-above {item!r}: the threshold is NaN", ("fail_above",))
    return out


def check_thresholds(results: list[PlanDrift], thresholds: dict[str, float]) -> list[str]:
    """One line per (plan, metric) above its threshold. A NaN metric counts as crossing (never a pass)."""
    bad = []
    for r in results:
        for name, limit in thresholds.items():
            value = r.metrics[name]
            if math.isnan(value) or value > limit:
                bad.append(f"{r.name}: {name} = {value:.6g} > {limit:.6g}")
    return bad


def layer_group_plans(plan: PrecisionPlan, num_layers: int, groups: int) -> list[tuple[str, PrecisionPlan]]:
    """The parts of `plan` measured alone: its KV cache, then each group of layers' Linear formats."""
    parts = []
    if plan.kv_cache != "bf16":
        parts.append(("kv cache", plan.model_copy(update={"rollout_weights": "bf16", "rollout_activations": "bf16"})))
    if (plan.rollout_weights, plan.rollout_activations) != ("bf16", "bf16") and groups > 0:
        bounds = [round(i * num_layers / groups) for i in range(groups + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            if hi <= lo:
                continue
            others = tuple(f"model.layers.{i}.*" for i in range(num_layers) if not lo <= i < hi)
            # model_copy skips validation on purpose: 'aligned' with only the KV part quantized is still
            # meaningful (the trainer fake-quantizes K/V), though PrecisionPlan refuses it as a user plan.
            parts.append((f"layers {lo}-{hi - 1}", plan.model_copy(update={
                "kv_cache": "bf16", "keep_high_precision": plan.keep_high_precision + others})))
    return parts


@dataclass
class RawDrift:
    """One rollout + rescoring on the host: response tokens, both log-probs, the mask, timings."""

    tokens: torch.Tensor
    lp_rollout: torch.Tensor
    lp_trainer: torch.Tensor
    mask: torch.Tensor
    rollout_seconds: float
    rescore_seconds: float
    engine: dict
    routing: tuple | None = None     # MoE: (rollout experts, trainer top-k, valid, prompt lengths) on the host

    def routing_drift(self, edges: list[int]) -> RoutingDrift | None:
        return None if self.routing is None else routing_drift(*self.routing, edges)


@dataclass
class PlanDrift:
    """The drift of one plan: scalar metrics (`METRIC_NAMES`), by position, per layer group, timings."""

    name: str
    plan: PrecisionPlan
    metrics: dict[str, float]
    by_position: PositionMismatch
    rows: int
    tokens: int
    longest: int
    rollout_seconds: float
    rescore_seconds: float
    engine: dict = field(default_factory=dict)
    groups: list[dict] = field(default_factory=list)
    routing: RoutingDrift | None = None
    router_replay: bool = False

    def to_dict(self) -> dict:
        bp = self.by_position
        return {"name": self.name, "label": self.plan.label, "trainer": self.plan.trainer,
                "plan": self.plan.to_dict(), "metrics": self.metrics,
                "by_position": {"edges": bp.edges, "count": bp.count, "abs_log_ratio": bp.abs_log_ratio,
                                "k1": bp.k1, "k3": bp.k3},
                "rows": self.rows, "tokens": self.tokens, "longest_response": self.longest,
                "rollout_seconds": self.rollout_seconds, "rescore_seconds": self.rescore_seconds,
                "rollout_tokens_per_s": self.tokens / max(self.rollout_seconds, 1e-9),
                "engine": self.engine, "layer_groups": self.groups, "router_replay": self.router_replay,
                "routing": None if self.routing is None else {
                    "metrics": self.routing.metrics, "by_position": {
                        "edges": self.routing.edges, "count": self.routing.count,
                        "mismatch": self.routing.mismatch_by_position}}}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class DriftAudit:
    """One model, one prompt set, one sampling config; `run(plans)` measures each plan.

    `model` is a trainer-stage Decoder (no plan; this audit applies each plan in turn). `engine_dtype`
    None lets the engine choose (bf16 on GPU, the model's dtype on CPU). `bins`: 'pow2' (0, 1, 2, 4, ...)
    or a number of equal-width bins, both up to the longest response of any plan."""

    model: torch.nn.Module
    tokenizer: object
    prompts: object                      # TensorDict: ("tokens","prompt"), ("masks","prompt")
    sampling: object                     # SamplingParams (n = samples per prompt)
    device: torch.device
    engine_dtype: torch.dtype | None = None
    max_batch: int = 256
    micro_batch_size: int = 64
    bins: str | int = "pow2"
    engine_kwargs: dict = field(default_factory=dict)
    router_replay: bool | None = None    # MoE: the trainer replays the rollout's routing (None: on for MoE)

    @property
    def replays(self) -> bool:
        moe = getattr(self.model.config, "is_moe", False)
        if self.router_replay and not moe:
            raise ConfigError("--router-replay on: the model is dense (no experts to route)", ("router_replay",))
        return moe if self.router_replay is None else self.router_replay

    def sample(self, plan: PrecisionPlan) -> RawDrift:
        """Generate under `plan`, rescore with the trainer under `plan`; the model keeps the plan applied."""
        from trace_rl.correction.guided import guided_trainer
        from trace_rl.engine.native import NativeEngine
        from trace_rl.objectives import TrainerLogProbs

        rows = self.prompts.batch_size[0] * self.sampling.n
        longest_prompt = int(self.prompts.get(K.MASK_PROMPT).sum(-1).max())
        self.model.apply_plan(plan)
        engine = NativeEngine(self.model, plan, max_batch=min(self.max_batch, rows),
                              max_seq_len=longest_prompt + self.sampling.max_new_tokens, device=self.device,
                              dtype=self.engine_dtype, pad_token_id=self.tokenizer.pad_token_id, **self.engine_kwargs)
        _sync(self.device)
        t0 = time.perf_counter()
        batch = engine.generate(self.prompts, self.sampling)
        _sync(self.device)
        t1 = time.perf_counter()
        sites = engine.guidance_sites     # guided (TRACE): the trainer replays the rollout's rounding records
        # guided (TRACE): each micro-batch's rollout records are served to the trainer with it
        context = (lambda chunk: guided_trainer(self.model, chunk, sites)) if sites else None
        TrainerLogProbs.from_sampling(self.model, self.sampling, pad_token_id=self.tokenizer.pad_token_id,
                                      write_old=False, router_replay=self.replays,
                                      micro_batch_size=self.micro_batch_size, chunk_context=context)(batch)
        _sync(self.device)
        t2 = time.perf_counter()
        report = engine.report()
        del engine
        routing = None
        if K.ROUTING_TRAINER in batch.keys(include_nested=True):
            routing = tuple(batch.get(k).cpu() for k in (K.ROUTING_EXPERTS, K.ROUTING_TRAINER, K.ROUTING_VALID)) \
                + (batch.get(K.MASK_PROMPT).sum(1).cpu(),)
        return RawDrift(batch.get(K.TOKENS_RESPONSE).cpu(), batch.get(K.LOGP_ROLLOUT).float().cpu(),
                        batch.get(K.LOGP_TRAINER).float().cpu(), batch.get(K.MASK_RESPONSE).cpu(),
                        t1 - t0, t2 - t1, report, routing)

    def edges(self, longest: int) -> list[int]:
        if self.bins == "pow2":
            return power_of_two_edges(max(longest, 1))
        n = int(self.bins)
        width = max(1, math.ceil(longest / n))
        return [i * width for i in range(math.ceil(longest / width) + 1)] if longest else [0, 1]

    def run(self, plans: list[tuple[str, PrecisionPlan]], layer_groups: int = 0,
            log=print) -> list[PlanDrift]:
        samples, group_samples = [], []
        for name, plan in plans:
            s = self.sample(plan)
            routing = s.routing_drift([0, 1])
            log(f"{name}: {int(s.mask.sum())} tokens, rollout {s.rollout_seconds:.1f}s, "
                f"rescore {s.rescore_seconds:.1f}s, mismatch_k3 "
                f"{drift_metrics(s.lp_rollout, s.lp_trainer, s.mask)['mismatch_k3']:.3g}"
                + (f", routing_mismatch {routing.metrics['routing_mismatch']:.3g} (replay "
                   f"{'on' if self.replays else 'off'})" if routing else ""))
            samples.append(s)
            parts = layer_group_plans(plan, self.model.config.num_layers, layer_groups) if layer_groups else []
            group_samples.append([(part, self.sample(p)) for part, p in parts])
        self.model.apply_plan(None)
        longest = max(int(s.mask.sum(-1).max()) for s in samples)
        edges = self.edges(longest)
        out = []
        for (name, plan), s, parts in zip(plans, samples, group_samples):
            groups = [{"part": part, **drift_metrics(g.lp_rollout, g.lp_trainer, g.mask),
                       "by_position_k3": mismatch_by_position(g.lp_rollout, g.lp_trainer, g.mask, edges).k3}
                      for part, g in parts]
            out.append(PlanDrift(
                name=name, plan=plan, metrics=drift_metrics(s.lp_rollout, s.lp_trainer, s.mask),
                by_position=mismatch_by_position(s.lp_rollout, s.lp_trainer, s.mask, edges),
                rows=s.mask.shape[0], tokens=int(s.mask.sum()), longest=int(s.mask.sum(-1).max()),
                rollout_seconds=s.rollout_seconds, rescore_seconds=s.rescore_seconds, engine=s.engine,
                groups=groups, routing=s.routing_drift(edges), router_replay=self.replays))
        return out


def _fmt(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.4g}"


def _grid(corner: str, row_names: list[str], col_names: list[str], cells: list[list[str]]) -> list[str]:
    width = max(len(n) for n in [corner, *row_names])
    cols = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(col_names)]
    head = f"{corner:{width}s}  " + "  ".join(f"{c:>{w}s}" for c, w in zip(col_names, cols))
    return [head, "-" * len(head)] + [f"{n:{width}s}  " + "  ".join(f"{c:>{w}s}" for c, w in zip(row, cols))
                                      for n, row in zip(row_names, cells)]


def drift_table(results: list[PlanDrift]) -> str:
    """Metrics x plans, then mean |log ρ| / k3 by position bin x plans, then the layer groups."""
    names = [r.name for r in results]
    rows = [[_fmt(r.metrics[m]) for r in results] for m in METRIC_NAMES]
    rows.append([f"{r.tokens} ({r.longest})" for r in results])
    rows.append([f"{r.tokens / max(r.rollout_seconds, 1e-9):.4g}" for r in results])
    lines = _grid("metric", [*METRIC_NAMES, "tokens (longest)", "rollout tokens/s"], names, rows)
    edges = results[0].by_position.edges
    spans = [f"{edges[i]}-{edges[i + 1] - 1}" if edges[i + 1] - edges[i] > 1 else f"{edges[i]}"
             for i in range(len(edges) - 1)]
    cells = [[f"{_fmt(r.by_position.abs_log_ratio[i])} / {_fmt(r.by_position.k3[i])}" for r in results]
             for i in range(len(spans))]
    lines += ["", "by response position: mean |log rho| / k3"] + _grid("position", spans, names, cells)
    routed = [r for r in results if r.routing is not None]
    if routed:
        replay = "on" if routed[0].router_replay else "off"
        names_r = [r.name for r in routed]
        keys = [k for k in routed[0].routing.metrics]
        lines += ["", f"routing (MoE; trainer top-k vs the rollout's; router replay {replay})"]
        lines += _grid("metric", keys, names_r, [[_fmt(r.routing.metrics[k]) for r in routed] for k in keys])
        cells = [[_fmt(r.routing.mismatch_by_position[i]) for r in routed] for i in range(len(spans))]
        lines += ["", "routing mismatch by response position"] + _grid("position", spans, names_r, cells)
    for r in results:
        for g in r.groups:
            lines.append(f"{r.name} / {g['part']}: mismatch_k3 {_fmt(g['mismatch_k3'])}, "
                         f"abs_log_ratio_mean {_fmt(g['abs_log_ratio_mean'])}")
    return "\n".join(lines)


def json_safe(value):
    """NaN/inf -> None (strict JSON has no NaN); recursive."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
