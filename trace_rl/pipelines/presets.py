"""Pipeline presets: a precision plan + corrections applied on top of a config.

There is one preset namespace, `trace_rl.plan.PRESETS`, shared by `trace-rl run --preset`, `trace-rl drift
--plans`, `trace-rl compare --presets` and `PrecisionPlan.preset`; `trace-rl presets` lists it. Applying a
preset replaces the config's `precision` and `corrections` sections whole.

| preset       | rollout (weights / activations / KV) | trainer | corrections          |
|--------------|--------------------------------------|---------|----------------------|
| bf16         | bf16 / bf16 / bf16                   | bf16    | –                    |
| fp8          | fp8 e4m3 rows / rows / fp8 e4m3      | bf16    | –                    |
| w4a16        | nvfp4 / bf16 / bf16                  | bf16    | –                    |
| w4a16-mx     | mxfp4 / bf16 / bf16                  | bf16    | –                    |
| fp4          | nvfp4 / nvfp4 / nvfp4                | bf16    | – (no correction)    |
| fp4-mx       | mxfp4 / mxfp4 / mxfp4                | bf16    | –                    |
| fp4-tis      | nvfp4 / nvfp4 / nvfp4                | bf16    | token TIS, C = 2     |
| fp4-aligned  | nvfp4 / nvfp4 / nvfp4                | aligned | –                    |
| fp4-guided   | nvfp4 / nvfp4 / nvfp4                | guided  | –                    |

Aliases (earlier names): `w4a4-kv4` = `fp4`, `w4a4-kv4-mx` = `fp4-mx`.
"""

from __future__ import annotations

from typing import Any

from trace_rl.plan import PRESET_ALIASES, PRESETS, resolve_preset


def preset_overrides(name: str) -> dict[str, Any]:
    """{"precision": ..., "corrections": [...]} of a preset or alias (ConfigError naming the choices)."""
    p = resolve_preset(name)
    return {"precision": dict(p.plan), "corrections": [dict(c) for c in p.corrections]}


# every preset and alias -> its overrides
PIPELINE_PRESETS: dict[str, dict[str, Any]] = {name: preset_overrides(name) for name in [*PRESETS, *PRESET_ALIASES]}


def apply_preset(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of config data with the preset's precision and corrections (replacing both)."""
    out = dict(data)
    out.update(preset_overrides(name))
    return out


__all__ = ["PIPELINE_PRESETS", "PRESET_ALIASES", "apply_preset", "preset_overrides"]
