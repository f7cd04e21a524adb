"""Shared fixtures. `TRACE_RL_TEST_BACKEND` (set by each tox environment) selects the backend that the
backend-parametrized tests run with; unset, they run with every backend."""

from __future__ import annotations

import os

import pytest
import torch

# Kernel modules read TRITON_INTERPRET when `triton.jit` decorates them, which may happen in any test that
# touches a backend; set it before the first test module is imported, not in tests/kernels only.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ALL_BACKENDS = ("bf16", "fp8", "fp4")
# One representative weight format per backend for the parametrized tests.
BACKEND_FORMATS = {"bf16": ("bf16", "bf16"), "fp8": ("fp8_e4m3:row", "fp8_e4m3:row"), "fp4": ("nvfp4", "nvfp4")}


def selected_backends() -> tuple[str, ...]:
    chosen = os.environ.get("TRACE_RL_TEST_BACKEND")
    if not chosen:
        return ALL_BACKENDS
    if chosen not in ALL_BACKENDS:
        raise pytest.UsageError(f"TRACE_RL_TEST_BACKEND={chosen!r}; allowed: {', '.join(ALL_BACKENDS)}")
    return (chosen,)


@pytest.fixture(params=selected_backends())
def backend_name(request) -> str:
    return request.param


@pytest.fixture
def one_torch_thread():
    """torch's intra-op threads cost milliseconds per tiny matmul on a shared 2-core machine (15 ms instead
    of 20 us seen here under load); tests of tiny models use one thread (`pytest.mark.usefixtures`)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def rng() -> torch.Generator:
    """A fresh, randomly seeded generator (its seed printed, shown on failure); RNG_SEED=<seed> replays a failure."""
    seed = int(os.environ.get("RNG_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"rng seed: {seed}")
    return torch.Generator().manual_seed(seed)


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "backend_name" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.backend)  # tox's per-backend environments select these
