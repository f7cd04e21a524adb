"""TE adapter on any machine: the probe's structure and reasons, refusals, and that nothing imports TE early."""

import subprocess
import sys
import textwrap

import pytest
import torch

from trace_rl.backends import te_adapter
from trace_rl.backends.te_adapter import TEStatus, TEUnavailableError


@pytest.fixture
def fresh_probe():
    te_adapter.probe(refresh=True)
    yield
    te_adapter.probe(refresh=True)


def test_probe_reports_a_structured_status(fresh_probe):
    status = te_adapter.probe()
    assert isinstance(status, TEStatus)
    assert set(status.recipes) == set(te_adapter.TE_RECIPES + te_adapter.BLACKWELL_RECIPES)
    d = status.as_dict()
    assert set(d) == {"available", "reason", "version", "device_capability", "recipes"}
    if status.available:
        assert status.reason == "" and status.version and status.device_capability
    else:
        assert status.reason, "an unavailable TE must say why"
        assert status.supported_recipes() == () or not status.available
        for recipe in te_adapter.TE_RECIPES:
            assert status.why_not(recipe) == status.reason
    assert te_adapter.probe() is status, "the probe is cached"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only reason")
def test_probe_without_gpu_or_te_names_the_cause(fresh_probe):
    status = te_adapter.probe()
    assert not status.available
    assert status.device_capability is None
    assert "not installed" in status.reason or "no CUDA GPU" in status.reason or "failed to import" in status.reason


def test_a_te_that_raises_runtime_error_on_import_is_caught(tmp_path, monkeypatch, fresh_probe):
    # What TE does on a machine without its CUDA libraries: RuntimeError, not ImportError.
    pkg = tmp_path / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "pytorch" / "__init__.py").write_text(
        "raise RuntimeError('Could not load libcudart.so.13: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("transformer_engine")]:
        monkeypatch.delitem(sys.modules, name)
    status = te_adapter.probe(refresh=True)
    assert not status.available
    assert "failed to import" in status.reason and "RuntimeError" in status.reason
    assert "libcudart.so.13" in status.reason
    with pytest.raises(TEUnavailableError, match="libcudart.so.13"):
        te_adapter.require("block")
    with pytest.raises(TEUnavailableError, match="libcudart.so.13"):
        te_adapter.TELinear(torch.randn(32, 32), recipe="current")


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_blackwell_recipes_are_refused_up_front_on_hopper(recipe):
    why = te_adapter.recipe_refusal(recipe, (9, 0))
    assert "Blackwell" in why and "sm_90" in why
    assert te_adapter.recipe_refusal(recipe, (10, 0)) == ""


def test_hopper_recipes_need_fp8_capability():
    for recipe in te_adapter.TE_RECIPES:
        assert te_adapter.recipe_refusal(recipe, (9, 0)) == ""
        assert "8.9" in te_adapter.recipe_refusal(recipe, (8, 0))
        assert te_adapter.recipe_refusal(recipe, None) == "no CUDA GPU"


def test_unknown_recipe_is_an_error_listing_the_allowed():
    with pytest.raises(ValueError, match="delayed, current, block"):
        te_adapter.probe().why_not("fp8_magic")


def test_importing_trace_rl_and_the_fp8_backends_imports_no_te_nor_cuda():
    code = textwrap.dedent("""
        import sys, torch
        import trace_rl, trace_rl.backends
        from trace_rl.backends import get_backend, te_adapter
        from trace_rl.backends.fp8 import FP8Config
        get_backend("fp8"), get_backend("fp8_te"), FP8Config(impl="te")
        assert "transformer_engine" not in sys.modules, "TE was imported"
        assert not torch.cuda.is_initialized(), "CUDA was initialised"
        print("clean")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout
