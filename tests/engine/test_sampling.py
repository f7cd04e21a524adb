"""process_logits / sample: the reported log-probs are those of the distribution actually sampled."""

import math

import pytest
import torch

from trace_rl.engine.sampling import process_logits, sample, sample_from_logits


def test_temperature_only_is_log_softmax_of_scaled_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    got = process_logits(logits, temperature=0.5)
    torch.testing.assert_close(got, torch.log_softmax(logits / 0.5, -1))


def test_greedy_gives_log_prob_zero_at_argmax_and_minus_inf_elsewhere():
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0]])  # tie: the lower id wins
    got = process_logits(logits, temperature=0.0)
    assert got[0, 1] == 0.0
    assert torch.isneginf(got[0, [0, 2, 3]]).all()
    tokens, lp = sample(got, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1] and lp.tolist() == [0.0]


def test_top_k_keeps_k_tokens_renormalised_by_hand():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    got = process_logits(logits, temperature=1.0, top_k=2)
    z = math.log(math.exp(4.0) + math.exp(3.0))
    expected = torch.tensor([[-math.inf, 4.0 - z, -math.inf, 3.0 - z]])
    torch.testing.assert_close(got, expected)


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # mass before ranks: 0, .5, .8, .95 -> top_p=0.8 keeps ranks with mass_before < .8: tokens 0, 1
    got = process_logits(logits, top_p=0.8)
    expected = torch.tensor([[math.log(0.5 / 0.8), math.log(0.3 / 0.8), -math.inf, -math.inf]])
    torch.testing.assert_close(got, expected)
    # top_p=0.81 also keeps token 2 (mass before it .8 < .81)
    got = process_logits(logits, top_p=0.81)
    assert torch.isfinite(got[0, :3]).all() and torch.isneginf(got[0, 3])


def test_top_k_then_top_p_with_temperature():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0, 0.5]])
    t, k, p = 0.7, 3, 0.6
    got = process_logits(logits, temperature=t, top_k=k, top_p=p)
    # by hand: top-3 ids {0, 2, 4}; renormalised probs at T=0.7
    e = torch.tensor([2.0, 1.0, 0.5]) / t
    q = torch.softmax(e, 0)  # ~[.66, .16, .08]/.. -> first alone has mass >= .6
    assert q[0] >= p
    expected = torch.full((1, 5), -math.inf)
    expected[0, 0] = 0.0
    torch.testing.assert_close(got, expected)


def test_per_row_parameters_match_scalar_calls():
    torch.manual_seed(0)
    logits = torch.randn(4, 11)
    temps = torch.tensor([1.0, 0.0, 0.5, 2.0])
    ks = torch.tensor([0, 3, 5, 0])
    ps = torch.tensor([1.0, 1.0, 0.7, 0.9])
    got = process_logits(logits, temps, ks, ps)
    for i in range(4):
        ref = process_logits(logits[i : i + 1], float(temps[i]), int(ks[i]), float(ps[i]))
        torch.testing.assert_close(got[i : i + 1], ref)


def test_distribution_is_normalised_over_kept_set():
    torch.manual_seed(1)
    logq = process_logits(torch.randn(8, 50), temperature=0.9, top_k=20, top_p=0.9)
    torch.testing.assert_close(logq.exp().sum(-1), torch.ones(8))


def test_sample_matches_distribution_and_reports_its_log_probs():
    logq = torch.log(torch.tensor([[0.1, 0.6, 0.0, 0.3]])).expand(20000, 4)
    gen = torch.Generator().manual_seed(123)
    tokens, lp = sample(logq, gen)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.6, 0.0, 0.3]), atol=0.015, rtol=0)
    torch.testing.assert_close(lp, logq.gather(-1, tokens[:, None]).squeeze(-1))
    assert (tokens != 2).all()  # zero-probability token never drawn


def test_sample_is_reproducible_with_generator():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    a = sample_from_logits(logits, 1.0, 0, 0.95, torch.Generator().manual_seed(7))
    b = sample_from_logits(logits, 1.0, 0, 0.95, torch.Generator().manual_seed(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_rejects_non_2d_logits():
    with pytest.raises(ValueError):
        process_logits(torch.zeros(2, 3, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("per_row", [False, True])
def test_sampling_captures_in_a_cuda_graph(per_row):
    """No host syncs or dynamic shapes: the step replays from a CUDA graph and matches eager sampling."""
    device = torch.device("cuda")
    logits = torch.randn(8, 1000, device=device, generator=torch.Generator(device).manual_seed(0))
    if per_row:
        params = (torch.full((8,), 0.8, device=device), torch.full((8,), 50, device=device),
                  torch.full((8,), 0.9, device=device))
    else:
        params = (0.8, 50, 0.9)
    gen = torch.Generator(device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph
        sample_from_logits(logits, *params, generator=gen)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(gen)
    with torch.cuda.graph(graph):
        tokens, lp = sample_from_logits(logits, *params, generator=gen)
    gen.manual_seed(11)
    graph.replay()
    torch.cuda.synchronize()
    expected_logq = process_logits(logits, *params)
    torch.testing.assert_close(lp, expected_logq.gather(-1, tokens[:, None]).squeeze(-1))
    assert torch.isfinite(lp).all()
    seen = {tuple(tokens.tolist())}
    for seed in (12, 13):
        gen.manual_seed(seed)
        graph.replay()
        seen.add(tuple(tokens.tolist()))
    assert len(seen) > 1  # the generator state advances between replays
