"""The GPU stability study (issue 21; docs/stability.md, "GPU study: how to run it"): SFT a policy, audit its
drift per plan, then GRPO runs per plan and seed, spread over 10-minute device calls.

Every device call runs the same command; it continues the study from wherever it is and returns a bundle:

    B=benchmarks/results/stability_study/bundle                    # committed: it crosses sessions
    python benchmarks/stability_study.py call --bundle $B --work runs/stab --out $OUT --budget 540
    python benchmarks/stability_study.py status --bundle $B          # here: what is done, what is left
    python benchmarks/stability_study.py report --bundle $B --docs docs/stability/gpu \\
        --raw benchmarks/results/stability_study                        # here: tables, curves, raw JSONL
    python benchmarks/stability_study.py prepare --repo /work/main --bundle /work/main/.stab --wheels /work/main/.whl
    python benchmarks/stability_study.py call --preset smoke --work /tmp/s --out /tmp/o --budget 120 --inprocess

A call: restore the study (the device disk when the machine is still warm, else the carried bundle), then
until `--budget` seconds minus `--reserve` are spent: (1) SFT the policy until its held-out accuracy is in
the band (scripts/train_study_policy.py); (2) the pre-flight: `trace-rl drift` on the policy for every
distinct precision plan, `--fail-above mismatch_k3=...`, stored beside each plan's runs; (3) the runs, in
priority order, each `trace-rl run CONFIG --out DIR --time-limit T` or `--resume DIR --time-limit T` (it
stops with a checkpoint before a step that would overrun); then the report, then the bundle in `--out`.

What survives which boundary (docs/stability.md has the arithmetic): the policy (bf16, 33 MiB) and every
run's records travel in the bundle; checkpoints (fp32 weights + AdamW: 208 MB for the policy) do not fit the
64 MiB a call may carry, so they live on the device's disk: a run interrupted at a call's end resumes
exactly if the next call finds the machine warm (calls issued back to back), and starts again from step 0
on a fresh machine (its partial records are dropped, and the call log says so).

Modules: stability_spec.py (plans, presets, the study's state), stability_restore.py (restore and pack
across calls), stability_bundle.py (the bundle format), stability_status.py (status, time estimates, report),
stability_schedule.py (which runs may share the GPU with --jobs > 1: guided plans run alone, a run out of
memory beside another is retried alone instead of counted as a crash).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))                  # trace_rl from this checkout (the H200 runs it uninstalled)
for folder in (ROOT / "benchmarks", ROOT / "scripts"):   # appended: their scripts must not shadow packages
    if str(folder) not in sys.path:
        sys.path.append(str(folder))

import stability_bundle as B  # noqa: E402
import train_study_policy as SFT  # noqa: E402
from stability_mps import MPS  # noqa: E402
from stability_restore import pack_bundle, restore  # noqa: E402
from stability_schedule import OOM_SHARED, out_of_memory, stage_runs  # noqa: E402
from stability_spec import (  # noqa: E402
    MAX_FAILURES,
    STUDY_PRESETS,
    Study,
    make_spec,
    parse_runs,
    run_config,
    timestamp,
    upgrade_spec,
)
from stability_status import cmd_report, cmd_status, status_text, step_seconds  # noqa: E402

# -- running things: in this process (tests, CPU) or as a subprocess with a hard backstop (GPU) --

def run_cli(argv: list[str], log: Path, timeout: float | None, inprocess: bool, env: dict | None = None) -> int:
    """`python -m trace_rl ARGV`, output appended to `log`. Subprocess: SIGTERM at `timeout` (the pipeline saves
    after its step and exits 143), SIGKILL 20 s later; in-process: trace_rl.cli.main (the run's own
    --time-limit stops it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"\n[{timestamp()}] trace-rl {shlex.join(argv)}\n")
        f.flush()
        if inprocess:
            from trace_rl.cli import main

            with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                try:
                    return main(argv)
                except Exception:          # one run's crash must not end the study
                    traceback.print_exc(file=f)
                    return 1
        proc = subprocess.Popen([sys.executable, "-m", "trace_rl", *argv], stdout=f, stderr=subprocess.STDOUT,
                                cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()


class GPUSampler:
    """Mean GPU utilisation while runs are going (NVML; None without a GPU): tells the next session whether
    `--jobs 2` (two runs sharing the GPU) would help."""

    def __init__(self):
        self.samples: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception:
            self._handle = None

    def __enter__(self):
        if self._handle is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(2.0):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc):
        self._stop.set()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


