"""NaN/Inf handling: a NaN never silently becomes a finite value."""

import math

import pytest
import torch

from trace_rl.formats import get_format


@pytest.mark.parametrize("name,block", [("nvfp4", 16), ("nvfp4:row", 16), ("mxfp4", 32)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_fp4_bad_block_is_nan_others_unaffected(name, block, bad):
    fmt = get_format(name)
    x = torch.randn(2, 4 * block)
    x[0, 0] = 100.0                 # the tensor amax sits in a finite block
    x[0, block + 3] = bad           # poison block 1 of row 0
    deq = fmt.dequantize(fmt.quantize(x))
    assert torch.isnan(deq[0, block:2 * block]).all()
    clean = x.clone()
    clean[0, block:2 * block] = 0.0
    ref = fmt.dequantize(fmt.quantize(clean))
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[0, block:2 * block] = False
    assert torch.equal(deq[keep], ref[keep])


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
def test_fp8_nonfinite(scaling):
    x = torch.randn(2, 128)
    x[0, 1], x[0, 2], x[1, 3] = float("nan"), float("inf"), float("-inf")
    e4 = get_format(f"fp8_e4m3:{scaling}")
    d4 = e4.dequantize(e4.quantize(x))
    assert math.isnan(d4[0, 1]) and math.isnan(d4[0, 2]) and math.isnan(d4[1, 3])   # E4M3 has no Inf
    assert torch.isfinite(d4[0, 3:]).all()
    e5 = get_format(f"fp8_e5m2:{scaling}")
    d5 = e5.dequantize(e5.quantize(x))
    assert math.isnan(d5[0, 1]) and d5[0, 2] == float("inf") and d5[1, 3] == float("-inf")
    assert torch.isfinite(d5[0, 3:]).all()
