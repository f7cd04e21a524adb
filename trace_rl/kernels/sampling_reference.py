"""Torch spec of the fused sampling kernel (`trace_rl.kernels.sampling`), with no Triton: the native engine
samples with it on CPU, so a seed gives the same noise on CPU and GPU. See that module for the modes and
the counter-based noise (two rounds of MurmurHash3's 32-bit finaliser keyed by seed, step and row)."""

from __future__ import annotations

import torch

MODES = {"greedy": 0, "temperature": 1, "logq": 2}
_C_STEP, _C_ROW, _C_KEY = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35
_MASK = 0xFFFFFFFF


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2^32 for a in [0, 2^32) held in int64 (partial products stay below 2^48)."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _MASK


def _fmix32_ref(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, _M1)
    h = h ^ (h >> 13)
    h = _mul32(h, _M2)
    return h ^ (h >> 16)


def noise_reference(seed: int, step: int, rows: int, vocab: int, device="cpu") -> torch.Tensor:
    """-log(E) [rows, V] float32, exactly the kernel's values."""
    seed &= (1 << 64) - 1
    lo, hi = seed & _MASK, (seed >> 32) & _MASK
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    r = torch.arange(rows, dtype=torch.int64, device=device)
    key = _fmix32_ref(_fmix32_ref(t(lo) ^ _mul32(t(step & _MASK), _C_STEP)) ^ t(hi) ^ _mul32(r, _C_ROW))[:, None]
    key2 = _fmix32_ref(key ^ _C_KEY)
    v = torch.arange(vocab, dtype=torch.int64, device=device)[None, :]
    h = _fmix32_ref((_fmix32_ref(v ^ key) + key2) & _MASK)
    u = ((h >> 9).float() * 2.0 + 1.0) * 5.9604644775390625e-08
    return -torch.log(-torch.log(u))


def sample_reference(x: torch.Tensor, seed: int, step: int, mode: str,
                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch spec: (tokens, log-probs) from logits (or log q), the noise of `noise_reference`."""
    xf = x.float()
    if mode == "greedy":
        return xf.argmax(-1), torch.zeros(x.shape[0], device=x.device)
    if mode == "temperature":
        xf = xf / temperature
    tok = (xf + noise_reference(seed, step, *x.shape, device=x.device)).argmax(-1)
    chosen = xf.gather(-1, tok[:, None])[:, 0]
    if mode == "temperature":
        chosen = chosen - torch.logsumexp(xf, dim=-1)
    return tok, chosen