# -- the stages of a call --

def stage_sft(study: Study, deadline: float, log) -> bool:
    info = study.policy_info()
    if info is not None and info.get("done"):
        return True
    if info is not None and info.get("exhausted"):
        log(f"SFT reached max_steps at held-out accuracy {info['accuracy']} < the band's {info['recipe']['band'][0]}: "
            f"no RL on this policy. Make RECIPES[{study.spec['recipe']!r}] easier or longer "
            f"(scripts/train_study_policy.py) and start a new study (new --work and bundle)")
        return False
    recipe = SFT.RECIPES[study.spec["recipe"]]
    device = "cpu" if study.spec["rl"]["model"].get("device") == "cpu" else None
    info = SFT.train(recipe, study.work / "sft", study.policy, deadline=deadline, device=device, log=log)
    study.journal({"stage": "sft", "step": info["step"], "done": info["done"], "accuracy": info["accuracy"],
                   "in_band": info["in_band"], "exhausted": info["exhausted"]})
    with contextlib.suppress(Exception):
        import torch

        torch.cuda.empty_cache()
    return bool(info["done"])


def drift_groups(study: Study) -> dict[str, dict]:
    """Distinct rollout/trainer precisions among the study's plans: {drift name: {"plans": [...], "preset"}}."""
    from trace_rl.plan import PRESETS, PrecisionPlan

    groups: dict[str, dict] = {}
    for plan in dict.fromkeys(p for p, _ in study.order()):
        precision = run_config(study, plan, 0).precision
        name = next((n for n, pr in PRESETS.items() if not pr.corrections and PrecisionPlan(**pr.plan) == precision),
                    plan)
        groups.setdefault(name, {"plans": [], "preset": name in PRESETS})["plans"].append(plan)
    return groups


def stage_preflight(study: Study, deadline: float, inprocess: bool, log) -> bool:
    """`trace-rl drift` on the policy for each distinct precision (one command for the presets, one per custom
    plan), `--fail-above mismatch_k3=X`; each plan gets runs/<plan>/preflight.json (metrics, verdict, command)."""
    spec = study.spec
    groups = drift_groups(study)
    todo = [g for g in groups if not all((study.runs / p / "preflight.json").is_file() for p in groups[g]["plans"])]
    if not todo:
        return True
    if time.time() + spec["preflight_seconds"] > deadline:
        return False
    pf = spec["preflight"]
    commands = []
    # presets share one command; guided plans (their own engine path) and custom plans get their own, so one
    # failing path does not lose the others' audit
    presets = [g for g in todo if groups[g]["preset"] and "guided" not in g]
    if presets:
        commands.append((presets, "presets", ["--plans", ",".join(presets)], groups[presets[0]]["plans"][0]))
    commands += [([g], g, ["--plans", g] if groups[g]["preset"] else [], groups[g]["plans"][0])
                 for g in todo if g not in presets]
    for names, folder, plans_arg, plan in commands:
        cfg_file = write_config(study, plan, 0)
        out = study.work / "preflight" / folder
        argv = ["drift", str(cfg_file), "--model", str(study.policy.resolve()), *plans_arg,
                "--num-prompts", str(pf["num_prompts"]), "--samples", str(pf["samples"]), "--seed", "0",
                "--max-batch", str(pf["num_prompts"] * pf["samples"]),
                "--fail-above", f"mismatch_k3={spec['k3_fail_above']}", "--out", str(out)]
        if spec["rl"]["model"].get("device") == "cpu":
            argv += ["--device", "cpu"]
        t0 = time.time()
        rc = run_cli(argv, study.work / "preflight" / f"{folder}.log", max(60.0, deadline - time.time()), inprocess)
        if rc not in (0, 1) or not (out / "drift.json").is_file():
            study.journal({"stage": "preflight", "plans": names, "rc": rc, "error": "see the preflight log"})
            log(f"preflight {names}: FAILED (rc {rc}); see {study.work / 'preflight' / f'{folder}.log'}")
            continue
        drift = json.loads((out / "drift.json").read_text())
        for entry in drift["plans"]:
            verdict = "fail" if any(v.startswith(f"{entry['name']}:") for v in drift["violations"]) else "pass"
            group = entry["name"] if len(names) > 1 else names[0]     # a custom plan's drift is named by its label
            for member in groups.get(group, {"plans": []})["plans"]:
                target = study.runs / member / "preflight.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps({
                    "drift_plan": entry["name"], "label": entry.get("label"), "verdict": verdict,
                    "fail_above": drift["fail_above"], **{k: entry["metrics"][k] for k in entry["metrics"]},
                    "command": "trace-rl " + shlex.join(argv), "seconds": time.time() - t0}, indent=1))
        log(f"preflight {', '.join(names)}: " + ", ".join(
            f"{e['name']} k3 {e['metrics']['mismatch_k3']:.3g}" for e in drift["plans"]) + f" (rc {rc})")
        study.journal({"stage": "preflight", "plans": names, "rc": rc, "seconds": time.time() - t0})
    return True


