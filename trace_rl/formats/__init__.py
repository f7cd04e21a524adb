"""Numeric formats as pure data, each with a torch reference quantize/dequantize that is the spec."""

from trace_rl.formats.base import Format
from trace_rl.formats.bf16 import BF16
from trace_rl.formats.e2m1 import E2M1_MAGNITUDES, e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles
from trace_rl.formats.fp8 import FP8
from trace_rl.formats.mxfp4 import MXFP4, e8m0_to_float
from trace_rl.formats.nvfp4 import NVFP4, nvfp4_global_scale
from trace_rl.formats.qtensor import QTensor
from trace_rl.formats.registry import FORMAT_NAMES, FP4_FORMATS, FP8_FORMATS, get_format, is_fp4, is_fp8, per_token

__all__ = [
    "BF16", "E2M1_MAGNITUDES", "FORMAT_NAMES", "FP4_FORMATS", "FP8", "FP8_FORMATS", "Format", "MXFP4", "NVFP4",
    "QTensor", "e2m1_decode", "e2m1_encode", "e8m0_to_float", "get_format", "is_fp4", "is_fp8", "nvfp4_global_scale",
    "pack_nibbles", "per_token", "unpack_nibbles",
]
