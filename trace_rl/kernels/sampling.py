"""Fused token sampling: one read of each logits row gives the sampled token and its log-prob.

Three modes (`trace_rl.engine.sampling` defines the distribution; this kernel draws from it):
- `greedy`: argmax of the logits (lowest id on ties), log-prob 0.
- `temperature`: q = softmax(logits / T). One pass keeps the running max and sum of exp (online
  softmax) and the exponential race argmax_v(logits_v / T - log E_v), E_v ~ Exp(1); the log-prob of the
  winner is logits_w / T - logsumexp(logits / T).
- `logq`: the input already holds log q (after top-k/top-p, -inf outside the kept set): argmax_v(log q_v
  - log E_v), log-prob log q_w.

Randomness is counter-based, so the kernel runs inside a CUDA graph with nothing on the host: E_v =
-log(u), u = a 24-bit uniform from a hash of (seed, step, row, v), where seed and step are read from an
int64 device tensor [2] that the engine advances inside its captured step. The hash is two rounds of
MurmurHash3's 32-bit finaliser over the token index keyed by (seed, step, row) (well mixed; not
cryptographic). `noise_reference` is the same function in torch (int64 arithmetic masked to 32 bits), and
`sample_reference` the torch spec of the whole kernel (`trace_rl.kernels.sampling_reference`, no Triton:
the engine's CPU path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.kernels.sampling_reference import MODES, noise_reference, sample_reference  # noqa: F401


@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h


@triton.jit
def _row_key(seed_ptr, row):
    seed = tl.load(seed_ptr)
    step = tl.load(seed_ptr + 1)
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    s = (step & 0xFFFFFFFF).to(tl.uint32)
    r = row.to(tl.uint32)
    key = _fmix32(_fmix32(lo ^ (s * 0x9E3779B9)) ^ hi ^ (r * 0x85EBCA6B))
    return key, _fmix32(key ^ 0xC2B2AE35)


@triton.jit
def _neg_log_exp(v, key, key2):
    """-log(E) for E = -log(u), u uniform in (0, 1) from the hash of token index v."""
    h = _fmix32(_fmix32(v.to(tl.uint32) ^ key) + key2)
    u = ((h >> 9).to(tl.float32) * 2.0 + 1.0) * 5.9604644775390625e-08     # (2k + 1) / 2^24: exact
    return -tl.log(-tl.log(u))


@triton.jit
def _sample_kernel(x_ptr, seed_ptr, tok_ptr, logp_ptr, V, stride_x, temperature, MODE: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    key, key2 = _row_key(seed_ptr, row)
    base = x_ptr + row.to(tl.int64) * stride_x
    best = tl.full([], float("-inf"), tl.float32)
    best_x = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int32)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for v0 in range(0, V, BLOCK):
        v = v0 + tl.arange(0, BLOCK)
        x = tl.load(base + v, mask=v < V, other=float("-inf")).to(tl.float32)
        if MODE == 1:
            x = tl.math.div_rn(x, temperature)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
        if MODE == 0:
            score = x
        else:
            score = tl.where(v < V, x + _neg_log_exp(v, key, key2), float("-inf"))
        i = tl.argmax(score, axis=0)
        c = tl.max(score, axis=0)
        cx = tl.sum(tl.where(tl.arange(0, BLOCK) == i, x, 0.0), axis=0)
        better = c > best
        best_i = tl.where(better, v0 + i, best_i)
        best_x = tl.where(better, cx, best_x)
        best = tl.where(better, c, best)
    if MODE == 0:
        logp = 0.0
    elif MODE == 1:
        logp = best_x - (m + tl.log(s))
    else:
        logp = best_x
    tl.store(tok_ptr + row, best_i.to(tl.int64))
    tl.store(logp_ptr + row, logp)


def sample(x: torch.Tensor, seed_state: torch.Tensor, mode: str, temperature: float = 1.0,
           out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel version of `sample_reference`: x [B, V] logits (or log q for mode 'logq'); seed_state int64
    [2] (seed, step) on x's device. Returns (tokens [B] int64, log-probs [B] float32)."""
    if mode not in MODES:
        raise ValueError(f"sample: mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "temperature" and not temperature > 0:
        raise ValueError(f"sample: temperature must be > 0 in mode 'temperature' (got {temperature}); use 'greedy'")
    if x.ndim != 2 or x.stride(-1) != 1:
        raise ValueError(f"sample: x must be [B, V] with contiguous rows, got {tuple(x.shape)} {x.stride()}")
    if seed_state.dtype != torch.int64 or seed_state.numel() != 2:
        raise ValueError("sample: seed_state must be an int64 tensor [2] (seed, step)")
    b, v = x.shape
    tok, logp = out if out is not None else (torch.empty(b, dtype=torch.int64, device=x.device),
                                             torch.empty(b, dtype=torch.float32, device=x.device))
    _sample_kernel[(b,)](x, seed_state, tok, logp, v, x.stride(0), float(temperature), MODE=MODES[mode],
                         BLOCK=4096, num_warps=8)
    return tok, logp
