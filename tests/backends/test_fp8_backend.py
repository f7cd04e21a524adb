"""fp8 backend on any machine: emulated numerics equal the formats' reference; the path guards.

`TRACE_RL_TEST_BACKEND=fp8` (tox env `fp8`) selects these with the rest of the backend-parametrized
tests; they run everywhere (no marker), the GPU paths are in test_fp8_gpu.py.
"""

import logging

import pytest
import torch

from trace_rl.backends import QuantLinear, get_backend, te_adapter
from trace_rl.backends.fp8 import FP8Backend, FP8Config, FP8PathError, weight_format
from trace_rl.config import ConfigError, undocumented_fields
from trace_rl.formats import get_format, per_token

CPU = torch.device("cpu")
W8A8 = [("fp8_e4m3:row", "fp8_e4m3:row"), ("fp8_e4m3:tensor", "fp8_e4m3:tensor"),
        ("fp8_e4m3:block", "fp8_e4m3:block"), ("fp8_e5m2:row", "fp8_e5m2:row"),
        ("fp8_e4m3:row", "bf16")]


def _reference_linear(x, w, w_fmt, act_fmt):
    """float64 matmul of the codes decoded by hand (code value * expanded scale), independent of the backend."""
    fw = get_format(weight_format(w_fmt))
    qw = fw.quantize(w)
    wd = qw.codes.double() * fw.expand_scales(qw.scales, qw.shape).double()
    xd = x.double()
    if act_fmt != "bf16":
        fa = get_format(per_token(act_fmt))
        qa = fa.quantize(x)
        xd = qa.codes.double() * fa.expand_scales(qa.scales, qa.shape).double()
    return xd @ wd.T


@pytest.mark.parametrize("w_fmt,act_fmt", W8A8)
def test_emulated_linear_equals_the_formats_reference(w_fmt, act_fmt):
    torch.manual_seed(hash((w_fmt, act_fmt)) % 2**31)
    n, k, m = 128 * 3, 128 * 2, 7  # odd token count; block formats need multiples of 128
    x, w = torch.randn(2, m, k) * 3, torch.randn(n, k) * 0.05
    backend = FP8Backend(FP8Config(impl="emulated"))
    packed = backend.prepare_weight(w, w_fmt)
    ref_q = get_format(weight_format(w_fmt)).quantize(w)
    assert torch.equal(packed.q.codes.view(torch.uint8), ref_q.codes.view(torch.uint8))
    y = backend.linear(x, packed, act_fmt)
    ref = _reference_linear(x.reshape(-1, k), w, w_fmt, act_fmt).reshape(2, m, n)
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < 1e-6, f"emulation differs from the reference by {rel:.2e} (only float32 accumulation may)"
    assert backend.paths.summary() == {"fp8.emulated": 1}
    # and the quantization actually happened: FP8 is far from the unquantized product
    exact = x.double() @ w.double().T
    assert ((y.double() - exact).norm() / exact.norm()).item() > 1e-3


def test_quant_linear_runs_through_the_shared_fp8_backend_and_reports_it():
    torch.manual_seed(1)
    w = torch.randn(48, 80)
    ql = QuantLinear(w, "fp8_e4m3:row", "fp8_e4m3:row")
    y = ql(torch.randn(5, 80))
    assert y.shape == (5, 48)
    assert get_backend("fp8").paths.last in ("fp8.emulated", "fp8.scaled_mm.rowwise", "fp8.te.block")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU guard behaviour")
@pytest.mark.parametrize("backend", [FP8Backend(FP8Config(impl="te")), get_backend("fp8_te")])
def test_asking_for_te_where_it_cannot_run_is_an_error_naming_the_probe_reason(backend):
    reason = te_adapter.probe().reason
    assert reason
    packed = backend.prepare_weight(torch.randn(128, 128), "fp8_e4m3:block")
    with pytest.raises(FP8PathError) as err:
        backend.linear(torch.randn(3, 128), packed, "fp8_e4m3:block")
    msg = str(err.value)
    assert reason in msg and "allow_fallback" in msg
    avail = backend.available(CPU)
    assert not avail.ok and reason in avail.reason
    assert backend.fallbacks == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU guard behaviour")
def test_scaled_mm_on_cpu_is_an_error_naming_the_reason():
    backend = FP8Backend(FP8Config(impl="scaled_mm"))
    packed = backend.prepare_weight(torch.randn(32, 64), "fp8_e4m3:row")
    with pytest.raises(FP8PathError, match="no CUDA GPU"):
        backend.linear(torch.randn(3, 64), packed, "fp8_e4m3:row")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU guard behaviour")
