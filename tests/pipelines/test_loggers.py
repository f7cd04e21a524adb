"""Metrics through torchrl's loggers: namespaced keys, CSV and TensorBoard files from a run, W&B and MLflow
wiring, a missing package is exit 2 before anything is written, resume cuts the CSV back."""

import importlib.util
import sys

import pytest

from trace_rl.cli import main
from trace_rl.config import ConfigError
from trace_rl.pipelines import build
from trace_rl.pipelines.config import LoggingSection
from trace_rl.pipelines.loggers import MetricLoggers, namespaced
from trace_rl.pipelines.run_log import read_history

from .test_run import small


def test_namespaces():
    train = {"kind": "train", "step": 3, "loss": 0.5, "grad_norm": 1.0, "lr": 1e-4, "reward": 0.2, "correct": 0.1,
             "rollout_tokens_per_s": 9.0, "mismatch_k3": 0.01, "ess": 0.9, "mismatch_by_position/k3/0-1": 0.02,
             "clip_fraction": 0.0, "flag": True, "note": "x"}
    assert namespaced(train) == {
        "train/loss": 0.5, "train/grad_norm": 1.0, "train/lr": 1e-4, "rollout/reward": 0.2, "rollout/correct": 0.1,
        "rollout/rollout_tokens_per_s": 9.0, "drift/mismatch_k3": 0.01, "drift/ess": 0.9,
        "drift/mismatch_by_position/k3/0-1": 0.02, "train/clip_fraction": 0.0}
    assert namespaced({"kind": "eval", "step": 3, "eval_accuracy": 0.5, "eval_reward": 0.4}) == {
        "eval/accuracy": 0.5, "eval/reward": 0.4}
    assert namespaced({"kind": "resume", "step": 3, "checkpoint": "x"}) == {}


def csv_rows(run_dir, name):
    path = run_dir / "csv" / "scalars" / f"{name}.csv"
    return [(int(a), float(b)) for a, b in (line.split(",") for line in path.read_text().splitlines())]


def test_run_logs_csv_and_tensorboard_with_namespaces(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    build(small(2, **{"logging.loggers": ["csv", "tensorboard"]}), run_dir=run_dir).run()
    train = [r for r in read_history(run_dir) if r["kind"] == "train"]
    assert csv_rows(run_dir, "train/loss") == [(1, train[0]["loss"]), (2, train[1]["loss"])]
    assert csv_rows(run_dir, "drift/mismatch_k3") == [(r["step"], r["mismatch_k3"]) for r in train]
    assert [s for s, _ in csv_rows(run_dir, "eval/accuracy")] == [0, 2]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "rollout/reward", "drift/ess", "eval/accuracy"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]


def test_resume_cuts_the_csv_back_to_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    build(small(2, **{"logging.loggers": ["csv"]}), run_dir=run_dir).run()
    with (run_dir / "csv" / "scalars" / "train" / "loss.csv").open("a") as f:
        f.write("3,9.9\n")        # logged after the last checkpoint by a run that then died
    build(small(4, **{"logging.loggers": ["csv"]}), run_dir=run_dir).run(resume=True)
    train = [r for r in read_history(run_dir) if r["kind"] == "train"]
    assert csv_rows(run_dir, "train/loss") == [(r["step"], r["loss"]) for r in train]
    assert [s for s, _ in csv_rows(run_dir, "train/loss")] == [1, 2, 3, 4]


@pytest.mark.parametrize("logger,package", [("tensorboard", "tensorboard"), ("wandb", "wandb"),
                                            ("mlflow", "mlflow")])
def test_missing_logger_package_is_exit_2_before_anything_is_written(logger, package, tmp_path, monkeypatch,
                                                                     capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(ConfigError, match=f"{logger} \\(pip install {package}\\)"):
        LoggingSection.parse({"loggers": [logger]})
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--set", f"logging.loggers=[{logger}]", "--out", str(tmp_path / "r")]) == 2
    assert f"pip install {package}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()
    if logger == "tensorboard":            # the older switch is checked the same way
        assert main(["validate", "--set", "logging.tensorboard=true"]) == 2


class _Recorder:
    """Records every call made on it (a stand-in for a package or one of its objects)."""

    def __init__(self, **attrs):
        self.calls = []
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
        return record


def test_wandb_and_mlflow_receive_namespaced_scalars(tmp_path, monkeypatch):
    """The W&B / MLflow wiring, with stand-ins for the two packages (not installed in CI)."""
    import torchrl.record.loggers.mlflow as tl_mlflow
    import torchrl.record.loggers.wandb as tl_wandb

    run = _Recorder(id="run-123", config=_Recorder())
    wandb = _Recorder(Settings=dict)
    wandb.init = lambda **kw: wandb.calls.append(("init", (), kw)) or run
    mlflow = _Recorder(get_experiment_by_name=lambda name: None)
    mlflow.create_experiment = lambda **kw: mlflow.calls.append(("create_experiment", (), kw)) or "7"
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setattr(tl_wandb, "_has_wandb", True)
    monkeypatch.setattr(tl_mlflow, "_has_mlflow", True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("wandb", "mlflow") else real(name, *a))
    loggers = MetricLoggers(tmp_path, ["wandb", "mlflow"], run_name="fp4-run",
                            wandb={"project": "p", "entity": "e", "mode": "offline"}, mlflow={"experiment": "x"})
    loggers.log({"kind": "train", "step": 4, "loss": 0.25, "mismatch_k3": 0.5})
    init = next(kw for name, _, kw in wandb.calls if name == "init")
    assert init["project"] == "p" and init["entity"] == "e" and init["name"] == "fp4-run"
    logged = [args[0] for name, args, _ in run.calls if name == "log"]
    assert any("train/loss" in payload and payload["train/loss"] == 0.25 for payload in logged), logged
    assert ("create_experiment", (), {"name": "x", "artifact_location": (tmp_path / "mlruns").resolve().as_uri(),
                                      "tags": {"trace_rl.run": "fp4-run"}}) in mlflow.calls
    metrics = {kw["key"]: (kw["value"], kw["step"]) for name, _, kw in mlflow.calls if name == "log_metric"}
    assert metrics == {"train/loss": (0.25, 4), "drift/mismatch_k3": (0.5, 4)}
    assert '"id": "run-123"' in (tmp_path / "loggers.json").read_text()      # W&B run id kept for resume
