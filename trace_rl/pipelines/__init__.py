"""Declarative assembly: `PipelineConfig` -> `build(cfg)` -> `Pipeline.run()`; presets; the default config."""

from trace_rl.pipelines.config import PipelineConfig
from trace_rl.pipelines.presets import PIPELINE_PRESETS, apply_preset

__all__ = ["PIPELINE_PRESETS", "PipelineConfig", "apply_preset", "build", "default_config"]


def build(cfg, run_dir=None, title: str = ""):
    from trace_rl.pipelines.assemble import build as _build

    return _build(cfg, run_dir, title)


def default_config_path():
    from trace_rl.pipelines.sources import default_config_path as path

    return path()


def default_config() -> PipelineConfig:
    """The embedded default run (`trace-rl run` with no argument)."""
    return PipelineConfig.load(default_config_path())
