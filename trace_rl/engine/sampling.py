"""Token sampling shared by every engine and by the trainer's log-prob recomputation.

Two functions, split so that the trainer can recompute exactly the distribution the engine sampled from:

- `process_logits(logits, temperature, top_k, top_p) -> logq`: the log-probs of the distribution that is
  actually sampled, over the whole vocabulary (tokens outside the kept set get -inf).
- `sample(logq, generator) -> (tokens, token_logq)`: one draw per row from `exp(logq)`.

The distribution `q` (whose log-probs engines report as ("log_probs", "rollout")) is, per row:

1. `p = softmax(logits / temperature)` in float32.
2. top-k (k > 0): keep the k tokens of highest logit. Ties are broken by the lower token id (stable
   descending sort), so exactly min(k, V) tokens survive.
3. top-p (p < 1): on the top-k-renormalised distribution sorted by decreasing probability, keep the
   token at rank i when the mass of the ranks before it is < top_p (the smallest prefix whose mass
   reaches top_p; the most likely token is always kept).
4. `q` = `p` restricted to the kept set, renormalised: `log q = log_softmax(logits / T)` over the kept set.

Temperature 0 means greedy: `q` is a point mass on the argmax (lowest id on ties), whose log-prob is 0.

Why no `torch.multinomial` and no data-dependent branches: the native engine captures the decode step in
a CUDA graph, which forbids host synchronisation and dynamic shapes. `sample` uses the exponential race
(`argmax(q / E)` with `E ~ Exp(1)`, equivalent to the Gumbel-max trick), whose shapes are static. Python
branches below depend only on Python scalars (known at capture time), never on tensor values. To use a
generator inside a captured graph, register its state with the graph (`graph.register_generator_state`).

Parameters may be Python scalars (one setting for the batch) or tensors of shape [B] (one per row, e.g.
slots of a continuous batch holding different requests).
"""

from __future__ import annotations

import torch

_TINY = torch.finfo(torch.float32).tiny


def _as_row_param(value: float | int | torch.Tensor, rows: int) -> float | int | torch.Tensor:
    """A per-row tensor becomes [B, 1] (broadcasts over the vocabulary); a Python scalar stays a scalar,
    so no host-to-device copy happens inside a captured graph."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1, 1).expand(rows, 1)
    return value


def _greedy_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Point mass on the argmax: 0 there, -inf elsewhere."""
    best = logits.argmax(dim=-1, keepdim=True)
    out = torch.full_like(logits, -torch.inf)
    return out.scatter(-1, best, 0.0)


def _truncate_sorted(
    scaled: torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor
) -> torch.Tensor:
    """Top-k then top-p on temperature-scaled logits; returns log q over the vocabulary."""
    rows, vocab = scaled.shape
    sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=scaled.device).expand(rows, vocab)
    k = _as_row_param(top_k, rows)
    if isinstance(k, torch.Tensor):
        k = torch.where(k > 0, k, vocab)  # k = 0 keeps all
    elif k <= 0:
        k = vocab
    keep = rank < k
    masked = torch.where(keep, sorted_vals, -torch.inf)
    probs = torch.softmax(masked, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    p = _as_row_param(top_p, rows)
    # p >= 1 keeps everything: float32 cumsums can exceed 1 and would otherwise drop the far tail.
    keep = keep & ((mass_before < p) | (rank == 0) | (p >= 1.0))
    sorted_logq = torch.log_softmax(torch.where(keep, sorted_vals, -torch.inf), dim=-1)
    return torch.empty_like(sorted_logq).scatter(-1, sorted_idx, sorted_logq)


def process_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Log-probs `log q` [B, V] (float32) of the distribution sampled from, as defined in the module doc.

    `logits` is [B, V] (any float dtype; computed in float32). `temperature` 0 (scalar, or per row) gives
    the greedy point mass. Tokens outside the kept set get -inf.
    """
    if logits.ndim != 2:
        raise ValueError(f"process_logits expects logits [B, V], got shape {tuple(logits.shape)}")
    logits = logits.float()
    rows = logits.shape[0]
    per_row = any(isinstance(v, torch.Tensor) for v in (temperature, top_k, top_p))

    if not per_row:
        if temperature == 0:
            return _greedy_log_probs(logits)
        scaled = logits / temperature
        if top_k == 0 and top_p >= 1.0:
            return torch.log_softmax(scaled, dim=-1)
        return _truncate_sorted(scaled, top_k, top_p)

    temp = _as_row_param(temperature, rows)
    if not isinstance(temp, torch.Tensor):
        temp = torch.full((rows, 1), float(temperature), device=logits.device)
    greedy = temp == 0
    scaled = logits / torch.where(greedy, 1.0, temp.float())
    logq = _truncate_sorted(scaled, top_k, top_p)
    return torch.where(greedy, _greedy_log_probs(logits), logq)


def sample(
    logprobs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from `exp(logprobs)` [B, V]: returns (tokens [B] int64, their log-probs [B]).

    Exponential race: `argmax(logprobs - log E)`, `E ~ Exp(1)` i.i.d. `E` is clamped away from 0 so that a
    -inf log-prob never meets +inf (which would make NaN and could win the argmax).
    """
    noise = torch.empty_like(logprobs, dtype=torch.float32).exponential_(generator=generator)
    scores = logprobs.float() - noise.clamp_min(_TINY).log()
    tokens = scores.argmax(dim=-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()


def sample_from_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample(process_logits(...))`: tokens [B] and the log-probs of `q` at them."""
    return sample(process_logits(logits, temperature, top_k, top_p), generator)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """The sampling generator of one `generate` call. Unseeded, its seed is drawn from torch's global RNG,
    so `torch.manual_seed` still reproduces a run."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return gen


def sample_with_counter(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                        rng_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The native engine's sampler: tokens [B] and the log-probs of `q` (as `process_logits` defines it) at
    them, with counter-based noise keyed by `rng_state` = int64 [2] (seed, step) and the row index, so a
    captured CUDA graph draws fresh noise each replay once the engine advances the step on the device.

    On a GPU it is the fused kernel (`trace_rl.kernels.sample_tokens`: one read of the logits for greedy
    and temperature-only sampling; top-k/top-p first build log q with `process_logits`). Elsewhere it is
    the kernel's torch spec over `process_logits` (`trace_rl.kernels.sampling_reference`), whose log-probs
    are exactly `process_logits`'s; the same seed draws the same noise on both."""
    if logits.is_cuda:
        from trace_rl import kernels

        if temperature == 0:
            return kernels.sample_tokens(logits, rng_state, "greedy")
        if top_k == 0 and top_p >= 1.0:
            return kernels.sample_tokens(logits, rng_state, "temperature", temperature)
        return kernels.sample_tokens(process_logits(logits, temperature, top_k, top_p), rng_state, "logq")
    from trace_rl.kernels.sampling_reference import sample_reference

    seed, step = rng_state.tolist()
    return sample_reference(process_logits(logits, temperature, top_k, top_p), seed, step, "logq")
