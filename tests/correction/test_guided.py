"""TRACE guided rounding: where the trainer's activations differ from the rollout's by perturbations that
cross rounding boundaries, `aligned` (round-to-nearest) gets other codes, `guided` gets the rollout's."""

import pytest
import torch

from trace_rl.backends import get_backend
from trace_rl.correction.guided import guided_quantize, pack_bits, record_guidance, unpack_bits
from trace_rl.formats import e8m0_to_float, get_format, unpack_nibbles
from trace_rl.models.linear import Linear

MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
GRID = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0])


def codes(values: torch.Tensor, fmt: str) -> torch.Tensor:
    """Codes of already-quantized values, re-quantized with their own (unchanged) scales."""
    return unpack_nibbles(get_format(fmt).quantize(values).codes)


def crossing_pair(fmt: str, rng: torch.Generator, around: torch.Tensor, rows: int = 6):
    """(rollout x, trainer x'): every element sits eps below a boundary in x and eps above it in x'."""
    block = 16 if fmt.startswith("nvfp4") else 32
    k = block * 4
    x = torch.randn(rows, k, generator=rng)
    q = get_format(fmt).quantize(x)
    step = (q.scales.float() * q.global_scale if fmt.startswith("nvfp4")
            else e8m0_to_float(q.scales)).repeat_interleave(block, -1)
    pick = around[torch.randint(len(around), (rows, k), generator=rng)]
    sign = torch.where(torch.rand(rows, k, generator=rng) < 0.5, -1.0, 1.0)
    eps = 1e-3
    base = sign * pick * step
    # keep each block's amax element where it is, so both sides share the block scales
    keep = x.abs().reshape(rows, -1, block).argmax(-1, keepdim=True)
    hold = torch.zeros(rows, k // block, block, dtype=torch.bool).scatter_(-1, keep, True).reshape(rows, k)
    rollout = torch.where(hold, x, base - sign * eps * step)
    trainer = torch.where(hold, x, base + sign * eps * step)
    return rollout, trainer, ~hold


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("boundary", ["midpoint", "grid"])
def test_guided_reproduces_rollout_codes_across_boundaries(fmt, boundary, rng):
    rollout, trainer, moved = crossing_pair(fmt, rng, MIDPOINTS if boundary == "midpoint" else GRID)
    ref = get_format(fmt)
    rollout_q = ref.fake_quantize(rollout)
    aligned_q = ref.fake_quantize(trainer)
    record = record_guidance(rollout, fmt)
    guided_q = guided_quantize(trainer, record, fmt)
    if boundary == "midpoint":   # round-to-nearest flips every moved element
        assert (aligned_q != rollout_q)[moved].float().mean() > 0.9
    assert torch.equal(guided_q, rollout_q)
    assert torch.equal(codes(guided_q, fmt), codes(rollout_q, fmt))


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_guided_equals_round_to_nearest_on_identical_inputs(fmt, rng):
    x = torch.randn(5, 64, generator=rng) * 3
    x[0, :16] = 0.0
    assert torch.equal(guided_quantize(x, record_guidance(x, fmt), fmt), get_format(fmt).fake_quantize(x))


def test_random_noise_aligned_disagrees_guided_agrees(rng):
    x = torch.randn(64, 256, generator=rng)
    noisy = x * (1 + 1e-3 * torch.randn(x.shape, generator=rng))
    ref = get_format("nvfp4:row")
    assert (ref.fake_quantize(noisy) != ref.fake_quantize(x)).sum() > 0
    assert torch.equal(guided_quantize(noisy, record_guidance(x, "nvfp4:row"), "nvfp4:row"), ref.fake_quantize(x))


def test_bits_round_trip_and_record_size(rng):
    bits = (torch.rand(3, 64, generator=rng) < 0.5).to(torch.uint8)
    assert torch.equal(unpack_bits(pack_bits(bits)), bits)
    rec = record_guidance(torch.randn(2, 4096, generator=rng), "nvfp4:row")
    assert rec.bytes_per_row() == 4096 // 16 + 4 + 4096 // 8   # scales + global + bits = 772 B


def test_nan_block_stays_nan(rng):
    x = torch.randn(2, 32, generator=rng)
    x[0, 3] = float("nan")
    out = guided_quantize(x, record_guidance(x, "nvfp4:row"), "nvfp4:row")
    assert torch.isnan(out[0, :16]).all() and torch.isfinite(out[0, 16:]).all()


def test_shape_mismatch_is_an_error(rng):
    rec = record_guidance(torch.randn(2, 32, generator=rng), "nvfp4:row")
    with pytest.raises(ValueError, match="same tokens"):
        guided_quantize(torch.randn(3, 32, generator=rng), rec, "nvfp4:row")


def test_guided_trainer_layer_gives_identical_outputs(rng):
    """A trainer-stage Linear in guided mode, fed activations perturbed across rounding boundaries, gives
    exactly the rollout's output (float32, CPU), where aligned mode does not; gradients pass straight."""
    rollout_x, trainer_x, _ = crossing_pair("nvfp4:row", rng, MIDPOINTS, rows=8)
    w = torch.randn(24, rollout_x.shape[1], generator=rng)
    rollout = Linear(w.shape[1], w.shape[0])
    rollout.weight.data.copy_(w)
    rollout.set_formats("nvfp4", "nvfp4", "bf16")
    rollout.to_rollout()
    want = rollout(rollout_x)

    trainer = Linear(w.shape[1], w.shape[0])
    trainer.weight.data.copy_(w)
    trainer.set_formats("nvfp4", "nvfp4", "aligned")
    assert not torch.equal(trainer(trainer_x), want)
    trainer.set_formats("nvfp4", "nvfp4", "guided")
    record = record_guidance(rollout_x, "nvfp4:row")
    trainer.activation_hook = lambda layer, x: record
    xt = trainer_x.clone().requires_grad_(True)
    got = trainer(xt)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    got.sum().backward()
    assert xt.grad is not None and torch.isfinite(xt.grad).all()
    assert "fp4.fake_quantize.guided.reference" in get_backend("fp4").paths.counts
