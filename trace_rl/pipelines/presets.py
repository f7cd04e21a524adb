"""Pipeline presets: whole precision plans + corrections, applied on top of a config.

| preset       | rollout (weights / activations / KV) | trainer | corrections          |
|--------------|--------------------------------------|---------|----------------------|
| bf16         | bf16 / bf16 / bf16                   | bf16    | –                    |
| fp8          | fp8 e4m3 rows / rows / fp8 e4m3      | bf16    | –                    |
| fp4          | nvfp4 / nvfp4 / nvfp4                | bf16    | – (no correction)    |
| fp4-tis      | nvfp4 / nvfp4 / nvfp4                | bf16    | token TIS, C = 2     |
| fp4-aligned  | nvfp4 / nvfp4 / nvfp4                | aligned | –                    |
| fp4-guided   | nvfp4 / nvfp4 / nvfp4                | guided  | –                    |
"""

from __future__ import annotations

from typing import Any

from trace_rl.config import ConfigError
from trace_rl.plan import PLAN_PRESETS

TOKEN_TIS = [{"kind": "token_tis", "params": {"C": 2.0}}]

PIPELINE_PRESETS: dict[str, dict[str, Any]] = {
    "bf16": {"precision": PLAN_PRESETS["bf16"], "corrections": []},
    "fp8": {"precision": PLAN_PRESETS["fp8"], "corrections": []},
    "fp4": {"precision": PLAN_PRESETS["fp4"], "corrections": []},
    "fp4-tis": {"precision": PLAN_PRESETS["fp4"], "corrections": TOKEN_TIS},
    "fp4-aligned": {"precision": PLAN_PRESETS["fp4-aligned"], "corrections": []},
    "fp4-guided": {"precision": PLAN_PRESETS["fp4-guided"], "corrections": []},
}


def preset_overrides(name: str) -> dict[str, Any]:
    if name not in PIPELINE_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(PIPELINE_PRESETS)}", ("preset",))
    return PIPELINE_PRESETS[name]


def apply_preset(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of config data with the preset's precision and corrections (replacing both)."""
    out = dict(data)
    out.update(preset_overrides(name))
    return out
