"""`get_format(name)`: formats by name, e.g. "nvfp4", "mxfp4", "bf16", "fp8_e4m3:row", "fp8_e5m2:block128x128"."""

from __future__ import annotations

import re
from functools import cache

from trace_rl.formats.base import Format
from trace_rl.formats.bf16 import BF16
from trace_rl.formats.fp8 import FP8, FP8_SCALINGS
from trace_rl.formats.mxfp4 import MXFP4
from trace_rl.formats.nvfp4 import NVFP4

FP4_FORMATS = ("nvfp4", "mxfp4", "nvfp4:row")
FP8_FORMATS = tuple(f"fp8_{e}:{s}" for e in ("e4m3", "e5m2") for s in FP8_SCALINGS)
FORMAT_NAMES = ("bf16", *FP4_FORMATS, *FP8_FORMATS, "fp8_e4m3:block128x128", "fp8_e5m2:block128x128")

_FP8_RE = re.compile(r"^fp8_(e4m3|e5m2)(?::(tensor|row|block)(?:(\d+)x(\d+))?)?$")


@cache
def get_format(name: str) -> Format:
    """The format called `name`. fp8 without a scaling means per-row ("fp8_e4m3" == "fp8_e4m3:row")."""
    if name == "bf16":
        return BF16()
    if name == "nvfp4":
        return NVFP4()
    if name == "nvfp4:row":
        return NVFP4(global_scaling="row")
    if name == "mxfp4":
        return MXFP4()
    m = _FP8_RE.match(name)
    if m:
        element, scaling, r, c = m.groups()
        scaling = scaling or "row"
        if r is not None and scaling != "block":
            raise ValueError(f"format {name!r}: a block shape only goes with ':block'")
        block = (int(r), int(c)) if r is not None else (1, 128)
        return FP8(element=element, scaling=scaling, block=block)
    raise ValueError(f"unknown format {name!r}; allowed: {', '.join(FORMAT_NAMES)}")


def is_fp4(name: str) -> bool:
    return name in FP4_FORMATS


def per_token(name: str) -> str:
    """The variant of a format used for activations and the KV cache: scales that depend on one row only.

    nvfp4's per-tensor global scale would tie a token's codes to the rest of its batch (and a KV cache
    cannot know the amax of tokens not yet written), so activations and KV use nvfp4:row; fp8 uses
    per-row scales; mxfp4 and bf16 are per block already.
    """
    if name == "nvfp4":
        return "nvfp4:row"
    if name.startswith("fp8_") and get_format(name).scaling == "tensor":
        return name.split(":")[0] + ":row"
    return get_format(name).name  # canonical spelling ("fp8_e4m3" -> "fp8_e4m3:row")


def is_fp8(name: str) -> bool:
    return name.startswith("fp8_")
