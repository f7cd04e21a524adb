"""The weight sync's fused path (`FP4Backend.quantize_into`: quantize + Hopper re-layout in one pass, in place)
against the generic one (quantize, copy into the buffers, re-derive the layout): the same codes, scales, global
scale and layout, bit for bit, written into the same tensors; and the fallback when no layout exists.

On CPU the fused kernel runs in Triton's interpreter: `fused_sync_runs` (the CUDA condition) is patched to say
yes for CPU tensors; `derive_layout` is patched to fail, so the layout can only have come from the fused kernel."""

import contextlib

import pytest
import torch

pytest.importorskip("triton", reason="the fused sync is a Triton kernel")

from trace_rl.backends import QuantLinear, get_backend  # noqa: E402
from trace_rl.backends.fp4 import FP4Backend  # noqa: E402
from trace_rl.backends.grouped_linear import GroupedQuantLinear  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = {"nvfp4": [(19, 160), (33, 272)], "mxfp4": [(19, 160), (40, 288)]}


@pytest.fixture
def fused(monkeypatch):
    """fused(True): the fused kernel runs on this device's tensors (the interpreter on CPU); fused(False): it does
    not (the generic path)."""
    return lambda on: monkeypatch.setattr(FP4Backend, "fused_sync_runs", lambda self, w: on)


@contextlib.contextmanager
def no_derive(monkeypatch):
    """Re-deriving a Hopper layout from q fails the test: a layout written in here came from the fused kernel."""
    import trace_rl.kernels.linear as linear

    def derive(q, out=None):
        raise AssertionError("the fused sync re-derived the Hopper layout from q")

    with monkeypatch.context() as m:
        m.setattr(linear, "derive_layout", derive)
        yield


def _weight(shape, gen):
    x = torch.randn(*shape, generator=gen) * torch.exp(2 * torch.randn(*shape[:-1], 1, generator=gen))
    x[..., 0, :16] = 0.0                     # an all-zero block
    return x


def _state(layer, layout):
    ts = [layer.w_codes, layer.w_scales.view(torch.uint8)] + ([] if layer.w_global_scale is None
                                                               else [layer.w_global_scale])
    return ts + [layout.values, layout.scales, layout.row_factor.view(torch.int32)]


class _OtherLayout:
    """A second kernel layout: the fused sync must re-derive it (it wrote only the Hopper one)."""

    def __init__(self):
        self.seen = []

    def refresh_from(self, q):
        self.seen.append(q.codes.clone())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("i", [0, 1])
def test_fused_sync_equals_generic_path_in_place(fmt, i, fused, monkeypatch):
    from trace_rl.kernels.linear import LAYOUT_KEY, hopper_weight

    gen = torch.Generator().manual_seed(100 + i)
    shape = SHAPES[fmt][i]
    w0, w1 = _weight(shape, gen), _weight(shape, gen)
    backend = get_backend("fp4")
    layers = {}
    for on in (False, True):
        fused(on)
        layer = QuantLinear(w0, fmt).to(DEVICE)
        h = hopper_weight(layer.packed)               # the layer ran once: its layout exists
        h.values.fill_(-1)                            # stale garbage: the sync must overwrite all of it
        h.scales.fill_(0x55)
        h.row_factor.fill_(7.0)
        other = layer.packed.layout["other"] = _OtherLayout()
        layer.packed.dequantized()                    # an emulation cache that must be dropped
        q = layer.packed.q
        assert q.codes is layer.w_codes and q.scales is layer.w_scales and q.global_scale is layer.w_global_scale
        ptrs = [t.data_ptr() for t in _state(layer, h)]
        with no_derive(monkeypatch) if on else contextlib.nullcontext():
            layer.load_weight(w1.to(DEVICE))
        assert backend.paths.last == ("fp4.sync.fused" if on else "fp4.sync.requantize")
        assert layer.packed.layout[LAYOUT_KEY] is h
        assert [t.data_ptr() for t in _state(layer, h)] == ptrs, "not in place"
        assert len(other.seen) == 1 and torch.equal(other.seen[0], layer.w_codes), "other layout not re-derived"
        assert "dequantized" not in layer.packed.cache
        layers[on] = (layer, h)
    (old, h_old), (new, h_new) = layers[False], layers[True]
    for j, (a, b) in enumerate(zip(_state(old, h_old), _state(new, h_new))):   # codes, scales, (global,) layout
        assert torch.equal(a.cpu(), b.cpu()), j
    fresh = QuantLinear(w1, fmt)                      # and both are the new weight's quantization
    assert torch.equal(new.w_codes.cpu(), fresh.w_codes)
    assert torch.equal(new.dequantized_weight().cpu(), fresh.dequantized_weight())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_sync_without_layout_takes_the_generic_path(fmt, fused):
    gen = torch.Generator().manual_seed(7)
    w0, w1 = _weight((17, 160), gen), _weight((17, 160), gen)
    fused(True)
    layer = QuantLinear(w0, fmt).to(DEVICE)
    layer.load_weight(w1.to(DEVICE))
    assert get_backend("fp4").paths.last == "fp4.sync.requantize"
    assert layer.packed.layout == {}
    fresh = QuantLinear(w1, fmt)
    assert torch.equal(layer.w_codes.cpu(), fresh.w_codes)
    assert torch.equal(layer.w_scales.cpu().view(torch.uint8), fresh.w_scales.view(torch.uint8))


