"""The GPU stability study's driver, end to end on CPU at the smoke scale (0.1M-parameter policy, 2 RL steps
per plan): SFT, pre-flight drift per plan, every plan's run, collapse detection, the report, and the bundle
across simulated device calls: a run cut by a call's end restarts on a fresh machine and resumes exactly on
a warm one. The bf16 held-out evaluation (loop.eval_reference) is added to the spec of a study that began without
it: the runs started from then on carry it, the finished one keeps its records."""

import json
import shutil

import stability_study as S

from trace_rl.pipelines.run_log import read_history

# every run collapses at step 2 by the entropy rule (any entropy > 1e-9 x the first step's): the collapse path
# end to end, and across a resume (the rule's baseline, step 1, comes from the records before it)
FORCE_COLLAPSE = ["--set", "loop.collapse.entropy_window=1", "--set", "loop.collapse.entropy_blowup=1e-9"]


def call(work, out, bundle=None, *extra):
    argv = ["call", "--work", str(work), "--out", str(out), "--budget", "900", "--reserve", "5", "--inprocess",
            *extra, *(["--bundle", str(bundle)] if bundle else [])]
    return S.main(argv)


def carry(out, bundle):
    """What the session does after each call: copy the call's $OUT files into the carried folder."""
    bundle.mkdir(exist_ok=True)
    for f in out.iterdir():
        shutil.copy(f, bundle / f.name)


def train_steps(run_dir):
    return [r["step"] for r in read_history(run_dir) if r["kind"] == "train"]


def evals(run_dir):
    return [r for r in read_history(run_dir) if r["kind"] == "eval"]


