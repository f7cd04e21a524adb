"""What every `trace-rl` subcommand shares: the usage error (exit code 2) and how a pipeline config is read
from the command line (file or embedded default, then a preset, then `--set` overrides).

`trace_rl.cli` and the subcommand modules (`trace_rl.audit.commands`, ...) import from here, so the arrows
point down: no subcommand imports the entry point.
"""

from __future__ import annotations

from pathlib import Path

import yaml


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2, before anything is written."""


def parse_overrides(items: list[str]) -> dict:
    """`--set a.b=value` pairs; values are parsed as YAML (numbers, booleans, lists)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set loop.steps=10")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def load_pipeline_config(path: str | None, preset: str | None, overrides: list[str]):
    """The run's PipelineConfig: file (or the embedded default), then the preset, then --set overrides."""
    from trace_rl.pipelines import PipelineConfig, apply_preset, default_config_path

    source = Path(path) if path else default_config_path()
    cfg = PipelineConfig.load(source)
    if preset:
        cfg = PipelineConfig.parse(apply_preset(cfg.to_dict(), preset), f"{source} + preset {preset}")
    if overrides:
        cfg = cfg.with_overrides(parse_overrides(overrides))
    return cfg
