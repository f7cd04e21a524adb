"""Guard rails: corrections that mask (almost) every token are warned about in the log and the progress bar,
and `loop.stop_when_masked` stops the run (exit 1) with a checkpoint."""

import logging

from trace_rl.cli import main
from trace_rl.pipelines import build
from trace_rl.pipelines.run_log import read_history

from .test_run import small

# verl's geometric-rejection preset is [0.999, 1.001]; tighter still, so an FP4 batch is all rejected
REJECT_ALL = [{"kind": "geo_reject", "params": {"lo": 0.99999, "hi": 1.00001}}]


def test_warns_in_the_log_and_the_progress_bar(tmp_path, caplog, capsys):
    cfg = small(1, **{"corrections": REJECT_ALL, "logging.progress": True})
    with caplog.at_level(logging.WARNING, logger="trace_rl"):
        build(cfg, run_dir=tmp_path / "run").run()
    (record,) = [r for r in read_history(tmp_path / "run") if r["kind"] == "train"]
    assert record["frac_masked_tokens"] >= 0.99
    assert any("the corrections masked" in m and "GeometricRejection" in m for m in caplog.messages)
    err = capsys.readouterr().err
    assert "trace-rl: warning: step 1: the corrections masked" in err and "MASKED=" in err


def test_no_warning_when_the_corrections_keep_tokens(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trace_rl"):
        build(small(1), run_dir=tmp_path / "run").run()          # token TIS masks nothing
    assert not [m for m in caplog.messages if "corrections masked" in m]


def test_stop_when_masked_exits_1_with_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--set", "corrections=[{kind: geo_reject, params: {lo: 0.99999, hi: 1.00001}}]",
                 "--set", "loop.stop_when_masked=true", "--set", "loop.steps=3", "--set", "loop.prompts_per_step=4",
                 "--set", "loop.group_size=4", "--set", "loop.eval_prompts=8", "--set", "logging.progress=false",
                 "--set", "logging.plot=false", "--out", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    assert "step 1: the corrections masked" in err and "stopped (loop.stop_when_masked" in err
    assert [r["step"] for r in read_history(out) if r["kind"] == "train"] == [1]
    assert (out / "checkpoint" / "state.json").is_file()
