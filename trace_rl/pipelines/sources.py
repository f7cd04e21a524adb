"""Where a run's config comes from: the embedded default, overlaid by a file, a preset and `--set` overrides.

    resolved = resolve_config("my.yaml", preset="fp4-tis", overrides={"loop.steps": 10})
    resolved.config        # the PipelineConfig
    resolved.describe()    # "the embedded default (.../default.yaml) <- my.yaml <- preset fp4-tis <- --set loop.steps"

A config file is merged over the embedded default (`trace_rl/pipelines/configs/default.yaml`), so a short
file changes only what it names: mappings merge key by key, lists (corrections, ops) are replaced whole,
and a section whose `kind` differs from the default's (e.g. `task: {kind: countdown}`) replaces it whole.
`use_default=False` (`--no-default` on the command line) starts from the field defaults instead.
`PipelineConfig.load(path)` in Python reads a file as it is, without the overlay.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_rl.config import read_config_file, set_dotted
from trace_rl.pipelines.config import PipelineConfig
from trace_rl.pipelines.presets import apply_preset


def default_config_path() -> Path:
    return Path(__file__).resolve().parent / "configs" / "default.yaml"


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`: mappings recursively, anything else (lists too) replaced.
    A mapping whose "kind" differs from the base's replaces it whole (its fields belong to another kind)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and old.get("kind", value.get("kind")) == value.get(
                "kind", old.get("kind")):
            out[key] = deep_merge(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class ResolvedConfig:
    config: PipelineConfig
    layers: tuple[str, ...]          # what was applied, in order

    def describe(self) -> str:
        return " <- ".join(self.layers)


def resolve_config(path: str | Path | None = None, preset: str | None = None,
                   overrides: dict[str, Any] | None = None, *, use_default: bool = True) -> ResolvedConfig:
    """The config a run uses: (embedded default) <- file <- preset <- overrides, validated once at the end
    (errors name the field and every layer that was applied)."""
    layers: list[str] = []
    data: dict[str, Any] = {}
    if use_default:
        data = read_config_file(default_config_path())
        layers.append(f"the embedded default ({default_config_path()})")
    else:
        layers.append("field defaults (--no-default)")
    if path is not None:
        data = deep_merge(data, read_config_file(path)) if use_default else read_config_file(path)
        layers.append(str(path))
    if preset:
        data = apply_preset(data, preset)
        layers.append(f"preset {preset}")
    if overrides:
        for key, value in overrides.items():
            set_dotted(data, key, value)
        layers.append("--set " + ", ".join(overrides))
    return ResolvedConfig(PipelineConfig.parse(data, " <- ".join(layers)), tuple(layers))
