"""Fused decode-step kernels (add + RMSNorm, SiLU*mul, sampling) against their torch references, odd shapes,
fresh random inputs. On CPU they run in Triton's interpreter (float32 I/O: its bf16 casts are not faithful)."""

import pytest
import torch

from trace_rl.kernels import add_rms_norm, sample_tokens, silu_mul
from trace_rl.kernels.rmsnorm import add_rms_norm_reference
from trace_rl.kernels.sampling_reference import noise_reference, sample_reference
from trace_rl.kernels.swiglu import silu_mul_reference


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


@pytest.mark.parametrize("rows,n,residual", [(3, 96, True), (1, 4096, True), (37, 128, False)])
def test_add_rms_norm_matches_reference(rows, n, residual, device, gen):
    dt = _dtype(device)
    x = (torch.randn(rows, n, generator=gen) * 3).to(dt)
    r = torch.randn(rows, n, generator=gen).to(dt) if residual else None
    w = (torch.rand(n, generator=gen) + 0.5).to(dt)
    h, r_out = add_rms_norm(x.to(device), None if r is None else r.to(device), w.to(device), 1e-6)
    h_ref, r_ref = add_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(r_out.cpu(), r_ref)                     # the residual add is exact in both
    tol = dict(atol=1e-2, rtol=1e-2) if dt == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.cpu(), h_ref, **tol)


def test_add_rms_norm_keeps_nan(device):
    x = torch.ones(2, 64)
    x[1, 3] = float("nan")
    h, _ = add_rms_norm(x.to(device), None, torch.ones(64, device=device), 1e-6)
    assert h[0].isfinite().all() and h[1].isnan().all()


@pytest.mark.parametrize("rows,i", [(1, 96), (5, 1100)])
def test_silu_mul_matches_reference(rows, i, device, gen):
    dt = _dtype(device)
    x = (torch.randn(rows, 2 * i, generator=gen) * 4).to(dt)
    out = silu_mul(x.to(device))
    tol = dict(atol=1e-2, rtol=1e-2) if dt == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.cpu(), silu_mul_reference(x), **tol)


@pytest.mark.parametrize("mode", ["greedy", "temperature", "logq"])
def test_sample_matches_reference(mode, device, gen):
    rows, vocab = 3, 5000                     # two 4096-token chunks, the second partial
    seed, step = int(torch.randint(0, 2**62, (), generator=gen)), int(torch.randint(0, 1000, (), generator=gen))
    x = torch.randn(rows, vocab, generator=gen) * 3
    if mode == "logq":
        x[:, ::3] = float("-inf")                           # tokens outside a truncated set
        x = torch.log_softmax(x, -1)
    state = torch.tensor([seed, step], dtype=torch.int64, device=device)
    tok, logp = sample_tokens(x.to(device), state, mode, temperature=0.7)
    tok_ref, logp_ref = sample_reference(x, seed, step, mode, temperature=0.7)
    tok = tok.cpu()
    if not torch.equal(tok, tok_ref):      # only a near-tie may differ (log's last bit on the GPU)
        scores = (x / (0.7 if mode == "temperature" else 1.0)) + noise_reference(seed, step, rows, vocab)
        rows_ = torch.arange(rows)
        gap = (scores[rows_, tok] - scores[rows_, tok_ref]).abs()
        assert (gap < 1e-4).all(), gap
    else:
        torch.testing.assert_close(logp.cpu(), logp_ref, atol=1e-5, rtol=1e-5)
    if mode == "logq":
        assert (tok % 3 != 0).all()                          # never a token with log q = -inf


def test_sample_noise_is_exponential_race(gen):
    """The reference noise is -log(Exp(1)) i.i.d.: sampling by it follows softmax (chi-square-free check on
    a 4-token distribution over many rows), and another step or seed gives other noise."""
    n = noise_reference(7, 3, 20000, 4)
    assert not torch.equal(n, noise_reference(7, 4, 20000, 4)) and not torch.equal(n, noise_reference(8, 3, 20000, 4))
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    freq = torch.bincount((logits + n).argmax(-1), minlength=4).float() / n.shape[0]
    assert (freq - torch.softmax(logits, 0)).abs().max() < 0.015


def test_sample_rejects_bad_input(device):
    state = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="temperature"):
        sample_tokens(torch.zeros(1, 8, device=device), state, "temperature", temperature=0.0)
    with pytest.raises(ValueError, match="mode"):
        sample_tokens(torch.zeros(1, 8, device=device), state, "top_p")
