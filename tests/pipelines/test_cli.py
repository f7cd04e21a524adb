"""CLI: exit code 2 with a message naming the field before anything is written; presets; validate."""

import pytest

from trace_rl.cli import main


@pytest.mark.parametrize("argv,needle", [
    (["run", "--set", "loop.stepz=3"], "loop.stepz: unknown key"),
    (["run", "--set", "precision.kv_cache=fp5"], "precision.kv_cache"),
    (["run", "--preset", "fp5"], "available: bf16"),
    (["run", "--set", "model.path=/no/such/model"], "/no/such/model"),
    (["run", "--set", "model.device=cuda"], "model.device"),
    (["run", "nope.yaml"], "not found: nope.yaml"),
    (["run", "--set", "oops"], "KEY=VALUE"),
])
def test_bad_input_exits_2_and_writes_nothing(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if "model.device=cuda" in argv[-1]:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    assert main([*argv, "--out", str(tmp_path / "run")] if argv[0] == "run" and "--set" in argv else argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_presets_and_validate(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "fp4-tis" in out and "token_tis" in out
    assert main(["validate", "--preset", "fp8"]) == 0
    assert "valid" in capsys.readouterr().out
