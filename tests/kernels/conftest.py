"""Kernel tests run on the GPU when there is one, else through Triton's CPU interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (`triton.jit` reads it when it
decorates), so it is set here, at collection time, when no CUDA device is present.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="the kernels need triton (pip install trace-rl[triton])")

from benchmarks.kernel_baselines import capture_graph  # noqa: E402 (after TRITON_INTERPRET is set)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def gen() -> torch.Generator:
    """Fresh random inputs every run (the seed is printed on failure through the test id)."""
    g = torch.Generator()
    g.seed()
    return g


@pytest.fixture
def capture():
    """capture(fn) -> (graph, output): `fn` warmed up once on a side stream (allocations and compiles happen
    outside the capture, as in the engine), then captured in a CUDA graph (benchmarks/kernel_baselines.py's
    capture_graph, which the benches' bit checks use too)."""
    return capture_graph
