"""SQNR per format on Gaussian and heavy-tailed data (printed as a table with -s; thresholds are floors
a few dB under the values measured when the formats were written)."""

import pytest
import torch

from trace_rl.formats import get_format

# name -> (gaussian floor dB, heavy-tailed floor dB); measured at 4096x256: see the printed table.
FLOORS = {
    "nvfp4": (19.0, 17.0), "nvfp4:row": (19.0, 17.0), "mxfp4": (16.0, 14.0),
    "fp8_e4m3:row": (29.0, 25.0), "fp8_e4m3:block": (29.0, 27.0), "fp8_e5m2:row": (23.0, 20.0),
}


def sqnr_db(x, y):
    return (10 * torch.log10(x.pow(2).sum() / (x - y).pow(2).sum())).item()


def data(kind, g):
    x = torch.randn(4096, 256, generator=g)
    if kind == "heavy":  # Student t with 3 degrees of freedom
        chi2 = torch.randn(3, 4096, 256, generator=g).pow(2).sum(0)
        x = x / (chi2 / 3).sqrt()
    return x


@pytest.mark.parametrize("name", list(FLOORS))
def test_sqnr_floor(name, rng):
    fmt = get_format(name)
    got = []
    for kind, floor in zip(("gaussian", "heavy"), FLOORS[name]):
        x = data(kind, rng)
        s = sqnr_db(x, fmt.dequantize(fmt.quantize(x)))
        got.append(s)
        assert s >= floor, f"{name} on {kind} data: SQNR {s:.2f} dB < floor {floor} dB"
    print(f"\n{name:16s} gaussian {got[0]:6.2f} dB   heavy-tailed {got[1]:6.2f} dB   "
          f"bits/value {fmt.bits_per_value:.2f}")


def test_nvfp4_beats_mxfp4_on_gaussian(rng):
    x = data("gaussian", rng)
    nv, mx = get_format("nvfp4"), get_format("mxfp4")
    assert sqnr_db(x, nv.dequantize(nv.quantize(x))) > sqnr_db(x, mx.dequantize(mx.quantize(x))) + 1.0