@pytest.mark.parametrize("fmt,parts", [("nvfp4", 1), ("mxfp4", 1), ("mxfp4", 2), ("nvfp4", 2)])
def test_expert_sync_fused_equals_generic(fmt, parts, fused, monkeypatch):
    """Stacked experts: fused expert by expert into views of the buffers and the stacked layout; nvfp4 with
    per-part global scales (parts=2) has no single global per expert and takes the generic path."""
    import trace_rl.kernels.quantize_relayout as qr
    from trace_rl.kernels.linear import hopper_weight

    gen = torch.Generator().manual_seed(11)
    w0, w1 = _weight((3, 34, 160), gen), _weight((3, 34, 160), gen)
    expect = "fp4.sync.requantize" if (fmt, parts) == ("nvfp4", 2) else "fp4.sync.fused"
    states = {}
    for on in (False, True):
        fused(on)
        g = GroupedQuantLinear(w0, fmt, parts=parts).to(DEVICE)
        h = hopper_weight(g.stacked())
        h.values.fill_(-1)
        ptrs = [t.data_ptr() for t in (g.w_codes, g.w_scales, h.values, h.scales, h.row_factor)]
        with no_derive(monkeypatch) if on and expect == "fp4.sync.fused" else contextlib.nullcontext(), \
                monkeypatch.context() as m:
            if on and expect == "fp4.sync.fused":     # nvfp4: the experts' amaxes from one launch, none per expert
                m.setattr(qr, "weight_amax_bits", lambda w: (_ for _ in ()).throw(AssertionError("per-expert amax")))
            g.load_weight(w1.to(DEVICE))
        assert get_backend("fp4").paths.last == (expect if on else "fp4.sync.requantize")
        assert [t.data_ptr() for t in (g.w_codes, g.w_scales, h.values, h.scales, h.row_factor)] == ptrs
        gs = [] if g.w_global_scale is None else [g.w_global_scale]
        states[on] = [g.w_codes, g.w_scales.view(torch.uint8), *gs, h.values, h.scales,
                      h.row_factor.view(torch.int32)]
    for a, b in zip(states[False], states[True]):
        assert torch.equal(a.cpu(), b.cpu())
    fresh = GroupedQuantLinear(w1, fmt, parts=parts)
    assert torch.equal(states[True][0].cpu(), fresh.w_codes)


def test_weights_amax_one_launch_equals_per_weight(device=DEVICE):
    """`weights_amax_bits` (T tensors, one launch) = `weight_amax_bits` of each: sizes not multiples of the
    program's block, an empty tensor, NaN / Inf (finite amax), tensors before and after the first in memory."""
    from trace_rl.kernels.weight_quantize import AMAX_BLOCK, weight_amax_bits, weights_amax_bits, weights_amax_ok

    gen = torch.Generator().manual_seed(3)
    ws = [torch.randn(n, generator=gen) * s for n, s in
          [(AMAX_BLOCK + 24, 1.0), (0, 1.0), (104, 1e-3), (3 * AMAX_BLOCK, 7.0), (8, 1e30)]]
    ws[3][7] = float("inf")
    ws[3][AMAX_BLOCK + 3] = float("nan")
    ws[3][2 * AMAX_BLOCK + 1] = -1e4                 # the amax, in the third program of that tensor
    ws = [w.to(device) for w in ws]
    got = weights_amax_bits(ws)
    assert got.tolist() == [weight_amax_bits(w).item() for w in ws]
    assert got[3].view(torch.float32).item() == 1e4
    assert weights_amax_bits(ws[2:]).tolist() == got[2:].tolist()   # first tensor elsewhere: offsets both signs
    assert not weights_amax_ok(ws + [torch.zeros(12, device=device)])            # 16-byte loads: numel % 8
    assert not weights_amax_ok(ws + [torch.zeros(16, device=device)[2:10]])      # and aligned


def test_load_linear_weights_batches_the_amax(fused, monkeypatch):
    """`load_linear_weights`: nvfp4 layers on the fused path take their amaxes from one launch (the per-weight
    amax is made to fail), the rest load as before; every buffer and layout equals one-by-one `load_weight`."""
    import trace_rl.kernels.quantize_relayout as qr
    from trace_rl.backends.quant_linear import load_linear_weights
    from trace_rl.kernels.linear import hopper_weight

    gen = torch.Generator().manual_seed(5)
    spec = [("nvfp4", (19, 160), True), ("mxfp4", (16, 64), True), ("nvfp4", (33, 96), True),
            ("nvfp4", (16, 32), False), ("bf16", (8, 16), False)]      # (format, shape, layout derived)
    w0 = [_weight(s, gen) for _, s, _ in spec]
    w1 = [_weight(s, gen) for _, s, _ in spec]
    fused(True)
    runs = []
    for batched in (False, True):
        layers = [QuantLinear(w, f).to(DEVICE) for (f, _, _), w in zip(spec, w0)]
        for layer, (_, _, lay) in zip(layers, spec):
            if lay:
                hopper_weight(layer.packed)
        if batched:
            with monkeypatch.context() as m:
                m.setattr(qr, "weight_amax_bits", lambda w: (_ for _ in ()).throw(AssertionError("per-weight amax")))
                load_linear_weights([(layer, w.to(DEVICE), None) for layer, w in zip(layers, w1)])
        else:
            for layer, w in zip(layers, w1):
                layer.load_weight(w.to(DEVICE))
        runs.append([t.cpu() for layer in layers for t in layer.buffers() if t is not None]
                    + [t.cpu() for layer in layers for h in layer.packed.layout.values()
                       for t in (h.values, h.scales, h.row_factor)])
    assert len(runs[0]) == len(runs[1])
    for j, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a.view(torch.uint8) if a.dtype.is_floating_point and a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.dtype.is_floating_point and b.element_size() == 1 else b), j
