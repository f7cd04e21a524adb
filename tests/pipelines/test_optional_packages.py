"""Optional packages: matplotlib only when plots are on, transformers only for HF tokenizers/engines; a missing
one is a config error that names the install command. The dependency pins say what was tested."""

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

from trace_rl.cli import main
from trace_rl.config import ConfigError
from trace_rl.pipelines import build
from trace_rl.pipelines.config import LoggingSection
from trace_rl.pipelines.sources import resolve_config


def hide(monkeypatch, *packages):
    """Make `packages` look uninstalled: find_spec says None and importing them fails."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] in packages else real(name, *a))
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.delitem(sys.modules, name)
    for name in packages:
        monkeypatch.setitem(sys.modules, name, None)       # `import name` raises ImportError


def test_runs_without_matplotlib_when_plots_are_off(tmp_path, monkeypatch, capsys):
    hide(monkeypatch, "matplotlib")
    with pytest.raises(ConfigError, match="pip install matplotlib, or set logging.plot=false"):
        LoggingSection.parse({"plot": True})
    assert main(["validate", "--set", "logging.plot=true"]) == 2
    assert "logging.plot" in capsys.readouterr().err
    cfg = resolve_config(overrides={"loop.steps": 1, "loop.prompts_per_step": 4, "loop.group_size": 4,
                                    "loop.eval_prompts": 8, "logging.progress": False, "logging.plot": False}).config
    summary = build(cfg, run_dir=tmp_path / "run").run()
    assert "plot" not in summary and not (tmp_path / "run" / "curves.png").exists()


def test_hf_engine_without_transformers_names_the_extra(monkeypatch, tmp_path):
    from trace_rl.engine.hf import HFEngine
    from trace_rl.models.hf import MissingDependency

    hide(monkeypatch, "transformers")
    with pytest.raises(MissingDependency, match=r"pip install 'trace-rl\[hf\]'"):
        HFEngine.from_pretrained(tmp_path)


def test_dependency_ranges():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    deps = {d.split(">")[0].split("=")[0].split("<")[0]: d for d in project["dependencies"]}
    assert deps["torch"] == "torch>=2.11,<2.14"          # keeps a fresh install on the 2.13.0 CPU wheel
    assert deps["torchrl"] == "torchrl>=0.14.1,<0.15"
    assert "transformers" not in deps and project["optional-dependencies"]["hf"] == ["transformers>=4.50"]
    import torch

    assert (2, 11) <= tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14)