def test_the_study_across_device_calls(tmp_path, capsys, monkeypatch):
    bundle, m1, m2, m3 = tmp_path / "stab", tmp_path / "machine1", tmp_path / "machine2", tmp_path / "machine3"
    # calls 1 and 2 run a study that began before the presets had loop.eval_reference
    monkeypatch.delitem(S.STUDY_PRESETS["smoke"]["rl"]["loop"], "eval_reference")

    # call 1, fresh machine: SFT, the pre-flight audit, then fp4 makes one step before the call's time is up
    assert call(m1, tmp_path / "o1", None, "--preset", "smoke", *FORCE_COLLAPSE, "--runs", "fp4:0",
                "--run-time-limit", "0") == 0
    out1 = sorted(p.name for p in (tmp_path / "o1").iterdir())
    assert "policy.tar.00" in out1 and "study.tgz.00" in out1 and len(out1) <= 8
    study = S.Study.load(m1)
    assert study.policy_info()["done"] and study.status("fp4", 0)["state"] == "interrupted"
    assert train_steps(study.run_dir("fp4", 0)) == [1]
    pre = json.loads((m1 / "runs" / "fp4" / "preflight.json").read_text())
    assert pre["drift_plan"] == "fp4" and pre["verdict"] in ("pass", "fail") and pre["mismatch_k3"] > 0
    assert pre["command"].startswith("trace-rl drift ") and "--fail-above mismatch_k3=0.01" in pre["command"]
    carry(tmp_path / "o1", bundle)

    # call 2, another fresh machine: the bundle has fp4's records but no checkpoint, so fp4 starts over
    assert call(m2, tmp_path / "o2", bundle, "--runs", "fp4:0") == 0
    assert not any(p.name.startswith("policy.tar") for p in (tmp_path / "o2").iterdir())   # unchanged: not resent
    study = S.Study.load(m2)
    status = study.status("fp4", 0)
    assert status["state"] == "finished" and "--overwrite" in status["commands"][-1]
    assert train_steps(study.run_dir("fp4", 0)) == [1, 2]
    assert evals(study.run_dir("fp4", 0)) and not any("eval_ref_accuracy" in r for r in evals(study.run_dir("fp4", 0)))
    fp4_records = (study.run_dir("fp4", 0) / "metrics.jsonl").read_text()
    carry(tmp_path / "o2", bundle)
    monkeypatch.undo()           # the presets as they are now: call 3 adds loop.eval_reference to the study's spec

    # calls 3 and 4 on the same machine (warm): bf16 is cut after step 1, then resumes exactly from its checkpoint
    assert call(m2, tmp_path / "o3", bundle, "--runs", "bf16:0", "--run-time-limit", "0") == 0
    carry(tmp_path / "o3", bundle)
    assert call(m2, tmp_path / "o4", bundle, "--runs", ",".join(S.STUDY_PRESETS["smoke"]["order"])) == 0
    carry(tmp_path / "o4", bundle)
    study = S.Study.load(m2)
    assert study.spec["rl"]["loop"]["eval_reference"] is True
    assert [(a["key"], a["from_generation"]) for a in study.spec["additions"]] == [("rl.loop.eval_reference", 3)]
    journal = [json.loads(line) for line in (m2 / "calls.jsonl").read_text().splitlines()]
    assert [e["key"] for e in journal if e["stage"] == "spec"] == ["rl.loop.eval_reference"]     # added once
    assert (study.run_dir("fp4", 0) / "metrics.jsonl").read_text() == fp4_records                # finished: as it was
    for plan in ("fp8", "fp4-tis", "fp4-geo", "fp4-aligned", "fp4-guided"):                       # started after
        assert all("eval_ref_accuracy" in r for r in evals(study.run_dir(plan, 0))), plan
    assert not any("eval_ref_accuracy" in r for r in evals(study.run_dir("bf16", 0)))   # bf16: one eval is enough
    assert "--resume" in study.status("bf16", 0)["commands"][-1]
    resumes = [r for r in read_history(study.run_dir("bf16", 0)) if r["kind"] == "resume"]
    assert [r["step"] for r in resumes] == [1]
    for plan in S.STUDY_PRESETS["smoke"]["order"]:
        name = plan.split(":")[0]
        history = read_history(study.run_dir(name, 0))
        assert [r["step"] for r in history if r["kind"] == "train"] == [1, 2], name
        (collapse,) = [r for r in history if r["kind"] == "collapse"]
        assert collapse["step"] == 2 and collapse["reason"] == "entropy", name
        train = [r for r in history if r["kind"] == "train"]
        assert all(k in train[-1] for k in ("mismatch_by_position/ess/0-1", "response_at_cap", "entropy")), name
    tis = [r for r in read_history(study.run_dir("fp4-tis", 0)) if r["kind"] == "train"]
    assert "correction/token_tis/frac_truncated" in tis[-1]

    # call 5 on a fresh machine: everything is done; the policy comes back from call 1's parts
    assert call(m3, tmp_path / "o5", bundle) == 0
    assert S.Study.load(m3).policy_info()["weights_sha256"] == study.policy_info()["weights_sha256"]

    # here: status and the report from the carried bundle alone
    capsys.readouterr()
    assert S.main(["status", "--bundle", str(bundle), "--tmp", str(tmp_path / "unpacked")]) == 0
    status = capsys.readouterr().out
    assert "left: ~0 device-minutes" in status
    info = study.policy_info()                      # read from the bundle's policy parts, which status does not unpack
    assert f"policy: done (step {info['step']}, held-out accuracy {info['accuracy']})" in status
    assert not (tmp_path / "unpacked" / "policy").exists()
    assert S.main(["report", "--bundle", str(bundle), "--tmp", str(tmp_path / "unpacked"),
                   "--docs", str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]) == 0
    report = (tmp_path / "docs" / "report.md").read_text()
    for plan in ("bf16", "fp8", "fp4", "fp4-tis", "fp4-geo", "fp4-aligned", "fp4-guided"):
        assert f"| {plan} | 1 |" in report and (tmp_path / "raw" / f"{plan}-seed0.jsonl").is_file(), plan
        assert (tmp_path / "raw" / f"{plan}-seed0.yaml").is_file(), plan          # the config its command names
    assert "| 2 (entropy) |" in report and "python -m trace_rl run" in report
    assert "| at bf16: start → final | best at bf16 |" in report
    assert "| fp4 | 0 | finished | 2/2 | 0.000 → 0.000 | 0.000 | – → – | – |" in report       # begun without it
    assert "without loop.eval_reference): fp4 seed 0." in report
    assert (tmp_path / "docs" / "curves.png").stat().st_size > 0
    rows = json.loads((tmp_path / "docs" / "report.json").read_text())["plans"]
    assert rows["fp4"]["degraded"] and rows["fp4"]["verdict"] in ("pass", "fail")
