"""Marks shared by the GPU tests of the Gluon kernels (Triton 3.6's experimental Gluon API, sm_90 only)."""

import pytest
import torch
import triton

SM90_TRITON36 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
    triton.__version__.startswith("3.6")
# apply as @gpu36[0] @gpu36[1], or pytestmark
gpu36 = [pytest.mark.gpu, pytest.mark.skipif(not SM90_TRITON36, reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")]
