"""What every `trace-rl` subcommand shares: the usage error (exit code 2) and how a pipeline config is read
from the command line (the embedded default overlaid by a file, then a preset, then `--set` overrides).

`trace_rl.cli` and the subcommand modules (`trace_rl.audit.commands`, ...) import from here, so the arrows
point down: no subcommand imports the entry point.
"""

from __future__ import annotations

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
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise UsageError(f"--set {item!r}: the value is not valid YAML ({problem}); quote it, e.g. "
                             f"--set '{key.strip()}=\"text\"'") from None
    return out


def resolve_pipeline_config(path: str | None, preset: str | None, overrides: list[str], *, no_default: bool = False):
    """(PipelineConfig, description of its layers): the embedded default overlaid by the file (unless
    `no_default`), then the preset, then the --set overrides (`trace_rl.pipelines.sources`)."""
    from trace_rl.pipelines.sources import resolve_config

    resolved = resolve_config(path, preset, parse_overrides(overrides), use_default=not no_default)
    return resolved.config, resolved.describe()


def load_pipeline_config(path: str | None, preset: str | None, overrides: list[str], *, no_default: bool = False):
    """The run's PipelineConfig: the embedded default overlaid by the file, then the preset, then --set."""
    return resolve_pipeline_config(path, preset, overrides, no_default=no_default)[0]
