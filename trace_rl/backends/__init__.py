"""Precision backends (bf16, fp8, fp4): packed weights, linear, fake quantization, KV write/read.

`get_backend(name)` returns the shared instance; `available(device)` says which path it takes there.
Importing this package imports no Triton, Transformer Engine or vLLM.
"""

from trace_rl.backends.base import Availability, Backend, PackedWeight, PathReport, straight_through
from trace_rl.backends.quant_linear import QuantLinear
from trace_rl.backends.registry import backend_for_format, backend_names, get_backend, register_backend

__all__ = ["Availability", "Backend", "PackedWeight", "PathReport", "QuantLinear", "backend_for_format",
           "backend_names", "get_backend", "register_backend", "straight_through"]
