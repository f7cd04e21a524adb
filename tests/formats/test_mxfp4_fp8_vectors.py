"""MXFP4 and FP8 codes and scales from hand-worked vectors."""

import pytest
import torch

from trace_rl.formats import get_format, unpack_nibbles

MX = get_format("mxfp4")


def test_mxfp4_hand_worked():
    # block 1: amax 6 -> floor(log2 6) = 2 -> exponent 0 (code 127) -> plain E2M1 rounding.
    b1 = [6.0, 0.25, 0.75, -2.5, 5.0] + [0.0] * 27
    c1 = [7, 0, 2, 12, 6] + [0] * 27
    # block 2: amax 1 -> exponent -2 (code 125), step .25: 1 -> 4 (6); .3 -> 1.2 -> 1 (2);
    #   .375 -> 1.5 (3); -0.0625 -> -.25 -> tie -> -0 (8)
    b2 = [1.0, 0.3, 0.375, -0.0625] + [0.0] * 28
    c2 = [6, 2, 3, 8] + [0] * 28
    # block 3: amax 7 -> exponent 0 -> 7 saturates to 6 (7); 3.9 -> 4 (6)
    b3 = [7.0, 3.9] + [0.0] * 30
    c3 = [7, 6] + [0] * 30
    # block 4: zeros -> exponent -127 (code 0)
    b4 = [0.0] * 32
    q = MX.quantize(torch.tensor([b1 + b2 + b3 + b4]))
    assert q.scales.tolist() == [[127, 125, 127, 0]]
    assert unpack_nibbles(q.codes).tolist() == [c1 + c2 + c3 + [0] * 32]
    deq = MX.dequantize(q)[0]
    assert deq[32:36].tolist() == [1.0, 0.25, 0.375, 0.0]
    assert deq[64].item() == 6.0


def test_mxfp4_exponent_clamps():
    tiny = torch.tensor([[2.0**-140] + [0.0] * 31])   # floor(log2) - 2 = -142 -> clamped to -127
    q = MX.quantize(tiny)
    assert q.scales.tolist() == [[0]]
    assert unpack_nibbles(q.codes)[0, 0].item() == 0   # 2^-140 / 2^-127 = 2^-13 -> 0
    big = torch.tensor([[2.0**100] + [0.0] * 31])
    q = MX.quantize(big)
    assert q.scales.tolist() == [[127 + 98]]
    assert MX.dequantize(q)[0, 0].item() == 2.0**100


def test_fp8_hand_worked():
    x = torch.tensor([[896.0, 3.0, 0.0, -1.0], [1.0, 1.0625, 1.1875, -448.0]])
    q = get_format("fp8_e4m3:row").quantize(x)
    # row 0: scale 896/448 = 2 -> [448, 1.5, 0, -0.5]; row 1: scale 1 -> 1.0625 is a tie between 1 and
    # 1.125 -> even mantissa -> 1.0; 1.1875 is a tie between 1.125 and 1.25 -> 1.25.
    assert q.scales.flatten().tolist() == [2.0, 1.0]
    assert q.codes.float().tolist() == [[448.0, 1.5, 0.0, -0.5], [1.0, 1.0, 1.25, -448.0]]
    qt = get_format("fp8_e4m3:tensor").quantize(x)
    assert qt.scales.item() == 2.0
    q5 = get_format("fp8_e5m2:row").quantize(torch.tensor([[57344.0, 1.1, 3.0]]))
    # e5m2: 2 mantissa bits: 1.1 -> 1.0; 3.0 exact
    assert q5.codes.float().tolist() == [[57344.0, 1.0, 3.0]]


def test_fp8_block_scales():
    x = torch.zeros(2, 256)
    x[0, 0], x[0, 128], x[1, 5] = 448.0, 896.0, 44.8
    q = get_format("fp8_e4m3:block").quantize(x)
    assert q.scales.tolist() == [[1.0, 2.0], [(torch.tensor(44.8) / 448).item(), 1.0]]  # float32 division
    w = torch.zeros(256, 128)
    w[0, 0], w[200, 3] = 4480.0, 1.0
    qw = get_format("fp8_e4m3:block128x128").quantize(w)
    assert qw.scales.tolist() == [[10.0], [(torch.tensor(1.0) / 448).item()]]


@pytest.mark.parametrize("name,k", [("nvfp4", 20), ("mxfp4", 48), ("fp8_e4m3:block", 100)])
def test_last_dim_not_multiple_of_block_is_an_error(name, k):
    with pytest.raises(ValueError, match="multiple of"):
        get_format(name).quantize(torch.randn(3, k))


def test_unknown_format_lists_allowed():
    with pytest.raises(ValueError, match="allowed: bf16"):
        get_format("fp5")