def test_an_allowed_fallback_runs_is_logged_and_recorded(caplog):
    backend = FP8Backend(FP8Config(impl="te", allow_fallback=True))
    packed = backend.prepare_weight(torch.randn(64, 128), "fp8_e4m3:row")
    x = torch.randn(5, 128)
    with caplog.at_level(logging.WARNING, logger="trace_rl.backends.fp8"):
        y1 = backend.linear(x, packed, "fp8_e4m3:row")
        y2 = backend.linear(x, packed, "fp8_e4m3:row")
    assert torch.equal(y1, y2)
    assert len(backend.fallbacks) == 1, "recorded once per call shape, not per call"
    fb = backend.fallbacks[0]
    assert (fb.wanted, fb.used) == ("te", "emulated")
    assert fb.reason == te_adapter.probe().reason
    assert [r for r in caplog.records if "FALLBACK te -> emulated" in r.getMessage()]
    assert backend.metrics() == {"fp8/path/fp8.emulated": 2.0, "fp8/fallbacks": 1.0}
    assert backend.available(CPU).path == "fp8.emulated"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU guard behaviour")
def test_auto_records_its_choice_without_calling_it_a_fallback():
    backend = FP8Backend()
    packed = backend.prepare_weight(torch.randn(16, 32), "fp8_e4m3:row")
    backend.linear(torch.randn(2, 32), packed, "fp8_e4m3:row")
    assert backend.fallbacks == []
    assert set(backend.skipped) == {"te", "scaled_mm"}
    assert backend.skipped["scaled_mm"] == "no CUDA GPU"
    assert backend.paths.last == "fp8.emulated"


def test_emulated_never_falls_back_and_never_fails():
    backend = FP8Backend(FP8Config(impl="emulated"))
    assert backend.available(CPU) == backend.available(CPU)
    assert backend.available(CPU).ok and backend.available(CPU).path == "fp8.emulated"


def test_config_is_strict_documented_and_round_trips():
    assert undocumented_fields(FP8Config) == []
    cfg = FP8Config(impl="te", te_recipe="current", allow_fallback=True)
    assert FP8Config.from_yaml(cfg.to_yaml()) == cfg
    assert FP8Config.from_toml(cfg.to_toml()) == cfg
    with pytest.raises(ConfigError, match="te_recipe"):
        FP8Config.parse({"te_recipe": "mxfp8"})
    with pytest.raises(ConfigError, match="unknown key"):
        FP8Config.parse({"impl": "te", "fallback": True})


def test_configure_switches_the_shared_backend_and_forgets_cached_choices():
    backend = FP8Backend()
    packed = backend.prepare_weight(torch.randn(16, 32), "fp8_e4m3:row")
    backend.linear(torch.randn(2, 32), packed, "fp8_e4m3:row")
    backend.configure(FP8Config(impl="emulated"))
    assert backend._choices == {}
    backend.linear(torch.randn(2, 32), packed, "fp8_e4m3:row")
    assert backend.paths.counts["fp8.emulated"] >= 1


def test_fp8_backend_rejects_fp4_activations():
    backend = FP8Backend(FP8Config(impl="emulated"))
    packed = backend.prepare_weight(torch.randn(16, 32), "fp8_e4m3:row")
    with pytest.raises(ValueError, match="bf16 or fp8"):
        backend.linear(torch.randn(2, 32), packed, "nvfp4")


def test_nan_stays_nan_through_the_emulated_linear():
    backend = FP8Backend(FP8Config(impl="emulated"))
    packed = backend.prepare_weight(torch.randn(16, 32), "fp8_e4m3:row")
    x = torch.randn(3, 32)
    x[1, 4] = float("nan")
    y = backend.linear(x, packed, "fp8_e4m3:row")
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


def _cpu_scaled_mm_runs() -> bool:
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, ValueError, NotImplementedError):
        return False


@pytest.mark.skipif(not _cpu_scaled_mm_runs(), reason="this torch has no CPU _scaled_mm (rowwise)")
@pytest.mark.parametrize("w_fmt", ["fp8_e4m3:row", "fp8_e4m3:tensor"])
def test_scaled_mm_rowwise_call_matches_emulation_where_torch_runs_it_on_cpu(w_fmt):
    """The GPU path's scale layouts and reshapes, exercised through torch's CPU _scaled_mm (torch >= 2.13)."""
    from trace_rl.backends import fp8_scaled_mm
    from trace_rl.backends.fp8 import emulated_linear

    torch.manual_seed(2)
    x, w, bias = torch.randn(2, 3, 96).bfloat16(), torch.randn(80, 96) * 0.1, torch.randn(80)
    packed = FP8Backend(FP8Config(impl="emulated")).prepare_weight(w, w_fmt)
    y = fp8_scaled_mm.linear(x, packed, "fp8_e4m3:row", bias)
    ref = emulated_linear(x.float(), packed, "fp8_e4m3:row", bias)
    assert y.shape == (2, 3, 80) and y.dtype == torch.bfloat16
    assert ((y.float() - ref).norm() / ref.norm()).item() < 4e-3
