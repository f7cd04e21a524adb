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
