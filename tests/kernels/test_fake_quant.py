"""Fused fake-quantize kernels against the torch references, bit for bit (values in the output dtype).

On CPU through Triton's interpreter (tiny grids, big tiles), on the GPU compiled; `-m gpu` adds model-sized
shapes. References: `get_format(fmt).fake_quantize` (round to nearest) and `guided_quantize` (TRACE).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trace_rl.correction.guided import GuidanceRecord, guided_quantize, record_guidance
from trace_rl.formats import get_format
from trace_rl.kernels.fake_quant import FORMAT_IDS, fake_quantize

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning",
                                        "ignore:divide by zero:RuntimeWarning",
                                        "ignore:overflow:RuntimeWarning")

NEAREST = ["nvfp4:row", "mxfp4", "fp8_e4m3:row", "fp8_e4m3:block", "nvfp4", "fp8_e4m3:tensor"]


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal dtype, shape and bits, NaN where NaN (payloads aside); -0.0 is not 0.0."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    ints = torch.int16 if want.dtype == torch.bfloat16 else torch.int32
    differ = (got.view(ints) != want.view(ints)) & ~nan
    assert not differ.any(), f"{int(differ.sum())} of {want.numel()} values differ, e.g. " \
                             f"{got[differ][:4].tolist()} vs {want[differ][:4].tolist()}"


def inputs(shape, gen, dtype, special: bool = True) -> torch.Tensor:
    """Rows spanning magnitudes, plus the awkward cases: a zero block, -0.0, E2M1 ties, a tiny value, and a
    block holding NaN / +Inf (their whole block must come out NaN)."""
    K = shape[-1]
    x = torch.randn(*shape, generator=gen) * torch.exp(torch.randn(*shape[:-1], 1, generator=gen) * 3)
    x2 = x.view(-1, K)
    if special and x2.shape[0] >= 3:
        x2[0, :32] = 0.0
        x2[0, 1] = -0.0
        x2[1] = x2[1].clamp(-5.9, 5.9)
        x2[1, :16] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5,
                                   -5, 1e-30])
        x2[2, 3] = float("nan")
        x2[-1, K - 1] = float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("fmt", NEAREST)
@pytest.mark.parametrize("shape", [(3, 128), (37, 384), (2, 5, 1152)])   # odd rows, K not a power of two
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_to_nearest_matches_reference(fmt, shape, dtype, device, gen):
    x = inputs(shape, gen, dtype)
    want = get_format(fmt).fake_quantize(x)
    assert_same_bits(fake_quantize(x.to(device), fmt), want)


def perturbed(x: torch.Tensor, gen) -> torch.Tensor:
    """x moved by ~1e-3 relative: enough to cross many E2M1 rounding boundaries (what the trainer sees)."""
    return x * (1 + 1e-3 * torch.randn(x.shape, generator=gen))


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["linear", "kv"])    # [B, T, K] / [B, T, heads, head_dim], valid [B, T]
def test_guided_matches_reference(fmt, dtype, layout, device, gen):
    shape = (3, 7, 160) if layout == "linear" else (2, 9, 3, 64)
    rollout = inputs(shape, gen, torch.float32)
    record = record_guidance(rollout, fmt)
    valid = torch.rand(shape[:2], generator=gen) < 0.75       # unrecorded rows round to nearest
    record = dataclasses.replace(record, valid=valid)
    trainer = perturbed(rollout, gen).to(dtype)
    want = guided_quantize(trainer, record, fmt).to(dtype)
    got = fake_quantize(trainer.to(device), fmt, to_device(record, device))
    assert_same_bits(got, want)
    # guided differs from round-to-nearest where the perturbation crossed a boundary
    assert not torch.equal(want[valid].float().nan_to_num(), get_format(fmt).fake_quantize(trainer)[valid].float()
                           .nan_to_num())


def to_device(record: GuidanceRecord, device) -> GuidanceRecord:
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return GuidanceRecord(move(record.scales), move(record.global_scale), move(record.bits), move(record.valid))


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_guided_without_valid_mask_and_extreme_records(fmt, device, gen):
    """All rows recorded; records holding a zero step, a NaN scale (a rollout block that held NaN), and
    the largest E8M0 exponents."""
    x = torch.randn(5, 256, generator=gen) * 4
    record = record_guidance(x, fmt)
    scales = record.scales.clone()
    scales[0, 0] = 0                                        # zero step (nvfp4) / 2**-127 (mxfp4)
    scales[1, 1] = 0x7F if fmt == "nvfp4:row" else 255      # NaN
    if fmt == "mxfp4":
        scales[2, 2], scales[3, 3] = 254, 253               # 2**127, 2**126: x * 2**-e underflows exactly
    record = dataclasses.replace(record, scales=scales)
    trainer = perturbed(x, gen)
    assert_same_bits(fake_quantize(trainer.to(device), fmt, to_device(record, device)),
                     guided_quantize(trainer, record, fmt))


def test_rejections(device):
    x = torch.zeros(2, 32, device=device)
    with pytest.raises(ValueError, match="no fake-quantize kernel"):
        fake_quantize(x, "fp8_e5m2:row")
    with pytest.raises(ValueError, match="multiple of 16"):
        fake_quantize(torch.zeros(2, 24, device=device), "nvfp4:row")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        fake_quantize(x.half(), "nvfp4:row")
    rec = to_device(record_guidance(torch.randn(3, 32), "nvfp4:row"), device)
    with pytest.raises(ValueError, match="same tokens"):
        fake_quantize(x, "nvfp4:row", rec)
    assert set(FORMAT_IDS) >= {"nvfp4:row", "mxfp4", "fp8_e4m3:row"}


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", NEAREST)
@pytest.mark.parametrize("shape", [(1027, 2048), (333, 6144), (65, 12288), (16, 8, 128)])
def test_model_shapes_on_gpu(fmt, shape, gen):
    """Qwen3-1.7B / 8B activation rows (hidden 2048/4096, MLP 6144/12288) and K/V rows, bf16, against the
    CPU reference."""
    x = inputs(shape, gen, torch.bfloat16)
    assert_same_bits(fake_quantize(x.cuda(), fmt), get_format(fmt).fake_quantize(x))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("K", [2048, 6144, 12288])
def test_guided_model_shapes_on_gpu(fmt, K, gen):
    rollout = inputs((2, 129, K), gen, torch.float32)
    record = dataclasses.replace(record_guidance(rollout, fmt), valid=torch.rand(2, 129, generator=gen) < 0.9)
    trainer = perturbed(rollout, gen).bfloat16()
    assert_same_bits(fake_quantize(trainer.cuda(), fmt, to_device(record, "cuda")),
                     guided_quantize(trainer, record, fmt).bfloat16())


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_guided_reads_records_packed_per_token(fmt, device, gen):
    """Records as the engine hands them over: views into one byte row per token (every site at its offset),
    so scales, global scales and bits all have a row stride of the token's bytes."""
    from trace_rl.engine.guidance import Site, _align4, record_into

    K, heads, tokens = 192, 1, 2 * 9
    block = 16 if fmt == "nvfp4:row" else 32
    g = _align4(16 + K // block) if fmt == "nvfp4:row" else None
    bits = _align4((g + 4) if g is not None else 16 + K // block)
    site = Site("s", fmt, K, heads, 16, g, bits, _align4(bits + K // 8))
    rollout = torch.randn(2, 9, K, generator=gen)
    buf = torch.zeros(tokens, site.end + 8, dtype=torch.uint8)
    record_into(buf, torch.arange(tokens), rollout, site)
    views = site.views(buf.view(2, 9, -1))
    record = GuidanceRecord(views["scales"], views.get("global_scale"), views["bits"],
                            torch.rand(2, 9, generator=gen) < 0.8)
    assert record.scales.stride(-2) == buf.shape[1]
    trainer = perturbed(rollout, gen).bfloat16()
    assert_same_bits(fake_quantize(trainer.to(device), fmt, to_device(record, device)),
                     guided_quantize(trainer, record, fmt).bfloat16())