def write_config(study: Study, plan: str, seed: int) -> Path:
    path = study.work / "configs" / f"{plan}-seed{seed}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_config(study, plan, seed).to_yaml())
    return path


def launch(study: Study, plan: str, seed: int, deadline: float, inprocess: bool, log,
           run_limit: float | None = None, shared=None) -> dict:
    """Start, resume or restart one run until it finishes or the call's time is up; returns its status.
    `shared()` (after the run): whether another run was going beside it; out of CUDA memory then is not
    counted as a failure (state OOM_SHARED, marked exclusive: stability_schedule.py)."""
    from trace_rl.pipelines.checkpoint import CheckpointError, find_checkpoint
    from trace_rl.pipelines.collapse import recorded_collapse
    from trace_rl.pipelines.run_log import read_history

    run_dir, status = study.run_dir(plan, seed), study.status(plan, seed)
    cfg_file = write_config(study, plan, seed)
    limit = max(1.0, deadline - time.time())
    if run_limit is not None:
        limit = min(limit, run_limit)
    try:
        step = int(find_checkpoint(run_dir).state["step"])
        argv, how = ["run", "--resume", str(run_dir)], f"resume from step {step}"
    except CheckpointError:
        restarted = run_dir.is_dir() and any(run_dir.iterdir())
        argv = ["run", str(cfg_file), "--no-default", "--out", str(run_dir), *(["--overwrite"] if restarted else [])]
        how = "restart from step 0 (no checkpoint here: a fresh machine)" if restarted else "start"
    argv += ["--time-limit", f"{limit:g}" if limit < 1 else f"{limit:.0f}"]
    status["attempts"] = status.get("attempts", 0) + 1
    status["commands"] = [*status.get("commands", []), f"python -m trace_rl {shlex.join(argv)}"]
    status["state"] = "running"
    study.set_status(plan, seed, status)
    log(f"{plan} seed {seed}: {how} (time limit {limit:.0f} s)")
    t0, log_file = time.time(), run_dir.with_suffix(".log")
    seen = log_file.stat().st_size if log_file.is_file() else 0
    rc = run_cli(argv, log_file, limit + 10, inprocess)   # backstop: the run stops itself
    beside = bool(shared and shared())
    status = {**study.status(plan, seed), "attempts": status["attempts"], "commands": status["commands"],
              "failures": status.get("failures", 0)}
    status["seconds"] = status.get("seconds", 0.0) + time.time() - t0
    if status["state"] != "finished":
        status["state"] = {142: "interrupted", 143: "interrupted", 130: "interrupted"}.get(rc, "failed")
        collapse = recorded_collapse(read_history(run_dir)) if run_dir.is_dir() else None
        if rc == 1 and collapse is not None and collapse["reason"] == "non-finite":
            status["state"] = "diverged"            # stopped on a non-finite gradient: a result, not a crash
        if status["state"] == "failed":
            text = log_file.read_text()
            status["error"] = "\n".join(text.splitlines()[-15:])
            if beside and out_of_memory(text[seen:]):
                status["state"] = OOM_SHARED
                status["exclusive"] = (f"ran out of CUDA memory beside another run ({timestamp()}): runs alone "
                                       f"from now on")
                log(f"{plan} seed {seed}: out of CUDA memory beside another run: not counted as a failure "
                    f"({status['failures']} of {MAX_FAILURES}); it will be retried alone. The end of its log:\n    "
                    + status["error"].replace("\n", "\n    "))
            else:
                status["failures"] = status.get("failures", 0) + 1
                log(f"{plan} seed {seed}: FAILED; the end of its log:\n    " + status["error"].replace("\n", "\n    "))
    measured = step_seconds(run_dir)
    if measured is not None:          # kept: a restart from step 0 (--overwrite) drops the records
        status["measured_step_seconds"], status["measured_beside_another"] = measured, beside
    status["rc"] = rc
    study.set_status(plan, seed, status)
    study.journal({"stage": "run", "plan": plan, "seed": seed, "how": how, "rc": rc, "state": status["state"],
                   "seconds": time.time() - t0, "beside_another": beside})
    log(f"{plan} seed {seed}: {status['state']} (rc {rc}, {time.time() - t0:.0f} s)")
    return status


