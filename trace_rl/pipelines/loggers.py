"""Metric loggers: every train/eval record also goes to torchrl's loggers (`torchrl.record.loggers`), with
namespaced keys. metrics.jsonl keeps the flat records (`trace-rl compare`, the plots and resume read it).

    logging:
      loggers: [csv, tensorboard]        # any of csv, tensorboard, wandb, mlflow
      wandb: {project: trace-rl, mode: offline}
      mlflow: {tracking_uri: null}       # null: a file store in the run directory (<run>/mlruns)

| logger | torchrl class | writes | needs |
|---|---|---|---|
| csv | `CSVLogger` | `<run>/csv/scalars/<namespace>/<name>.csv` (`step,value` lines) | – |
| tensorboard | `TensorboardLogger` | `<run>/tensorboard/` event files | `tensorboard` |
| wandb | `WandbLogger` | a W&B run (`mode: offline` keeps it in `<run>/wandb/`) | `wandb` |
| mlflow | `MLFlowLogger` | an MLflow run in experiment `mlflow.experiment` | `mlflow` |

A logger whose package is missing is a config error naming it (exit 2 before anything is written).

Namespaces (`namespaced(record)`): `eval/...` for evaluation records (`eval_accuracy` -> `eval/accuracy`);
for train records `drift/...` (the drift metrics, by-position breakdown and routing metrics),
`rollout/...` (reward, accuracy, response length, rollout time and throughput, policy version, lags) and
`train/...` (loss, gradient norm, clip fraction, learning rate, everything else). Each logged at the record's
step.

Resume: the CSV files are cut back to the checkpoint's step, TensorBoard events after it are purged, and W&B
continues the same run (its id is kept in `<run>/loggers.json`).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOGGER_PACKAGES: dict[str, str | None] = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb",
                                          "mlflow": "mlflow"}
ROLLOUT_KEYS = frozenset({"reward", "correct", "format_ok", "response_length", "response_at_cap", "rollout_seconds",
                          "rollout_tokens_per_s", "rollout_lag", "rollout_wait_seconds", "policy_version"})
DRIFT_PREFIXES = ("mismatch_by_position/", "routing", "correction/")
STATE_FILE = "loggers.json"


def missing_logger_packages(names: Sequence[str]) -> list[str]:
    """The loggers in `names` whose Python package is not installed, as 'name (pip install pkg)'."""
    out = []
    for name in names:
        package = LOGGER_PACKAGES[name]
        if package is not None and importlib.util.find_spec(package) is None:
            out.append(f"{name} (pip install {package})")
    return out


def _namespace(key: str) -> str:
    from trace_rl.correction.metrics import METRIC_NAMES

    if key in METRIC_NAMES or key.startswith(DRIFT_PREFIXES):
        return "drift"
    return "rollout" if key in ROLLOUT_KEYS else "train"


def namespaced(record: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a record under `train/`, `rollout/`, `drift/` or `eval/`; {} for other kinds."""
    kind = record.get("kind")
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind == "eval":
            out[f"eval/{key.removeprefix('eval_')}"] = float(value)
        elif kind == "train":
            out[f"{_namespace(key)}/{key}"] = float(value)
    return out


def _truncate_csv(folder: Path, step: int) -> None:
    """Drop the `step,value` lines logged after `step` (a resumed run logs those steps again)."""
    for path in folder.rglob("*.csv"):
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and line.endswith("\n") and int(line.split(",", 1)[0]) <= step]
        if len(kept) != len(lines):
            path.write_text("".join(kept))


def _tensorboard_logger(run_dir: Path, start_step: int):
    from torchrl.record.loggers import TensorboardLogger

    class _Resumable(TensorboardLogger):         # torchrl's, with events after the resume step purged
        def _create_experiment(self):
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(log_dir=str(Path(self.log_dir) / self.exp_name),
                                 purge_step=start_step + 1 if start_step else None)

    return _Resumable(exp_name="tensorboard", log_dir=str(run_dir))


class MetricLoggers:
    """The configured torchrl loggers of a run. `log(record)` sends `namespaced(record)` at record["step"]."""

    def __init__(self, run_dir: Path, names: Sequence[str] = (), *, run_name: str = "", start_step: int = 0,
                 wandb: dict | None = None, mlflow: dict | None = None):
        missing = missing_logger_packages(names)
        if missing:
            from trace_rl.config import ConfigError

            raise ConfigError(f"logging.loggers: missing packages for {', '.join(missing)}", ("logging.loggers",))
        self.run_dir, self.names = Path(run_dir), list(dict.fromkeys(names))
        run_name = run_name or self.run_dir.name
        state_path = self.run_dir / STATE_FILE
        saved = json.loads(state_path.read_text()) if start_step and state_path.is_file() else {}
        self.loggers: dict[str, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from torchrl.record import loggers as tl
        for name in self.names:
            if name == "csv":
                if start_step:
                    _truncate_csv(self.run_dir / "csv", start_step)
                self.loggers[name] = tl.CSVLogger(exp_name="csv", log_dir=str(self.run_dir))
            elif name == "tensorboard":
                self.loggers[name] = _tensorboard_logger(self.run_dir, start_step)
            elif name == "wandb":
                opts = dict(wandb or {})
                self.loggers[name] = tl.WandbLogger(
                    exp_name=run_name, offline=opts.get("mode", "offline") == "offline", save_dir=str(self.run_dir),
                    project=opts.get("project"), entity=opts.get("entity"),
                    id=saved.get("wandb", {}).get("id"), log_env_packages=False)
            elif name == "mlflow":
                opts = dict(mlflow or {})
                uri = opts.get("tracking_uri") or (self.run_dir / "mlruns").resolve().as_uri()
                self.loggers[name] = tl.MLFlowLogger(exp_name=opts.get("experiment", "trace-rl"), tracking_uri=uri,
                                                     tags={"trace_rl.run": run_name})
        if "wandb" in self.loggers:
            wandb_id = getattr(self.loggers["wandb"].experiment, "id", None)
            state_path.write_text(json.dumps({"wandb": {"id": wandb_id}}, indent=1))

    def log(self, record: dict) -> None:
        scalars = namespaced(record)
        if not scalars or not self.loggers:
            return
        step = int(record.get("step", 0))
        for logger in self.loggers.values():
            for key, value in scalars.items():      # NaN stays NaN: every backend here records it as such
                logger.log_scalar(key, value, step=step)

    def close(self) -> None:
        for name, logger in self.loggers.items():
            try:
                if name == "tensorboard":
                    logger.experiment.close()
                elif name == "wandb":
                    logger.experiment.finish()
                elif name == "mlflow":
                    import mlflow

                    mlflow.end_run()
                else:
                    for f in getattr(logger.experiment, "files", {}).values():
                        f.close()
            except Exception as err:            # closing must not hide the run's own outcome
                warnings.warn(f"closing the {name} logger failed: {err}", stacklevel=2)
