"""Every user-input error exits 2 with one line naming the file or field (and the fix), before anything is
written: the run directory (and `runs/` in the working directory) stays absent. One table, run in-process."""

from __future__ import annotations

import pytest

from trace_rl.cli import main

BAD_YAML = "loop:\n  steps: 3\n precision: {kv_cache: bf16\n"
NOT_UTF8 = "loop:\n  steps: 3\n# caf\xe9\n".encode("latin-1")


def _files(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "bad.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": 4,}\n')
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\xe9?", "answer": "2"}\n'.encode("latin-1"))
    (tmp_path / "noanswer.jsonl").write_text('{"question": "1+1?"}\n')
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    (tmp_path / "bad.json").write_text('{"loop": {"steps": 3,}}')
    (tmp_path / "latin1.yaml").write_bytes(NOT_UTF8)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "folder.yaml").mkdir()


# (argv, what the one line must contain); {tmp} is the test's folder
CASES = [
    (["run", "{tmp}/bad.yaml"], ["bad.yaml:3:", "invalid YAML"]),
    (["run", "{tmp}/bad.json"], ["bad.json:1:", "invalid JSON"]),
    (["run", "{tmp}/latin1.yaml"], ["latin1.yaml", "not UTF-8", "save it as UTF-8"]),
    (["run", "{tmp}/list.yaml"], ["list.yaml", "top level must be a mapping"]),
    (["run", "{tmp}/folder.yaml"], ["folder.yaml", "is a folder"]),
    (["validate", "{tmp}/bad.yaml"], ["bad.yaml:3:", "invalid YAML"]),
    (["run", "--set", "trainer.lr=.inf"], ["trainer.lr", "finite"]),
    (["run", "--set", "trainer.lr=.nan"], ["trainer.lr", "finite"]),
    (["run", "--set", "trainer.betas=[0.9, 1.5]"], ["trainer.betas", "betas[1] = 1.5", "[0, 1)"]),
    (["run", "--set", "trainer.betas=[-0.1, 0.9]"], ["trainer.betas", "betas[0]"]),
    (["run", "--set", "seed=123456789012345678901234567890"], ["seed", "less than or equal to 4294967295"]),
    (["run", "--set", "seed=-1"], ["seed", "greater than or equal to 0"]),
    (["run", "--set", "logging.name=../escape"], ["logging.name", "one path component"]),
    (["run", "--set", "logging.name=/tmp/abs"], ["logging.name", "one path component"]),
    (["run", "--set", "loop.group_size=1"], ["loop.group_size", "at least 2"]),
    (["run", "--set", "loop.steps=[1"], ["--set", "not valid YAML"]),
    # the task's files
    (["run", "--set", "task={kind: jsonl, path: bad.jsonl}"], ["task (jsonl)", "bad.jsonl:2: not valid JSON"]),
    (["run", "--set", "task={kind: jsonl, path: latin1.jsonl}"], ["task", "not UTF-8"]),
    (["run", "--set", "task={kind: jsonl, path: noanswer.jsonl}"], ["noanswer.jsonl:1", "'answer'"]),
    (["run", "--set", "task={kind: jsonl, path: missing.jsonl}"], ["missing.jsonl", "not found"]),
    # what run would only find at a later step, found before the first one (and by validate)
    (["run", "--set", "rollout.max_seq_len=8"], ["rollout.max_seq_len: 8 is too small", "= 14"]),
    (["validate", "--set", "rollout.max_seq_len=8"], ["rollout.max_seq_len: 8 is too small"]),
    (["run", "--set", "precision.keep_high_precision=[lm_hed, '*norm*']"],
     ["precision.keep_high_precision: 'lm_hed' matches no module"]),
    (["validate", "--preset", "fp4-guided", "--set", "precision.guided_layers='*.layers.9.*'"],
     ["precision.guided_layers: '*.layers.9.*' matches none"]),
    (["validate", "--preset", "w4a4-kv4", "--set", "rollout.operand_cache=fp8"],
     ["rollout.operand_cache='fp8' holds mxfp4 operands", "--preset w4a4-kv4-mx", "rollout.operand_cache='bf16'"]),
    # where it would write
    (["run", "--out", "{tmp}/a_file"], ["a_file: exists and is not a folder"]),
    (["run", "--out", "{tmp}/a_file/run"], ["a_file is a file, not a folder"]),
    # other commands
    (["formats", "--rows", "0"], ["--rows 0", "positive multiple of 128"]),
    (["formats", "--cols", "100"], ["--cols 100", "positive multiple of 128"]),
    (["formats", "--rows", "100000", "--cols", "100096"], ["more than this table needs"]),
    (["formats", "--seed", "-1"], ["--seed -1"]),
    (["bench", "rollout", "--parts", "grid,nope", "--out", "{tmp}/run"], ["bench rollout: --parts: unknown ['nope']"]),
]


@pytest.mark.parametrize("argv,needles", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, needles, tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out_dir = tmp_path / "run"
    if argv[0] == "run" and "--out" not in argv:
        argv = [*argv, "--out", str(out_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trace-rl: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out_dir.exists() and not (tmp_path / "runs").exists()
    assert (tmp_path / "a_file").read_text() == "not a folder"


def test_missing_logger_package_is_named_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """The loggers' packages are checked with the config (trace_rl.pipelines.loggers), so validate and run
    refuse alike; simulated here by a package name that cannot be installed."""
    from trace_rl.pipelines import loggers

    monkeypatch.setitem(loggers.LOGGER_PACKAGES, "tensorboard", "tensorboard_absent_here")
    monkeypatch.chdir(tmp_path)
    for argv in (["validate"], ["run", "--out", str(tmp_path / "run")]):
        assert main([*argv, "--set", "logging.tensorboard=true"]) == 2
        err = capsys.readouterr().err
        assert "tensorboard (pip install tensorboard_absent_here)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_corrupted_checkpoint_is_named_on_resume_and_nothing_is_touched(tmp_path, capsys):
    import torch

    from trace_rl.pipelines import default_config
    from trace_rl.pipelines.checkpoint import named_optimizer_state, save_checkpoint

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = default_config()
    cfg.dump(run_dir / "config.yaml")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    save_checkpoint(run_dir, model.state_dict(), named_optimizer_state(model, opt), {"step": 1}, cfg.to_dict())
    target = run_dir / "checkpoint" / "optimizer.safetensors"
    target.write_bytes(target.read_bytes()[:-3] + b"xyz")
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint/optimizer.safetensors: corrupted" in err and len(err.strip().splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


@pytest.mark.parametrize("argv,needle", [
    (["drift", "--prompts", "{tmp}/latin1.jsonl"], "not UTF-8"),
    (["drift", "--task", "{kind: arith"], "--task"),
    (["compare", "--out", "{tmp}/a_file"], "--out"),
])
def test_audit_commands_bad_input_exits_2(argv, needle, tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()
