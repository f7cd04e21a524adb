"""Broken numbers stop a run with their real cause instead of looking normal: non-finite weights in a model
folder (exit 2, the tensor named), an optimizer step that overflows (exit 1, the settings named, nothing
saved or evaluated from those weights). Non-finite config values: tests/pipelines/test_bad_input.py."""

from __future__ import annotations

import torch

from tests.pipelines.test_checkpoint import _cli_run
from trace_rl.cli import main
from trace_rl.models.loading import save_pretrained
from trace_rl.models.presets import tiny_model
from trace_rl.pipelines.run_log import read_history


def test_model_folder_with_nan_weights_is_refused_naming_the_tensor(tmp_path, capsys):
    model, tok = tiny_model("tiny", seed=0)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, :2] = torch.nan
    save_pretrained(model, tok, tmp_path / "model")
    assert main(["run", "--set", f"model.path={tmp_path / 'model'}", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "model.path:" in err and "'model.layers.1.mlp.down_proj.weight' has 2 non-finite values" in err
    assert not (tmp_path / "run").exists()


def test_an_overflowing_optimizer_step_stops_the_run_naming_the_cause(tmp_path, capsys):
    """weight_decay 1e45 is a finite number (the config accepts it), but AdamW's decay factor overflows
    float32: every weight becomes inf after the first step, with a perfectly finite gradient norm."""
    run_dir = tmp_path / "run"
    assert _cli_run(run_dir, 2, "--set", "trainer.weight_decay=1e45") == 1
    err = capsys.readouterr().err
    assert "step 1: the optimizer step made" in err and "although the gradient norm was finite" in err
    assert "weight_decay=1e+45" in err
    history = read_history(run_dir)
    assert [r["kind"] for r in history] == ["eval", "collapse"]           # the step-0 eval, then the collapse
    assert history[1]["step"] == 1 and history[1]["reason"] == "non-finite"
    assert not (run_dir / "checkpoint").exists()                          # nothing saved from those weights
