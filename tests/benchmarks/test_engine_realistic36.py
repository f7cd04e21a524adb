"""benchmarks/engine_realistic36{.py,_h200.sh} (check `real36`): the summary of fake per-plan JSON (a good run, a
guard-skipped / killed / not-started plan, a layer-cut run, lengths not met), the driver's own time guard (a plan not
started with too little left, one killed at the deadline, the summary rewritten after each plan), each plan's
command, and the script end to end on CPU with the tiny preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import engine_realistic36 as r36

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRAWN = {"honoured": True, "drawn_mean": 2178.2, "mean": 2178.2, "median": 1619.0, "max": 8192, "at_max": 9}


def _row(plan, tps, layers=36, **kw):
    return {"plan": plan, "seconds": 60.0, "estimate_s": 50.0, "estimate": {"probe_s": 4.0}, "layers": layers,
            "full_layers": 36, "tokens_per_s": tps, "lengths": dict(DRAWN), "operand_cache_kind": None, **kw}


def _write(tmp_path, plan, rows=(), skipped=(), errors=()):
    (tmp_path / plan).mkdir()
    (tmp_path / plan / "rollout.json").write_text(json.dumps(
        {"realistic": list(rows), "realistic_skipped": list(skipped), "errors": list(errors),
         "args": {"realistic_median": 1500.0, "realistic_sigma": 1.0, "realistic_max": 8192}}))


def _good(tmp_path):
    tps = {"bf16": 10000.0, "w4a4-kv4": 15000.0, "w4a4-kv4-mx": 12000.0, "fp8": 11000.0, "w4a16": 9000.0}
    for plan, t in tps.items():
        _write(tmp_path, plan, [_row(plan, t, operand_cache_kind={"w4a4-kv4": "bf16", "w4a4-kv4-mx": "fp8"}.get(plan))])
    return {p: {"rc": 0, "process_s": 90.0, "timed_out": False} for p in tps}


def test_summary_of_a_good_run(tmp_path):
    metas = _good(tmp_path)
    s = r36.summarize(str(tmp_path), list(r36.PLANS), metas)
    assert list(s)[0] == "headline" and s["headline"]["ok"]
    assert s["not_measured"] == [] and s["all_layers"] and s["lengths_honoured"] and not s["errors"]
    assert s["headline"]["tokens_per_s"]["w4a4-kv4"] == 15000.0
    assert s["headline"]["fp4_vs_bf16"] == {"w4a4-kv4": 1.5, "w4a4-kv4-mx": 1.2}
    assert s["headline"]["fp4_faster_than_bf16"] == {"w4a4-kv4": True, "w4a4-kv4-mx": True}
    run = s["runs"][1]
    assert (run["plan"], run["wall_s"], run["estimate_s"], run["wall_vs_estimate"]) == ("w4a4-kv4", 60.0, 50.0, 1.2)
    assert run["probe_s"] == 4.0 and run["process_s"] == 90.0 and run["operand_cache_kind"] == "bf16"
    assert s["lengths"]["requested"] == {"median": 1500.0, "sigma": 1.0, "max": 8192}


def test_summary_says_what_was_not_measured(tmp_path):
    _write(tmp_path, "bf16", [_row("bf16", 10000.0)])
    _write(tmp_path, "w4a4-kv4", skipped=[{"plan": "w4a4-kv4", "skipped": "estimated 300 s ... does not fit the 200 "
                                                                         "s left before the deadline",
                                           "estimate_s": 300.0}])
    (tmp_path / "w4a4-kv4-mx.log").write_text("[ 10.0s] realistic probe: ...\n")
    metas = {"bf16": {"rc": 0, "process_s": 100.0}, "w4a4-kv4": {"rc": 1, "process_s": 40.0},
             "w4a4-kv4-mx": {"rc": 124, "process_s": 200.0, "timed_out": True},
             "fp8": {"not_started": "30 s left before the deadline, < --min-plan-s 60 (a build and probe)"}}
    s = r36.summarize(str(tmp_path), list(r36.PLANS), metas)
    assert not s["headline"]["ok"] and s["headline"]["fp4_vs_bf16"] == {}
    why = {x["plan"]: x["why"] for x in s["not_measured"]}
    assert why["w4a4-kv4"].startswith("time guard: estimated 300 s")
    assert s["not_measured"][0]["estimate_s"] == 300.0
    assert why["w4a4-kv4-mx"].startswith("killed at the deadline after 200 s")
    assert "realistic probe" in s["log_tail"]["w4a4-kv4-mx"][0]
    assert why["fp8"].startswith("not started: 30 s left") and why["w4a16"] == "not run yet"
    assert s["all_layers"] and s["lengths_honoured"]          # of what ran


def test_layer_cut_and_unmet_lengths_are_not_ok(tmp_path):
    _write(tmp_path, "bf16", [_row("bf16", 10000.0, layers=2)])
    _write(tmp_path, "w4a4-kv4", [_row("w4a4-kv4", 12000.0, lengths={**DRAWN, "honoured": False})])
    metas = {"bf16": {"rc": 0}, "w4a4-kv4": {"rc": 0}}
    s = r36.summarize(str(tmp_path), ["bf16", "w4a4-kv4"], metas)
    assert not s["all_layers"] and not s["lengths_honoured"] and not s["headline"]["ok"]
    _write(tmp_path, "fp8", [_row("fp8", 9000.0, lengths={**DRAWN, "drawn_mean": 1.0})])   # another draw
    s = r36.summarize(str(tmp_path), ["fp8"], {"fp8": {"rc": 0}})
    assert s["lengths_honoured"]
    s = r36.summarize(str(tmp_path), ["w4a4-kv4", "fp8"], {"w4a4-kv4": {"rc": 0}, "fp8": {"rc": 0}})
    assert not s["lengths_honoured"]


def test_failed_plan_names_its_error(tmp_path):
    _write(tmp_path, "bf16", errors=[{"part": "realistic qwen3-8b bf16", "error": "OutOfMemoryError: CUDA"}])
    s = r36.summarize(str(tmp_path), ["bf16"], {"bf16": {"rc": 1, "process_s": 5.0}})
    assert s["not_measured"][0]["why"] == "failed: OutOfMemoryError: CUDA" and s["errors"][0]["plan"] == "bf16"
    assert not s["headline"]["ok"] and not s["all_layers"]


def test_plan_commands():
    args = r36.parse_args(["--out", "/o", "--bench-args", "--device cpu --prompt-len 5"])
    cmd = r36.plan_command(args, "w4a4-kv4", 1234.56)
    joined = " ".join(cmd)
    assert "--realistic-plans w4a4-kv4 --realistic-prompts 32 --group 8" in joined
    assert "--realistic-layers 0" in joined and "--realistic-deadline 1234.6" in joined
    assert "--engine-attention w4a4-kv4=gluon --realistic-operand-cache w4a4-kv4 --realistic-uncached 0" in joined
    assert joined.index("--prompt-len 256") < joined.index("--prompt-len 5")       # the test's args come last
    assert cmd[-2:] == ["--out", "/o/w4a4-kv4"]
    mx = " ".join(r36.plan_command(args, "w4a4-kv4-mx", 1.0))
    assert "--realistic-operand-cache w4a4-kv4-mx=fp8 --realistic-uncached 0" in mx
    assert "operand-cache" not in " ".join(r36.plan_command(args, "fp8", 1.0))


def test_driver_time_guard(tmp_path):
    """A fake clock and runner: bf16 runs 200 s, w4a4-kv4 is killed at the deadline, w4a4-kv4-mx is not started
    (less than --min-plan-s left); the summary is on disk after each plan."""
    clock = types.SimpleNamespace(t=1000.0)
    seen = []

    def runner(cmd, stdout, stderr, timeout):
        plan = cmd[cmd.index("--realistic-plans") + 1]
        seen.append((plan, timeout, os.path.exists(tmp_path / "summary.json")))
        if plan == "w4a4-kv4":
            clock.t += timeout
            raise subprocess.TimeoutExpired(cmd, timeout)
        clock.t += 200.0
        _write(tmp_path, plan, [_row(plan, 10000.0)])
        return types.SimpleNamespace(returncode=0)

    args = r36.parse_args(["--out", str(tmp_path), "--budget-s", "490", "--plans", "bf16,w4a4-kv4,w4a4-kv4-mx"])
    metas = r36.run_plans(args, runner=runner, clock=lambda: clock.t)
    deadline_left = 490 - r36.SUMMARY_S
    assert seen == [("bf16", deadline_left, False), ("w4a4-kv4", deadline_left - 200, True)]
    assert metas["bf16"]["rc"] == 0 and metas["w4a4-kv4"] == {"rc": 124, "process_s": 285.0, "timed_out": True}
    assert metas["w4a4-kv4-mx"]["not_started"].startswith("0 s left")
    s = json.loads((tmp_path / "summary.json").read_text())
    assert [x["plan"] for x in s["not_measured"]] == ["w4a4-kv4", "w4a4-kv4-mx"]
    assert s["headline"]["tokens_per_s"] == {"bf16": 10000.0}


def test_script_tiny_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "MODEL": "tiny", "PLANS": "bf16,w4a16",
           "PROMPTS": "1", "BENCH_ARGS": "--realistic-max 48 --realistic-median 20 --prompt-len 5 --device cpu"}
    done = subprocess.run(["bash", "benchmarks/engine_realistic36_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["headline"]["ok"], s
    assert s["not_measured"] == [] and s["all_layers"] and s["lengths_honoured"] and not s["errors"]
    assert [r["plan"] for r in s["runs"]] == ["bf16", "w4a16"]
    for r in s["runs"]:
        assert r["layers"] == r["full_layers"] == 4 and r["rows"] == 8 and r["tokens_per_s"] > 0
        assert r["estimate_s"] > 0 and r["wall_s"] > 0 and r["probe_s"] > 0 and r["process_s"] > r["wall_s"]
    assert s["lengths"]["requested"] == {"median": 20.0, "sigma": 1.0, "max": 48}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "bf16.log", "driver.log", "summary.json", "w4a16",
                                                          "w4a16.log"]


def test_registered_as_a_whole_call_check():
    """`real36` runs alone: named only (not in the default order), started with >= 500 s left, given what is left."""
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "real36) BUDGET_S=$(( left - 10 )) bash benchmarks/engine_realistic36_h200.sh" in checks
    assert "real36) echo 500;;" in checks and "#   real36   benchmarks/engine_realistic36_h200.sh" in checks
    default = checks[checks.index('NAMES=${*:-"'):].split("\n")[0]
    assert "real36" not in default