def call(args) -> int:
    start = time.time()
    deadline = start + args.budget - args.reserve
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "call.log").open("a")

    def log(message: str) -> None:
        line = f"[{time.time() - start:6.1f}s] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    spec = make_spec(args.preset, args.set or [], args.runs, args.steps) if args.preset else None
    study = restore(Path(args.work).resolve(), Path(args.bundle) if args.bundle else None, spec, log)
    if args.runs:                                  # scheduling may change between calls (e.g. harder settings)
        study.spec["order"] = parse_runs(args.runs)
    elif spec is not None and spec != {k: v for k, v in study.spec.items() if k != "additions"}:
        log("note: --preset/--set/--steps apply only when a study starts; this one continues with its own spec")
    for plan, seed in (r.split(":") for r in parse_runs(args.retry)) if args.retry else ():
        status = study.status(plan, int(seed))           # a crash fixed in the code: try the run again
        log(f"{plan} seed {seed}: failures {status.get('failures', 0)} -> 0 (--retry)")
        study.set_status(plan, int(seed), {**status, "failures": 0, "retried_after": status.get("error", "")})
    study.generation += 1
    study.save()
    study.journal({"stage": "call", "generation": study.generation, "budget": args.budget})
    for note in upgrade_spec(study):                # settings added to the presets since this study began
        log(note)
    mps = MPS(log) if args.mps and not args.inprocess else contextlib.nullcontext()
    with GPUSampler() as gpu, mps:
        if args.mps:
            study.journal({"stage": "mps", "active": bool(getattr(mps, "active", False))})
        try:
            if stage_sft(study, deadline, log) and stage_preflight(study, deadline, args.inprocess, log):
                stage_runs(study, deadline, args.inprocess, args.jobs, log, args.run_time_limit,
                           args.only_finishable, launch=launch, share_trainers=args.share_trainers)
        except Exception:                       # whatever broke, the bundle below keeps what was done
            log("call stage FAILED:\n" + traceback.format_exc())
            study.journal({"stage": "error", "traceback": traceback.format_exc()[-2000:]})
    if gpu.mean is not None:
        study.journal({"stage": "gpu", "mean_utilization": gpu.mean, "samples": len(gpu.samples)})
        log(f"GPU utilisation while running: {gpu.mean:.0f}% mean over {len(gpu.samples)} samples")
    try:
        from trace_rl.audit.study_report import write_report

        if study.runs.is_dir():
            write_report(study.runs, study.work / "report", title=f"stability study ({study.spec['preset']})",
                         order=[p for p, _ in study.order()])
    except Exception:
        log("report FAILED (the raw records are in the bundle):\n" + traceback.format_exc())
    log(status_text(study))
    log_file.close()
    manifest = pack_bundle(study, out)
    problems = B.check_out(out)
    print(f"bundle generation {manifest['generation']} in {out}: {', '.join(sorted(os.listdir(out)))}"
          + (f"; PROBLEMS: {'; '.join(problems)}" if problems else ""), flush=True)
    return 1 if problems else 0


