"""The Hopper FP4 layout (trace_rl/kernels/hopper_fp4.py): a pure re-arrangement of the reference QTensor,
its bit placement decodes with the kernel's shift/mask sequence, and the Triton decode (pure twin on CPU,
inline PTX on the GPU) and re-layout kernel agree with the torch reference bit for bit."""

import pytest
import torch

from trace_rl.formats import QTensor, get_format
from trace_rl.kernels.hopper_fp4 import MASK, _place_bits, dequantize, from_hopper, to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _rotr(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x >> r) | (x << (32 - r))) & 0xFFFFFFFF


def _decode_words(words: torch.Tensor) -> torch.Tensor:
    """The kernel's decode in torch (int64 arithmetic): words -> [..., 8] bf16 bit patterns, slot order."""
    x = words.to(torch.int64) & 0xFFFFFFFF
    a = x & MASK
    b = _rotr(x, 4) & MASK
    c = _rotr(x, 10) & MASK
    d = (_rotr(x, 6) & 0x81808180) | (_rotr(x, 14) & 0x00400040)
    return torch.stack([h for p in (a, b, c, d) for h in (p & 0xFFFF, p >> 16)], dim=-1)


def test_bit_placement_decodes_every_code_in_every_slot(gen):
    """Each of the 8 slots of a word, holding each of the 16 codes among random neighbours, decodes to the
    bf16 pattern sign << 15 | index << 6 (= E2M1 value x 2**-126) and nothing leaks between slots."""
    n = 16 * 8 * 64
    codes = torch.randint(0, 16, (n, 8), generator=gen, dtype=torch.uint8)
    slot = torch.arange(n) // (16 * 64) % 8
    codes[torch.arange(n), slot] = (torch.arange(n) // 64 % 16).to(torch.uint8)
    out = _decode_words(_place_bits(codes))
    c = codes.to(torch.int64)
    assert torch.equal(out, ((c >> 3) << 15) | ((c & 7) << 6))


def _quantized(fmt: str, n: int, k: int, gen) -> QTensor:
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen) * 2)
    w[1, 3] = float("nan")                                   # a NaN block
    w[2, : k // 2] = 0.0                                     # zero blocks
    return get_format(fmt).quantize(w)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", [(40, 96), (16, 128), (33, 416)])
def test_layout_round_trips_bit_for_bit(fmt, n, k, gen):
    if fmt == "mxfp4" and k % 32:
        k = 128
    q = _quantized(fmt, n, k, gen)
    h = to_hopper(q)
    assert h.values.shape == (-(-n // 16), 2 * (-(-k // 128) * 128))
    back = from_hopper(h)
    assert torch.equal(back.codes, q.codes)
    assert torch.equal(back.scales.view(torch.uint8), q.scales.view(torch.uint8))
    if fmt == "nvfp4":
        assert torch.equal(back.global_scale.reshape(()), q.global_scale.reshape(()))


def _all_codes_all_scales(fmt: str, global_scale: float = 1.0) -> QTensor:
    """256 rows (one per scale byte, every block of the row) x 128 columns cycling through the 16 codes."""
    G = 16 if fmt == "nvfp4" else 32
    c = torch.arange(16, dtype=torch.uint8).repeat(8)[None, :].expand(256, 128)
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
    sb = torch.arange(256, dtype=torch.uint8)[:, None].expand(256, 128 // G).contiguous()
    if fmt == "nvfp4":
        return QTensor(packed, sb.view(torch.float8_e4m3fn), torch.tensor(global_scale), (256, 128), torch.float32,
                       fmt)
    return QTensor(packed, sb, None, (256, 128), torch.float32, fmt)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_layout_values_equal_reference_for_all_codes_and_scale_bytes(fmt):
    """Every E2M1 code under every scale byte (E4M3 incl. subnormals, negatives, NaN; E8M0 incl. 0 and NaN):
    the layout's decoded value x row factor is the reference dequantization, bit for bit (global scale a
    power of two; otherwise one float32 rounding apart)."""
    for g in (1.0, 2.0**-10):
        q = _all_codes_all_scales(fmt, g)
        assert _same(dequantize(to_hopper(q)), q.dequantize())


def _check_relayout(q: QTensor, device) -> None:
    """The Triton re-layout of q on `device` = `to_hopper(q)`, bit for bit (words, scales, row factors)."""
    from trace_rl.kernels.fp4_relayout import relayout

    ref = to_hopper(q)
    got = relayout(q.to(device))
    assert torch.equal(got.values.cpu(), ref.values)
    assert torch.equal(got.scales.cpu(), ref.scales)
    assert torch.equal(got.row_factor.cpu().view(torch.int32), ref.row_factor.view(torch.int32))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_relayout_kernel_matches_torch_reference(fmt, device, gen):
    """The Triton re-layout (weight sync on GPU) = `to_hopper`, on edge scales and a ragged shape."""
    q = _quantized(fmt, 40, 288 if fmt == "nvfp4" else 256, gen)
    s = q.scales.view(torch.uint8).clone()
    if fmt == "nvfp4":
        s[5, 2], s[6, 1], s[7, 0], s[8, 3] = 0x85, 0x80, 0x00, 0x03     # negative, -0, zero, subnormal
        q = QTensor(q.codes, s.view(torch.float8_e4m3fn), q.global_scale, q.shape, q.dtype, fmt)
    else:
        s[9, :], s[10, 0], s[10, 1] = 0, 254, 1                          # all-zero row; widest spread
        q = QTensor(q.codes, s, None, q.shape, q.dtype, fmt)
    _check_relayout(q, device)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gemm_decode_is_bit_exact_on_all_codes_and_scales(fmt, device):
    """y = I @ W^T through the GEMM returns every decoded weight: equal to the reference bit for bit (NaN
    scale rows all NaN). On CPU this runs the pure-integer decode in the interpreter; the GPU tests run both
    decodes (test_fp4_gemm.py)."""
    from trace_rl.kernels.fp4_gemm import GemmConfig, fp4_matmul

    q = _all_codes_all_scales(fmt)
    h = to_hopper(q.to(device)) if device == "cpu" else __import__(
        "trace_rl.kernels.fp4_relayout", fromlist=["relayout"]).relayout(q.to(device))
    eye = torch.eye(128, dtype=torch.bfloat16, device=device)
    ref = q.dequantize().T
    for decode in (0,) if device == "cpu" else (0, 1):     # pure twin; on sm_90 also the inline PTX
        y = fp4_matmul(eye, h, out_dtype=torch.float32, config=GemmConfig(64, 128, 128, 1, decode=decode))
        assert _same(y.cpu(), ref), f"decode mode {decode}"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_relayout_kernel_splits_k(fmt, device, gen):
    """K over several programs (fp4_relayout.KC chunks of 128 each) and not a multiple of 128: each program's
    columns, and mxfp4's row exponent / NaN flag taken over the whole row (a NaN block in another program's
    columns, an all-NaN row, the largest exponent in the last program's columns)."""
    from trace_rl.kernels.fp4_relayout import KC

    k = 1040 if fmt == "nvfp4" else 1056
    assert k > 128 * KC
    q = _quantized(fmt, 19, k, gen)
    if fmt == "mxfp4":
        s = q.scales.clone()
        s[2, -1] = 200                      # the row's top exponent in the last program's columns
        s[3, 1] = 255                       # a NaN block in the first program's columns
        s[4, :] = 255                       # an all-NaN row
        q = QTensor(q.codes, s, None, q.shape, q.dtype, fmt)
    _check_relayout(q, device)


def test_relayout_copies_misaligned_codes(monkeypatch, device, gen):
    """Contiguous codes at an odd byte offset (a view into a flat buffer): the kernel's 4-byte code loads
    (`tl.multiple_of(..., 4)`, not checked at launch) get an aligned copy, and the layout is unchanged."""
    import trace_rl.kernels.fp4_relayout as fr

    q = _quantized("nvfp4", 19, 160, gen)
    codes = torch.empty(q.codes.numel() + 1, dtype=torch.uint8, device=device)[1:].view(q.codes.shape)
    codes.copy_(q.codes)
    assert codes.is_contiguous() and codes.data_ptr() % 4
    seen, kernel = [], fr._relayout_kernel

    class Launch:   # the real kernel, recording where its codes are
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(a[0].data_ptr() % 4) or kernel[grid](*a, **kw)

    monkeypatch.setattr(fr, "_relayout_kernel", Launch())
    q_dev = q.to(device)
    got = fr.relayout(QTensor(codes, q_dev.scales, q_dev.global_scale, q.shape, q.dtype, q.format))
    ref = to_hopper(q)
    assert seen == [0]
    assert torch.equal(got.values.cpu(), ref.values) and torch.equal(got.scales.cpu(), ref.scales)
    assert torch.equal(got.row_factor.cpu().view(torch.int32), ref.row_factor.view(torch.int32))
