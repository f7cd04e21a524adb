"""Checkpoints and resume: atomic saves (a process killed at every stage of a save leaves a complete
checkpoint), the newest complete one chosen, corrupted/other-run/non-finite checkpoints refused naming the
file, metrics truncated to the checkpoint's step (torn last line repaired), resume overrides applied or
refused, SIGINT saves and prints the resume command, run directories refused and locked.

Kills are real: a forked child process (fork: no second interpreter start-up) is SIGKILLed at a named
stage of `save_checkpoint`; the test then resumes from what is left on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.pipelines.test_run import small, train_records
from trace_rl.cli import main
from trace_rl.pipelines import build
from trace_rl.pipelines import checkpoint as ckpt
from trace_rl.pipelines.checkpoint import CheckpointError
from trace_rl.pipelines.run_dir import RunDirectory, RunDirError
from trace_rl.pipelines.run_log import read_history

REPO = Path(__file__).resolve().parents[2]
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="fault injection forks a child process")


def killed_at(stage: str, occurrence: int, work) -> None:
    """Run `work()` in a forked child that SIGKILLs itself when `save_checkpoint` reaches `stage` for the
    `occurrence`-th time; assert it died that way."""
    pid = os.fork()
    if pid == 0:                                  # the child: never returns into pytest
        try:
            torch.set_num_threads(1)              # no OpenMP pool in a forked child
            seen = {"n": 0}

            def stage_reached(name):
                if name == stage:
                    seen["n"] += 1
                    if seen["n"] == occurrence:
                        os.kill(os.getpid(), signal.SIGKILL)

            ckpt._checkpoint_stage = stage_reached
            work()
        finally:
            os._exit(3)                           # reached only if the kill did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child exited with {status}"


# -- save_checkpoint killed at each stage, on a small model and optimizer --

def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def _save(run_dir, model, opt, step):
    return ckpt.save_checkpoint(run_dir, model.state_dict(), ckpt.named_optimizer_state(model, opt),
                                {"step": step}, {"seed": 0, "loop": {"steps": 9}})


STAGES = {   # stage of the second save where the process dies -> the step a resume must find
    "tmp:model.safetensors": 1, "tmp:optimizer.safetensors": 1, "tmp:rng.safetensors": 1,
    "tmp:state.json": 2, "swap:old": 2, "swap:new": 2, "done": 2,
}


@needs_fork
@pytest.mark.parametrize("stage", list(STAGES))
def test_kill_at_each_stage_of_a_save_leaves_a_complete_checkpoint(stage, tmp_path):
    first, opt1 = _model_and_optimizer(1)
    second, opt2 = _model_and_optimizer(2)
    _save(tmp_path, first, opt1, 1)
    killed_at(stage, 1, lambda: _save(tmp_path, second, opt2, 2))

    found = ckpt.find_checkpoint(tmp_path)
    step = STAGES[stage]
    assert found.state["step"] == step, found.note
    assert found.note.startswith(f"{found.folder.name}/ (step {step})")
    ckpt.promote(tmp_path, found)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]     # the others cleared
    weights, optim, _, state = ckpt.read_checkpoint(tmp_path / "checkpoint")
    want = first if step == 1 else second
    assert all(torch.equal(weights[k], v) for k, v in want.state_dict().items())
    fresh, fresh_opt = _model_and_optimizer(3)
    ckpt.load_named_optimizer_state(fresh, fresh_opt, optim, "here")
    ref_state = (opt1 if step == 1 else opt2).state_dict()["state"]
    assert all(torch.equal(fresh_opt.state_dict()["state"][i]["exp_avg"], ref_state[i]["exp_avg"]) for i in ref_state)


def test_corrupted_file_is_named_and_an_older_complete_checkpoint_is_used(tmp_path):
    model, opt = _model_and_optimizer(1)
    _save(tmp_path, model, opt, 1)
    data = bytearray((tmp_path / "checkpoint" / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"checkpoint/model.safetensors: corrupted \(its sha256"):
        ckpt.find_checkpoint(tmp_path)
    # a complete older copy (as a save killed after "swap:old" leaves it) is taken instead, and said so
    os.rename(tmp_path / "checkpoint", tmp_path / "keep")
    _save(tmp_path, model, opt, 1)
    os.rename(tmp_path / "checkpoint", tmp_path / "checkpoint.old")
    os.rename(tmp_path / "keep", tmp_path / "checkpoint")
    found = ckpt.find_checkpoint(tmp_path)
    assert found.folder.name == "checkpoint.old" and "corrupted" in found.note


def test_non_finite_checkpoint_tensor_is_named(tmp_path):
    model, opt = _model_and_optimizer(1)
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    _save(tmp_path, model, opt, 1)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor '1.weight' has 1 non-finite"):
        ckpt.read_checkpoint(tmp_path / "checkpoint")


def test_checkpoint_holds_no_pickle_and_a_planted_one_is_never_read(tmp_path):
    model, opt = _model_and_optimizer(1)
    folder = _save(tmp_path, model, opt, 1)
    assert sorted(p.name for p in folder.iterdir()) == [
        "model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    marker = tmp_path / "pwned"
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for name in (".metadata", "rng.pt", "__0_0.distcp"):
        (folder / name).write_bytes(pickle.dumps(Evil()))
    ckpt.read_checkpoint(ckpt.find_checkpoint(tmp_path).folder)
    assert not marker.exists()


def test_no_torch_load_without_weights_only():
    """torch.load unpickles; only weights_only=True restricts it to tensors. Nowhere in the repository."""
    out = subprocess.run(["git", "grep", "-n", "-E", r"torch\.load\(", "--", "*.py"], cwd=REPO,
                         capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if "test_checkpoint.py" not in line]
    unsafe = [line for line in lines if "weights_only=True" not in line]
    assert not unsafe, "torch.load without weights_only=True:\n" + "\n".join(unsafe)


def test_checkpoint_of_another_run_is_refused(tmp_path):
    model, opt = _model_and_optimizer(1)
    state = {"step": 1}
    ckpt.save_checkpoint(tmp_path, model.state_dict(), ckpt.named_optimizer_state(model, opt), state,
                         {"seed": 7, "precision": {"kv_cache": "bf16"}, "trainer": {"lr": 1e-3}})
    found = ckpt.find_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"written by a different run \(precision.kv_cache: 'bf16' there, "
                                              r"'nvfp4' here; seed: 7 there, 0 here\)"):
        ckpt.check_same_run(found.state, {"seed": 0, "precision": {"kv_cache": "nvfp4"}, "trainer": {"lr": 1e-3}},
                            found.folder)
    changed = ckpt.check_same_run(found.state, {"seed": 7, "precision": {"kv_cache": "bf16"},
                                                "trainer": {"lr": 2e-3}}, found.folder)
    assert changed == {"trainer.lr": (1e-3, 2e-3)}


# -- whole runs: one uninterrupted reference, shared --

STEPS = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    build(small(STEPS, **{"loop.checkpoint_every": 1}), run_dir=run_dir).run()
    return train_records(run_dir)


def _cli_run(run_dir: Path, steps: int, *extra: str) -> int:
    return main(["run", "--out", str(run_dir), "--set", f"loop.steps={steps}", "--set", "loop.prompts_per_step=4",
                 "--set", "loop.group_size=4", "--set", "loop.eval_every=0", "--set", "loop.eval_prompts=8",
                 "--set", "logging.progress=false", "--set", "logging.plot=false",
                 "--set", "loop.checkpoint_every=1", *extra])


@needs_fork
def test_killed_run_resumes_exactly_with_metrics_truncated_and_torn_line_repaired(reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    # killed while writing the step-3 checkpoint: step 3's record is logged, checkpoint/ still holds step 2
    killed_at("tmp:optimizer.safetensors", 3, lambda: _cli_run(run_dir, STEPS))
    assert (run_dir / "checkpoint.tmp").is_dir() and not (run_dir / "checkpoint.tmp" / "state.json").exists()
    assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3]
    with open(run_dir / "metrics.jsonl", "a") as f:                     # and a record torn mid-write
        f.write('{"kind": "train", "step": 4, "reward": 0.')
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "resuming from checkpoint/ (step 2)" in out
    assert train_records(run_dir) == reference                          # no step twice, none lost
    history = read_history(run_dir)
    assert [r["step"] for r in history if r["kind"] == "resume"] == [2]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]


def test_sigint_saves_a_checkpoint_prints_the_resume_command_and_resumes_exactly(reference, tmp_path, capsys,
                                                                                monkeypatch):
    from trace_rl.pipelines.pipeline import Pipeline

    run_dir = tmp_path / "run"
    real_step = Pipeline.train_step

    def step_then_ctrl_c(self):
        record = real_step(self)
        if self.step == 2:
            signal.raise_signal(signal.SIGINT)    # as a Ctrl-C during step 2
        return record

    monkeypatch.setattr(Pipeline, "train_step", step_then_ctrl_c)
    handler_before = signal.getsignal(signal.SIGINT)
    assert _cli_run(run_dir, STEPS, "--set", "loop.checkpoint_every=0") == 128 + signal.SIGINT
    captured = capsys.readouterr()
    assert "SIGINT: stopped after step 2; checkpoint saved" in captured.err
    command = re.search(r"resume with: (.+)", captured.out).group(1)
    assert command == f"trace-rl run --resume {run_dir}"
    assert signal.getsignal(signal.SIGINT) is handler_before                  # handlers restored
    monkeypatch.undo()
    assert main(command.split()[1:]) == 0
    assert train_records(run_dir) == reference


def test_resume_applies_lr_to_the_optimizer_and_records_it(tmp_path):
    run_dir = tmp_path / "run"
    build(small(1, **{"trainer.lr": 1e-4}), run_dir=run_dir).run()
    resumed = build(small(2, **{"trainer.lr": 5e-4}), run_dir=run_dir)
    resumed.run(resume=True)
    assert resumed.optimizer.param_groups[0]["lr"] == 5e-4
    record = next(r for r in read_history(run_dir) if r["kind"] == "resume")
    assert record["changed"] == {"loop.steps": [1, 2], "trainer.lr": [1e-4, 5e-4]}
    assert "lr: 0.0005" in (run_dir / "config.yaml").read_text()
    state = json.loads((run_dir / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2 and state["config"]["trainer"]["lr"] == 5e-4


@pytest.mark.parametrize("extra,needle", [
    (["--preset", "bf16"], "--preset cannot apply"),
    (["--out", "elsewhere"], "--out cannot apply"),
    (["--overwrite"], "--overwrite cannot apply"),
    (["--set", "seed=3"], "--set seed would make it another run"),
    (["--set", "precision.kv_cache=bf16"], "--set precision.kv_cache would make it another run"),
    (["--set", "loop.steps=1"], "the run already finished (checkpoint at step 1"),
])
def test_resume_refuses_what_it_cannot_apply(extra, needle, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _cli_run(run_dir, 1) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before          # nothing touched


def test_run_directory_refused_overwritten_and_locked(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _cli_run(run_dir, 1) == 0
    metrics = (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _cli_run(run_dir, 1) == 2                                    # a second run into it: refused
    assert "already holds" in capsys.readouterr().err and (run_dir / "metrics.jsonl").read_text() == metrics
    with RunDirectory(run_dir, "resume"):                               # a run holds it: others refused
        with pytest.raises(RunDirError, match=r"another trace-rl process \(pid \d+\) is writing"):
            RunDirectory(run_dir, "overwrite").acquire()
    assert (run_dir / "metrics.jsonl").read_text() == metrics           # the refused overwrite deleted nothing
    assert _cli_run(run_dir, 1, "--overwrite") == 0
    assert len(train_records(run_dir)) == 1
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert _cli_run(other, 1, "--overwrite") == 2                       # never deletes a non-run folder
    assert "not a trace-rl run directory" in capsys.readouterr().err and (other / "notes.txt").exists()


def test_sigterm_is_a_stop_request_and_a_second_ctrl_c_stops_at_once(capsys):
    from trace_rl.pipelines.pipeline import _StopRequests

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = _StopRequests().install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM                  # the loop saves after this step
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)                # a second request: stop now, unsaved
    finally:
        stop.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before     # restored
    assert "SIGTERM: stopping after this step" in capsys.readouterr().out
