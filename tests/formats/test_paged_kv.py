"""PagedKV's storage layout (formats/kv_layout.py): a pure permutation of the reference codes plus bijective
scale-byte encodings, bit-exact round trips, and the decoded scale values the kernel builds."""

import pytest
import torch

from trace_rl.formats import get_format
from trace_rl.formats import kv_layout as L
from trace_rl.formats.paged_kv import KV_FORMATS, PagedKV, default_block_size
from trace_rl.formats.registry import per_token

QUANTIZED = [f for f in KV_FORMATS if f != "bf16"]


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    g.seed()
    return g


def _u8(t):
    return None if t is None else (t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.uint8) else t)


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("role", ["k", "v"])
@pytest.mark.parametrize("S,D", [(16, 32), (64, 128), (48, 256)])
def test_store_then_fields_is_the_reference_quantization(fmt, role, S, D, gen):
    P, H = 2, 2
    cache = PagedKV.allocate(fmt, P, S, H, D, role=role)
    T = P * S - 5                                                       # partial page
    slots = torch.randperm(P * S, generator=gen)[:T]
    x = (torch.randn(T, H, D, generator=gen) * torch.exp(torch.randn(T, H, 1, generator=gen) * 3)).to(torch.bfloat16)
    x[0, 0, :7] = 0
    x[1] = 0
    cache.write_reference(slots, x)
    q = get_format(per_token(fmt)).quantize(x)
    got = cache.fields(slots)
    assert torch.equal(_u8(got.codes), _u8(q.codes))
    assert torch.equal(_u8(got.scales).reshape(q.scales.shape), _u8(q.scales))
    if q.global_scale is not None:
        assert torch.equal(got.global_scale, q.global_scale)
    assert torch.equal(cache.read_reference(slots), q.dequantize().to(torch.bfloat16))
    u = cache.unshuffle()
    page, row = slots // S, slots % S
    assert torch.equal(_u8(u.codes)[page, row], _u8(q.codes))


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("role", ["k", "v"])
def test_layout_is_a_permutation(fmt, role, gen):
    """Random storage bytes -> reference fields -> storage again gives the same bytes (every stored code
    belongs to exactly one (token, dim); V^T padding rows stay zero)."""
    P, S, H, D = 2, 32, 2, 64 if role == "k" else 128
    a = PagedKV.allocate(fmt, P, S, H, D, role=role)
    a.codes.copy_(torch.randint(0, 256, a.codes.shape, generator=gen, dtype=torch.uint8))
    if fmt == "fp8_e4m3":
        a.codes.bitwise_and_(0x77)                                     # no NaN codes (they flag the row)
        a.scales.copy_(torch.rand(a.scales.shape, generator=gen) + 0.1)
    else:
        enc = L.encode_scales(per_token(fmt), torch.arange(127 if fmt == "nvfp4" else 254))
        a.scales.copy_(enc[torch.randint(0, len(enc), a.scales.shape, generator=gen)])
        if a.global_scale is not None:
            a.global_scale.copy_(torch.rand(a.global_scale.shape, generator=gen))
    slots = torch.arange(P * S)
    b = PagedKV.allocate(fmt, P, S, H, D, role=role)
    b.store(slots, a.fields(slots))
    for name in ("codes", "scales", "global_scale"):
        x, y = getattr(a, name), getattr(b, name)
        assert x is None or torch.equal(x, y), name


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_scale_encoding_is_bijective_and_decodes_exactly(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    stored = L.encode_scales(fmt, codes)
    assert torch.equal(torch.sort(stored).values, codes)                # a permutation of the bytes
    assert torch.equal(L.decode_scales(fmt, stored), codes)
    value = L.stored_scale_value(fmt, stored)
    if fmt == "nvfp4:row":                                             # bf16 = scale * 2**119 (scale >= 0)
        want = codes[:127].view(torch.float8_e4m3fn).float() * 2.0 ** 119
        assert torch.equal(value[:127], want)                          # zero decodes to -0.0
        assert value[127].isnan()                                      # 0x7F: NaN
    else:                                                              # bf16 = 2**(code - 126)
        want = torch.ldexp(torch.ones(254), torch.arange(254) - 126)
        assert torch.equal(value[:254], want)
        assert value[255].isinf()                                      # NaN blocks store zero codes: 0 * Inf


def test_geometry_errors():
    with pytest.raises(ValueError, match="multiple of 16"):
        PagedKV.allocate("nvfp4", 2, 8, 1, 64)
    with pytest.raises(ValueError, match="head_dim"):
        PagedKV.allocate("mxfp4", 2, 16, 1, 48)
    with pytest.raises(ValueError, match="role"):
        PagedKV.allocate("nvfp4", 2, 16, 1, 64, role="q")
    assert default_block_size("nvfp4") == 64 and default_block_size("bf16") == 16


def test_nan_block_has_zero_codes_and_nan_values(gen):
    for fmt in QUANTIZED:
        c = PagedKV.allocate(fmt, 1, 16, 1, 64, role="v")
        x = torch.randn(2, 1, 64, generator=gen)
        x[1, 0, 40] = float("nan")
        c.write_reference(torch.tensor([3, 9]), x)
        back = c.read_reference(torch.tensor([3, 9])).float()
        assert back[1, 0, 40].isnan() and not back[0].isnan().any()
        if fmt != "fp8_e4m3":                                          # the NaN block only
            G = 16 if fmt == "nvfp4" else 32
            start = 40 // G * G
            assert back[1, 0, start:start + G].isnan().all() and not back[1, 0, :start].isnan().any()
