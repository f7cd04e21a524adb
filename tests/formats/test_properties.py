"""Property tests: dequantized values lie on the block's grid, the error is at most half a grid step
before saturation, and quantize(dequantize(q)) == q."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_rl.formats import E2M1_MAGNITUDES, get_format, unpack_nibbles
from trace_rl.formats.mxfp4 import e8m0_to_float

FP4 = ("nvfp4", "nvfp4:row", "mxfp4")


@st.composite
def tensors(draw, block=32):
    rows = draw(st.integers(1, 4))
    blocks = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    log_scale = draw(st.floats(-20, 20))
    heavy = draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * block, generator=g)
    if heavy:  # Student-t-like heavy tails
        x = x / torch.rand(rows, blocks * block, generator=g).clamp_min(1e-3).sqrt()
    x = x * 2.0**log_scale
    zero_mask = torch.rand(x.shape, generator=g) < draw(st.floats(0, 0.5))
    return torch.where(zero_mask, torch.zeros_like(x), x)


def block_steps(name, q):
    """float32 step (value of one E2M1 unit) of every element."""
    bs = 16 if name.startswith("nvfp4") else 32
    if name.startswith("nvfp4"):
        step = q.scales.float() * q.global_scale
    else:
        step = e8m0_to_float(q.scales)
    return step.repeat_interleave(bs, dim=-1)


@settings(max_examples=60, deadline=None)
@given(x=tensors(), name=st.sampled_from(FP4))
def test_fp4_grid_error_and_idempotence(x, name):
    fmt = get_format(name)
    q = fmt.quantize(x)
    deq = fmt.dequantize(q)
    step = block_steps(name, q)
    mags = torch.tensor(E2M1_MAGNITUDES)
    live = step > 0
    # 1. on the grid: |deq| is exactly float32(m * step) for an E2M1 magnitude m
    grid = mags * step[live].unsqueeze(-1)
    assert (deq[live].abs().unsqueeze(-1) == grid).any(-1).all()
    # 2. half a grid step: where |x| / step <= 6 the error is at most half the gap around x
    r = (x / step).abs()
    inside = live & (r <= 6)
    upper_idx = torch.searchsorted(mags, r[inside].contiguous()).clamp(1, 7)
    gap = mags[upper_idx] - mags[upper_idx - 1]
    err = (x[inside] - deq[inside]).abs()
    assert (err <= gap / 2 * step[inside] * (1 + 1e-6)).all()
    # beyond 6 steps the value saturates to +-6
    sat = live & (r > 6)
    assert torch.equal(deq[sat].abs(), 6.0 * step[sat])
    # 3. idempotence: re-quantizing the dequantized tensor (same global scale) gives the same codes/scales
    q2 = fmt.quantize(deq, global_scale=q.global_scale) if name.startswith("nvfp4") else fmt.quantize(deq)
    assert torch.equal(unpack_nibbles(q2.codes), unpack_nibbles(q.codes))
    assert torch.equal(q2.scales.view(torch.uint8), q.scales.view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(x=tensors(block=128), name=st.sampled_from(["fp8_e4m3:row", "fp8_e4m3:tensor", "fp8_e4m3:block",
                                                    "fp8_e5m2:row"]))
def test_fp8_idempotence_and_error(x, name):
    fmt = get_format(name)
    q = fmt.quantize(x)
    deq = fmt.dequantize(q)
    # relative error of normal-range elements is at most half an ulp of the element type
    mant_bits = 3 if "e4m3" in name else 2
    scale = fmt.expand_scales(q.scales, q.shape)
    r = (x / scale).abs()
    normal = r >= (2.0**-6 if "e4m3" in name else 2.0**-14)
    rel = ((x - deq).abs() / x.abs())[normal]
    assert (rel <= 2.0 ** -(mant_bits + 1) + 1e-7).all()
    q2 = fmt.quantize(deq)
    assert torch.equal(q2.codes.view(torch.uint8), q.codes.view(torch.uint8))
