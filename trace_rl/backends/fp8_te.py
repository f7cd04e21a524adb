"""`fp8_te` backend: the fp8 backend pinned to Transformer Engine (`impl="te"`, no fallback by default).

Asking for it where TE cannot run is an error carrying the TE probe's reason (`FP8PathError` from
`linear`, `Availability(ok=False, reason=...)` from `available`). `configure(FP8Config(impl="te",
allow_fallback=True, ...))` lets it fall back, recorded in `fallbacks` and `metrics()`.
"""

from __future__ import annotations

from trace_rl.backends.fp8 import FP8Backend, FP8Config
from trace_rl.backends.registry import register_backend


@register_backend("fp8_te")
class FP8TEBackend(FP8Backend):
    @staticmethod
    def default_config() -> FP8Config:
        return FP8Config(impl="te")
