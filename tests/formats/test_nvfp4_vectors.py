"""NVFP4 codes and scales pinned down by hand-worked vectors (values chosen so each case is checkable on paper)."""

import torch

from trace_rl.formats import get_format, unpack_nibbles

NVFP4 = get_format("nvfp4")


def test_hand_worked_blocks():
    # Tensor amax 2688 = 6 * 448, so the global scale is exactly 1.0.
    block_a = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.1, 0.26, -1.6, 2.9, 0.74, 4.5, 5.5, -6.0]
    # block_a: amax 6 -> scale (6/6)/1 = 1 -> codes are plain E2M1 roundings:
    #   ties to even: .25->0, .75->1(idx2), 1.25->1(idx2), 1.75->2(idx4), 2.5->2(idx4), 3.5->4(idx6), 5->4(idx6)
    #   -0.1 -> -0 (code 8), .26->.5, -1.6->-1.5 (8|3), 2.9->3 (5), .74->.5, 4.5->4 (6), 5.5->6 (7), -6 (8|7)
    codes_a = [0, 2, 2, 4, 4, 6, 6, 7, 8, 1, 11, 5, 1, 6, 7, 15]
    # block_b: amax 2688 -> scale 448 -> step 448: 2688->6, 1120 (=2.5 steps, tie)->2, 112 (.25, tie)->0,
    #   -336 (-.75, tie) -> -1 (8|2), -0.0 -> code 8, 448*1.5 -> 1.5 (3), rest 0.
    block_b = [2688.0, 1120.0, 112.0, -336.0, -0.0, 672.0] + [0.0] * 10
    codes_b = [7, 4, 0, 10, 8, 3] + [0] * 10
    # block_c: amax 0.01 -> (0.01/6)/1 = 0.001667 -> E4M3 subnormal: rounds to 2^-9 = 0.001953125.
    #   0.01/2^-9 = 5.12 -> 6 (7); 0.005/2^-9 = 2.56 -> 3 (5); 0.001/2^-9 = 0.512 -> 0.5 (1).
    block_c = [0.01, 0.005, 0.001] + [0.0] * 13
    codes_c = [7, 5, 1] + [0] * 13
    # block_d: all zeros -> scale 0, codes 0.  block_e: amax 1e-4 -> scale 1.7e-5 underflows E4M3 -> 0:
    #   every element quantizes to (signed) zero.
    block_d = [0.0] * 16
    block_e = [1e-4, -1e-4] + [0.0] * 14
    codes_e = [0, 8] + [0] * 14
    x = torch.tensor([block_a + block_b + block_c + block_d + block_e])
    q = NVFP4.quantize(x)
    assert q.global_scale.item() == 1.0
    assert q.scales.float().tolist() == [[1.0, 448.0, 2.0**-9, 0.0, 0.0]]
    assert q.scales.view(torch.uint8).tolist() == [[0x38, 0x7E, 0x01, 0x00, 0x00]]
    assert unpack_nibbles(q.codes).tolist() == [codes_a + codes_b + codes_c + [0] * 16 + codes_e]
    # packing: element 2i in the low nibble: (0, 2) -> 0x20, (2, 4) -> 0x42
    assert q.codes[0, :2].tolist() == [0x20, 0x42]
    deq = NVFP4.dequantize(q)[0]
    assert deq[:8].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    assert deq[16:20].tolist() == [2688.0, 896.0, 0.0, -448.0]
    assert torch.signbit(deq[8]) and deq[8] == 0  # negative zero survives


def test_global_scale_and_saturation():
    # amax 5376 -> global 2.0; a block with amax 12 -> (12/6)/2 = 1.0; 11 -> 5.5 -> 6 (7); 9.9 -> 4.95 -> 4 (6)
    x = torch.tensor([[5376.0] + [0.0] * 15 + [12.0, 11.0, 9.9, -12.0] + [0.0] * 12])
    q = NVFP4.quantize(x)
    assert q.global_scale.item() == 2.0
    assert q.scales.float().tolist() == [[448.0, 1.0]]
    assert unpack_nibbles(q.codes)[0, 16:20].tolist() == [7, 7, 6, 15]


def test_scale_rounding_saturates_elements():
    # block amax 6.5 with global 1 (tensor amax 2688 elsewhere): scale 6.5/6 = 1.0833 -> E4M3 rounds to 1.125
    # (3 mantissa bits: 1.0, 1.125; 1.0833 is nearer 1.125). 6.5/1.125 = 5.78 -> 6.
    x = torch.tensor([[2688.0] + [0.0] * 15 + [6.5, 3.0] + [0.0] * 14])
    q = NVFP4.quantize(x)
    assert q.scales.float()[0, 1].item() == 1.125
    # 3/1.125 = 2.667 -> 3 (code 5)
    assert unpack_nibbles(q.codes)[0, 16:18].tolist() == [7, 5]


def test_row_global_scale_is_per_row():
    rows = torch.tensor([[2688.0] + [1.0] * 15, [6.0] + [1.0] * 15])
    q = get_format("nvfp4:row").quantize(rows)
    assert q.global_scale.flatten().tolist() == [1.0, (torch.tensor(6.0) / 2688).item()]  # float32 division
    # second row: scale (6/6)/(6/2688) = 448 -> step 6/2688*448 = 1.0 -> 1.0 is code 2
    assert unpack_nibbles(q.codes)[1, :2].tolist() == [7, 2]
