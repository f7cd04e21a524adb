"""Drift metrics: how far the rollout's log-probs are from the trainer's, logged every step.

Notation: over the real response tokens V (N = |V| of them) and the sequences S that have at least one,
δ_t = log π_rollout(y_t) − log π_trainer(y_t) and ρ_t = π_trainer / π_rollout = exp(−δ_t).

| name                   | formula                                                       | identical policies |
|------------------------|---------------------------------------------------------------|--------------------|
| mismatch_k1            | mean_V δ_t            (k1 estimate of KL(π_rollout‖π_trainer)) | 0 |
| mismatch_k3            | mean_V (ρ_t − log ρ_t − 1)     (k3 estimate of the same KL)    | 0 |
| abs_log_ratio_mean     | mean_V |δ_t|                                                  | 0 |
| abs_log_ratio_max      | max_V |δ_t|                                                   | 0 |
| chi2_token             | mean_V ρ_t² − 1                                               | 0 |
| chi2_seq               | mean_S (Π_{t∈s} ρ_t)² − 1                                     | 0 |
| ess                    | (Σ_V ρ_t)² / (N Σ_V ρ_t²)   (normalised effective sample size) | 1 |
| token_mult_prob_error  | mean_V exp|δ_t|                                               | 1 |
| ppl_ratio              | mean_S PPL_trainer(s) / PPL_rollout(s) = mean_S exp(mean_{t∈s} δ_t) | 1 |
| frac_masked_tokens     | fraction of V that the corrections masked                     | 0 |
| frac_rejected_seqs     | fraction of S whose every real token the corrections masked   | 0 |

(PPL(s) = exp(−mean_{t∈s} log π(y_t)).) Computed in float64; ess divides every ρ_t by the largest first
(it is scale-free), so it stays exact at log-ratios where ρ_t itself overflows. Metrics describe the data,
so they run over every real token, not only those the corrections kept. NaN in a real token's log-prob
makes every metric that reads it NaN; with no real token at all (zero-length responses included), the
means are NaN too (0/0), never a made-up 0.

`mismatch_by_position` bins response positions (default edges 0, 1, 2, 4, 8, ... : KV-cache error grows
with length, so early positions get fine bins and long tails coarse ones) and reports per bin the token
count, the mean |δ|, δ (k1) and k3, and the ess of the bin's tokens.

`correction_fractions` says what each correction of a `Corrections` list does on its own to a batch: the
share of real tokens its mask drops (`frac_masked`) and the share whose importance weight it truncated
(`frac_truncated`: TIS weights cut at C), keyed `correction/<kind>/...`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tensordict import NestedKey, TensorDictBase

from trace_rl.correction.routing_metrics import RoutingDrift, routing_drift
from trace_rl.data import schema as K

METRIC_NAMES = (
    "mismatch_k1",
    "mismatch_k3",
    "abs_log_ratio_mean",
    "abs_log_ratio_max",
    "chi2_token",
    "chi2_seq",
    "ess",
    "token_mult_prob_error",
    "ppl_ratio",
    "frac_masked_tokens",
    "frac_rejected_seqs",
)


@dataclass
class PositionMismatch:
    """Mismatch by response position. Bin i covers positions [edges[i], edges[i+1]); empty bins hold NaN.
    `ess` (the normalised effective sample size of each bin's ρ_t) is empty when not computed (records
    written before it existed)."""

    edges: list[int]
    count: list[int]
    abs_log_ratio: list[float]
    k1: list[float]
    k3: list[float]
    ess: list[float] = field(default_factory=list)

    def flat(self, prefix: str = "mismatch_by_position") -> dict[str, float]:
        """Loggable scalars, e.g. `mismatch_by_position/abs_log_ratio/8-16`."""
        out = {}
        for i in range(len(self.count)):
            span = f"{self.edges[i]}-{self.edges[i + 1]}"
            out[f"{prefix}/count/{span}"] = float(self.count[i])
            out[f"{prefix}/abs_log_ratio/{span}"] = self.abs_log_ratio[i]
            out[f"{prefix}/k1/{span}"] = self.k1[i]
            out[f"{prefix}/k3/{span}"] = self.k3[i]
            if self.ess:
                out[f"{prefix}/ess/{span}"] = self.ess[i]
        return out


@dataclass
class DriftReport:
    """The scalar metrics (exactly `METRIC_NAMES`), the by-position breakdown, and for mixture-of-experts
    batches the routing drift (`trace_rl.correction.routing_metrics`)."""

    metrics: dict[str, float]
    by_position: PositionMismatch
    routing: RoutingDrift | None = None

    def flat(self) -> dict[str, float]:
        return {**self.metrics, **self.by_position.flat(), **(self.routing.flat() if self.routing else {})}


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.sum()


def drift_metrics(
    log_p_rollout: torch.Tensor,
    log_p_trainer: torch.Tensor,
    mask: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> dict[str, float]:
    """The scalar drift metrics of the module table, as Python floats (one host sync).

    `log_p_*` and `mask` are [B, Lr]; `keep` is the corrections' mask (None: nothing masked).
    """
    mask = mask.bool()
    delta = torch.where(mask, log_p_rollout.detach().double() - log_p_trainer.detach().double(), 0.0)
    neg = -delta  # log ρ
    rho = neg.exp()
    # ess is invariant to scaling every ρ: divide by the largest (exp(log ρ - max) <= 1 cannot overflow)
    top = torch.cat([torch.where(mask, neg, -torch.inf).reshape(-1), neg.new_full((1,), -torch.inf)]).amax()
    rho_scaled = torch.where(mask, (neg - torch.where(torch.isfinite(top), top, 0.0)).exp(), 0.0)
    n = mask.sum()
    rows_real = mask.any(-1)
    seq_count = mask.sum(-1)

    sum_rho2 = torch.where(mask, rho * rho, 0.0).sum()
    seq_log_rho = torch.where(mask, neg, 0.0).sum(-1)
    seq_mean_delta = torch.where(mask, delta, 0.0).sum(-1) / seq_count.clamp_min(1)
    k3 = torch.expm1(neg) - neg

    if keep is None:
        masked_tokens = torch.zeros((), device=mask.device)
        rejected = torch.zeros((), device=mask.device)
    else:
        dropped = mask & ~keep.bool()
        masked_tokens = dropped.sum() / n
        rejected = ((dropped.sum(-1) == seq_count) & rows_real).sum() / rows_real.sum()

    values = torch.stack([
        _masked_mean(delta, mask),
        _masked_mean(k3, mask),
        _masked_mean(delta.abs(), mask),
        torch.where(n > 0, torch.cat([torch.where(mask, delta.abs(), -torch.inf).reshape(-1),
                                      delta.new_full((1,), -torch.inf)]).amax(), torch.nan),
        sum_rho2 / n - 1,
        (torch.where(rows_real, (2 * seq_log_rho).exp(), 0.0).sum() / rows_real.sum()) - 1,
        rho_scaled.sum() ** 2 / (n * (rho_scaled * rho_scaled).sum()),
        _masked_mean(delta.abs().exp(), mask),
        torch.where(rows_real, seq_mean_delta.exp(), 0.0).sum() / rows_real.sum(),
        masked_tokens.double(),
        rejected.double(),
    ])
    return dict(zip(METRIC_NAMES, values.tolist()))


def power_of_two_edges(length: int) -> list[int]:
    """0, 1, 2, 4, 8, ... up to the first power of two >= length."""
    edges, e = [0, 1], 1
    while e < length:
        e *= 2
        edges.append(e)
    return edges


def mismatch_by_position(
    log_p_rollout: torch.Tensor,
    log_p_trainer: torch.Tensor,
    mask: torch.Tensor,
    edges: Sequence[int] | None = None,
) -> PositionMismatch:
    """Mean |δ|, δ, k3 and the ess per bin of response position (default `power_of_two_edges`)."""
    mask = mask.bool()
    length = mask.shape[-1]
    edges = list(edges) if edges is not None else power_of_two_edges(length)
    if len(edges) < 2 or sorted(edges) != edges:
        raise ValueError(f"bin edges must be increasing with at least two entries, got {edges}")
    delta = torch.where(mask, log_p_rollout.detach().float() - log_p_trainer.detach().float(), 0.0)
    k3 = torch.expm1(-delta) + delta
    pos = torch.arange(length, device=mask.device)
    edge_t = torch.tensor(edges, device=mask.device)
    bins = torch.searchsorted(edge_t, pos, right=True) - 1  # position p in [edges[b], edges[b+1])
    in_range = (bins >= 0) & (pos < edges[-1])
    bins = bins.clamp(0, len(edges) - 2).expand_as(mask)
    valid = mask & in_range
    nb = len(edges) - 1

    def per_bin(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(nb, device=mask.device).index_add_(0, bins[valid], values[valid])

    count = per_bin(torch.ones_like(delta))
    # ess per bin, scale-free: divide each ρ_t by the largest ρ of its bin first (no overflow at any log ρ)
    log_rho = (-delta).double()
    top = torch.full((nb,), -torch.inf, dtype=torch.float64, device=mask.device).scatter_reduce(
        0, bins[valid], log_rho[valid], "amax")
    scaled = torch.where(valid, (log_rho - top[bins].nan_to_num(neginf=0.0)).exp(), 0.0)
    sums = torch.zeros(2, nb, dtype=torch.float64, device=mask.device)
    sums[0].index_add_(0, bins[valid], scaled[valid])
    sums[1].index_add_(0, bins[valid], scaled[valid] ** 2)
    ess = sums[0] ** 2 / (count.double() * sums[1])                                   # empty bin: 0/0 = NaN
    stats = torch.stack([per_bin(delta.abs()), per_bin(delta), per_bin(k3)]) / count  # empty bin: 0/0 = NaN
    abs_lr, k1, k3v = stats.tolist()
    return PositionMismatch(edges=edges, count=[int(c) for c in count.tolist()], abs_log_ratio=abs_lr,
                            k1=k1, k3=k3v, ess=ess.tolist())


def correction_fractions(corrections, log_p_rollout: torch.Tensor, log_p_trainer: torch.Tensor,
                         mask: torch.Tensor) -> dict[str, float]:
    """What each correction of `corrections` (a `Corrections` or a list of `Correction`s) does on its own, over
    the real tokens: `correction/<kind>/frac_masked` (its mask drops them) and `correction/<kind>/frac_truncated`
    (its weight was cut: `Correction.truncated`, e.g. TIS with ρ above C; 0 for corrections that only mask).
    A kind listed twice is keyed `<kind>.1`, `<kind>.2`, .... {} without corrections; NaN without real tokens.
    One host sync."""
    items = list(getattr(corrections, "corrections", corrections) or [])
    if not items:
        return {}
    mask = mask.bool()
    lr = torch.where(mask, log_p_trainer.detach().float() - log_p_rollout.detach().float(), 0.0)
    n = mask.sum()                       # no real token: 0/0 = NaN, as in drift_metrics
    kinds = [c.kind or type(c).__name__ for c in items]
    values = []
    for c in items:
        result = c.compute(lr, mask)
        dropped = mask & ~result.keep.bool() if result.keep is not None else torch.zeros_like(mask)
        cut = c.truncated(lr, mask)
        cut = mask & cut.bool() if cut is not None else torch.zeros_like(mask)
        values += [dropped.sum() / n, cut.sum() / n]
    flat = torch.stack(values).tolist()
    out = {}
    for i, kind in enumerate(kinds):
        name = kind if kinds.count(kind) == 1 else f"{kind}.{kinds[:i + 1].count(kind)}"
        out[f"correction/{name}/frac_masked"] = flat[2 * i]
        out[f"correction/{name}/frac_truncated"] = flat[2 * i + 1]
    return out


class DriftMetrics:
    """Computes the drift metrics of a batch (TorchRL-style keys; reads only).

    in_keys: ("log_probs", "rollout"), ("log_probs", "trainer"), ("masks", "response"), and, when
    present, ("correction", "mask") and the routing records of MoE batches (("routing", "experts"|"valid"|
    "trainer"), ("masks", "prompt")).
    """

    def __init__(
        self,
        edges: Sequence[int] | None = None,
        *,
        rollout_key: NestedKey = K.LOGP_ROLLOUT,
        trainer_key: NestedKey = K.LOGP_TRAINER,
        mask_key: NestedKey = K.MASK_RESPONSE,
        keep_key: NestedKey = K.CORRECTION_MASK,
    ):
        self.edges = edges
        self.in_keys = [rollout_key, trainer_key, mask_key, keep_key]

    def __call__(self, td: TensorDictBase) -> DriftReport:
        rollout_key, trainer_key, mask_key, keep_key = self.in_keys
        lp_r, lp_t, mask = td.get(rollout_key), td.get(trainer_key), td.get(mask_key)
        keep = td.get(keep_key, None)
        by_position = mismatch_by_position(lp_r, lp_t, mask, self.edges)
        routing = None
        if td.get(K.ROUTING_TRAINER, None) is not None and td.get(K.ROUTING_EXPERTS, None) is not None:
            routing = routing_drift(td.get(K.ROUTING_EXPERTS), td.get(K.ROUTING_TRAINER), td.get(K.ROUTING_VALID),
                                    td.get(K.MASK_PROMPT).sum(1), by_position.edges)
        return DriftReport(metrics=drift_metrics(lp_r, lp_t, mask, keep), by_position=by_position, routing=routing)
