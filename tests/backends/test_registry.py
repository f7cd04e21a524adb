"""Backend registry, availability reports and path reporting."""

import logging

import pytest
import torch

from trace_rl.backends import backend_for_format, backend_names, get_backend


def test_registry_lists_the_three_backends():
    assert {"bf16", "fp8", "fp4"} <= set(backend_names())
    assert backend_for_format("nvfp4").name == "fp4"
    assert backend_for_format("fp8_e4m3:row").name == "fp8"
    assert backend_for_format("bf16").name == "bf16"
    with pytest.raises(ValueError, match="registered: .*fp4"):
        get_backend("fp3")


def test_available_explains_emulation_on_cpu():
    for name in ("fp8", "fp4"):
        av = get_backend(name).available("cpu")
        assert av.ok and av.path.endswith("emulated") and "emulated" in av.reason


def test_first_use_of_a_path_is_logged(caplog):
    from trace_rl.backends import QuantLinear

    backend = get_backend("fp4")
    backend.paths.counts.clear()
    with caplog.at_level(logging.INFO, logger="trace_rl.backends"):
        QuantLinear(torch.randn(16, 32), "mxfp4")(torch.randn(1, 32))
    assert "fp4.emulated" in caplog.text
    assert backend.paths.summary() == {"fp4.emulated": 1}


def test_kv_write_read_per_token_and_head(rng):
    kv = torch.randn(5, 2, 64, generator=rng)
    backend = get_backend("fp4")
    q = backend.kv_write(kv, "nvfp4")
    assert q.format == "nvfp4:row" and q.global_scale.shape == (5, 2, 1)
    # each token-head is quantized on its own: quantizing one token alone gives the same codes
    q0 = backend.kv_write(kv[:1], "nvfp4")
    assert torch.equal(q0.codes, q.codes[:1])
    assert backend.kv_read(q).shape == kv.shape