def cmd_prepare(args) -> int:
    """Here, before the first call: the carried folder with the core wheels (no Transformer Engine: 32 MiB
    the study does not use), git-excluded, and the size a call would send."""
    repo, bundle = Path(args.repo), Path(args.bundle)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for w in sorted(Path(args.wheels).glob("*.whl")):
        if not w.name.startswith("transformer_engine") and not (wheels / w.name).exists():
            shutil.copy(w, wheels / w.name)
    exclude = repo / ".git" / "info" / "exclude"
    rel = f"/{bundle.resolve().relative_to(repo.resolve())}/"
    if exclude.is_file() and rel not in exclude.read_text().split():
        with exclude.open("a") as f:
            f.write(f"{rel}\n")
    size = B.carry_size(repo, [bundle])
    policy = 34 * 2**20 if not (bundle / B.MANIFEST).is_file() else 0
    print(f"checkout {size['checkout'] / 2**20:.1f} MiB + {bundle} {size['carried'] / 2**20:.1f} MiB = "
          f"{size['total'] / 2**20:.1f} MiB now" + (f", ~{(size['total'] + policy) / 2**20:.1f} MiB once the "
                                                     f"policy is in it" if policy else "")
          + f" (limit {size['limit'] / 2**20:.0f} MiB)")
    return 0 if size["total"] + policy <= size["limit"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("call", help="continue the study within a budget; write the bundle to --out")
    c.add_argument("--work", required=True, help="the study's folder on this machine (device disk)")
    c.add_argument("--bundle", help="the carried bundle of the last call (absent on the first call)")
    c.add_argument("--out", required=True, help="where the new bundle goes ($OUT)")
    c.add_argument("--budget", type=float, default=540.0, help="seconds this call may take (default 540)")
    c.add_argument("--reserve", type=float, default=30.0, help="seconds kept for the report and the bundle")
    c.add_argument("--preset", choices=sorted(STUDY_PRESETS), help="start a study: gpu (the real one) or smoke")
    c.add_argument("--set", action="append", help="KEY=VALUE for every run's config (only when a study starts)")
    c.add_argument("--steps", type=int, help="RL steps per run (only when a study starts; default 150)")
    c.add_argument("--runs", help="PLAN:SEED,... the runs and their order, kept for later calls (default: the "
                                  "preset's; for gpu the issue's 10)")
    c.add_argument("--jobs", type=int, default=1, help="runs sharing the GPU at once (default 1); guided plans "
                                                         "and runs that ran out of memory beside another run alone "
                                                         "(stability_schedule.py)")
    c.add_argument("--share-trainers", action="store_true",
                   help="with --jobs > 1: plans whose trainer is exclusive by default (guided) may share the GPU; "
                        "one that runs out of memory beside another run is still retried alone")
    c.add_argument("--mps", action="store_true",
                   help="with --jobs > 1: start CUDA MPS so the runs' kernels overlap on the GPU (stability_mps.py; "
                        "logged, and time-slicing as before when MPS cannot start)")
    c.add_argument("--retry", help="PLAN:SEED,... runs that crashed MAX_FAILURES times, to try again after the "
                                   "cause was fixed (their failure count goes back to 0)")
    c.add_argument("--only-finishable", action="store_true",
                   help="start only runs that can finish in this call by the measured step times (a session's "
                        "last call: the next session starts a fresh machine, where an unfinished run restarts)")
    c.add_argument("--inprocess", action="store_true", help="runs in this process (CPU, tests), no subprocesses")
    c.add_argument("--run-time-limit", type=float, help="cap on each run's --time-limit (0: every run stops after "
                                                        "one step, which is how the tests cross a call boundary)")
    c.set_defaults(func=call)
    for name, fn, helptext in (("status", cmd_status, "what is done and what is left (calls, sessions)"),
                               ("report", cmd_report, "tables and curves from the raw records")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--bundle", help="a bundle folder (the committed benchmarks/results/stability_study/bundle)")
        s.add_argument("--work", help="or a study folder")
        s.add_argument("--tmp", default="runs/stab-local", help="where a bundle is unpacked (default runs/stab-local)")
        if name == "report":
            s.add_argument("--docs", default="runs/stab-report", help="report.md, report.json, curves.png go here")
            s.add_argument("--raw", help="copy every run's metrics.jsonl and pre-flight JSON here")
            s.add_argument("--title", default="Stability study on the H200")
        s.set_defaults(func=fn)
    p = sub.add_parser("prepare", help="before the first call: the carried folder, its wheels and size")
    p.add_argument("--repo", default=str(ROOT))
    p.add_argument("--bundle", required=True)
    p.add_argument("--wheels", required=True)
    p.set_defaults(func=cmd_prepare)
    args = ap.parse_args(argv)
    if getattr(args, "cmd", None) in ("status", "report") and not (args.bundle or args.work):
        ap.error(f"{args.cmd}: give --bundle or --work")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
