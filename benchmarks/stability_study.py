"""The GPU stability study (issue 21; docs/stability.md, "GPU study: how to run it"): SFT a policy, audit its
drift per plan, then GRPO runs per plan and seed, spread over 10-minute device calls.

Every device call runs the same command; it continues the study from wherever it is and returns a bundle:

    python benchmarks/stability_study.py call --bundle .stab --work runs/stab --out $OUT --budget 540
    python benchmarks/stability_study.py status --bundle .stab          # here: what is done, what is left
    python benchmarks/stability_study.py report --bundle .stab --docs docs/stability/gpu \\
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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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

# Plans: a pipeline preset plus overrides. The default order runs what the issue asks first (bf16, fp4 and
# fp4-guided at seed 0), then the other corrections, then the second seeds; the harder settings of issue 21
# item 3 are named here and added with --runs when the default ones show no difference.
PLANS: dict[str, dict] = {
    "bf16": {"preset": "bf16"},
    "fp8": {"preset": "fp8"},
    "fp4": {"preset": "fp4"},
    "fp4-tis": {"preset": "fp4-tis"},
    # geometric-mean rejection: |mean_t log ρ_t| > 0.05 (about twice the mean k3 of full FP4 at ~1k tokens on
    # the 105M H200 model), i.e. the sequences whose mismatch is well above the typical one
    "fp4-geo": {"preset": "fp4",
                "set": {"corrections": [{"kind": "geo_reject", "params": {"lo": 0.951, "hi": 1.051}}]}},
    "fp4-aligned": {"preset": "fp4-aligned"},
    "fp4-guided": {"preset": "fp4-guided"},
    # harder settings
    "kv-fp4": {"preset": "bf16", "set": {"precision.kv_cache": "nvfp4"}},
    "fp4-mx": {"preset": "fp4-mx"},
    "bf16-lr3x": {"preset": "bf16", "lr_scale": 3.0},
    "fp4-lr3x": {"preset": "fp4", "lr_scale": 3.0},
    "fp4-guided-lr3x": {"preset": "fp4-guided", "lr_scale": 3.0},
}
DEFAULT_ORDER = ["bf16:0", "fp4:0", "fp4-guided:0", "fp4-tis:0", "fp4-geo:0", "fp4-aligned:0", "fp8:0",
                 "bf16:1", "fp4:1", "fp4-guided:1"]

# A priori seconds per RL step (a 128 x <= 1258-token rollout wave at ~1 ms per decode step + the fp32
# trainer's ~1.8e13 FLOP + the evaluation's share + Python), used by `status` until the runs measure their
# own; docs/stability.md ("GPU study") derives them from the H200 numbers in docs/benchmarks.md.
EST_STEP_SECONDS = {"bf16": 2.5, "fp8": 2.8, "fp4": 2.8, "fp4-tis": 2.8, "fp4-geo": 2.8, "fp4-aligned": 3.3,
                    "fp4-guided": 3.5, "kv-fp4": 2.6, "fp4-mx": 2.8}
LAUNCH_SECONDS = 40.0            # python + model + engine (CUDA graphs, Triton compiles) before the first step

STUDY_PRESETS = {
    "gpu": {
        "recipe": "gpu", "steps": 150, "order": DEFAULT_ORDER, "k3_fail_above": 0.01,
        "preflight": {"num_prompts": 64, "samples": 4},
        "rl": {"trainer": {"lr": 2.0e-5, "micro_batch_size": 64, "lr_schedule": {"kind": "constant", "warmup_steps": 5},
                           "loss": {"kind": "grpo", "kl_to_ref_coeff": None}},
               "loop": {"prompts_per_step": 16, "group_size": 8, "eval_every": 10, "eval_prompts": 128,
                        "checkpoint_every": 10, "collapse": {"stop": True}},
               "rollout": {"engine": "native", "max_batch": 128, "sampling": {"temperature": 1.0}},
               "model": {"dtype": "float32", "device": "auto"},
               "logging": {"progress": False, "plot": True}},
        "min_slice": 120.0, "preflight_seconds": 150.0,
    },
    "smoke": {
        "recipe": "smoke", "steps": 2, "order": [f"{p}:0" for p in ("bf16", "fp8", "fp4", "fp4-tis", "fp4-geo",
                                                                     "fp4-aligned", "fp4-guided")],
        "k3_fail_above": 0.01, "preflight": {"num_prompts": 4, "samples": 2},
        "rl": {"trainer": {"lr": 1e-4, "micro_batch_size": 16, "lr_schedule": {"kind": "constant", "warmup_steps": 0},
                           "loss": {"kind": "grpo", "kl_to_ref_coeff": None}},
               "loop": {"prompts_per_step": 4, "group_size": 2, "eval_every": 1, "eval_prompts": 4,
                        "checkpoint_every": 1, "collapse": {"stop": True}},
               "rollout": {"engine": "native", "max_batch": 8, "sampling": {"temperature": 1.0}},
               "model": {"dtype": "float32", "device": "cpu"},
               "logging": {"progress": False, "plot": False}},
        "min_slice": 0.0, "preflight_seconds": 0.0,
    },
}
TERMINAL = ("finished", "diverged")
MAX_FAILURES = 2                 # a run that crashed twice is left for a person to look at (its log says why)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class Study:
    """The study's folder (`--work`): study.json (spec, generation), sft/, policy/, preflight/, configs/,
    runs/<plan>/seed<k>/ (+ seed<k>.json: state, attempts, commands, + seed<k>.log), calls.jsonl, report/."""

    def __init__(self, work: Path, spec: dict, generation: int = 0):
        self.work, self.spec, self.generation = Path(work), spec, generation

    # -- paths --
    policy = property(lambda self: self.work / "policy")
    runs = property(lambda self: self.work / "runs")

    def run_dir(self, plan: str, seed: int) -> Path:
        return self.runs / plan / f"seed{seed}"

    def save(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "study.json").write_text(json.dumps({"generation": self.generation, "spec": self.spec}, indent=1))

    @classmethod
    def load(cls, work: Path) -> Study | None:
        f = Path(work) / "study.json"
        if not f.is_file():
            return None
        data = json.loads(f.read_text())
        return cls(work, data["spec"], data["generation"])

    def journal(self, entry: dict) -> None:
        with (self.work / "calls.jsonl").open("a") as f:
            f.write(json.dumps({"time": _now(), **entry}) + "\n")

    # -- run status (runs/<plan>/seed<k>.json) --
    def status(self, plan: str, seed: int) -> dict:
        f = self.run_dir(plan, seed).with_suffix(".json")
        state = json.loads(f.read_text()) if f.is_file() else {"state": "pending", "attempts": 0, "commands": []}
        if (self.run_dir(plan, seed) / "summary.json").is_file():
            state["state"] = "finished"
        return state

    def set_status(self, plan: str, seed: int, status: dict) -> None:
        f = self.run_dir(plan, seed).with_suffix(".json")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(status, indent=1))

    def order(self) -> list[tuple[str, int]]:
        return [(r.split(":")[0], int(r.split(":")[1])) for r in self.spec["order"]]

    def policy_info(self) -> dict | None:
        return SFT.read_policy_info(self.policy)


# -- spec and configs --

def make_spec(preset: str, sets: list[str], runs: str | None, steps: int | None) -> dict:
    from trace_rl.cli_common import parse_overrides

    spec = json.loads(json.dumps(STUDY_PRESETS[preset]))
    spec["preset"] = preset
    spec["set"] = parse_overrides(sets)
    if steps is not None:
        spec["steps"] = steps
    if runs:
        spec["order"] = parse_runs(runs)
    return spec


def parse_runs(text: str) -> list[str]:
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        plan, _, seed = item.partition(":")
        if plan not in PLANS or not (seed or "0").isdigit():
            raise SystemExit(f"--runs {item!r}: expected PLAN:SEED with PLAN one of {', '.join(PLANS)}")
        out.append(f"{plan}:{seed or 0}")
    return out


def run_config(study: Study, plan: str, seed: int):
    """The PipelineConfig of one run: the study's RL base, the plan's preset and overrides, the seed, --set."""
    from trace_rl.config import set_dotted
    from trace_rl.pipelines.config import PipelineConfig
    from trace_rl.pipelines.presets import apply_preset
    from trace_rl.pipelines.sources import deep_merge

    spec, info = study.spec, study.policy_info()
    recipe = SFT.RECIPES[spec["recipe"]]
    task = SFT.build_task(recipe["task"])
    prompt_len = max(len(p.prompt) for p in task.problems(500, 0, "train") + task.problems(200, 0, "eval"))
    max_new = info["max_new_tokens"]
    data = deep_merge(spec["rl"], {
        "seed": seed, "model": {"path": str(study.policy.resolve())}, "task": recipe["task"],
        "rollout": {"sampling": {"max_new_tokens": max_new}, "max_seq_len": prompt_len + 8 + max_new},
        "loop": {"steps": spec["steps"]}})
    p = PLANS[plan]
    data = apply_preset(data, p["preset"])
    for key, value in {**p.get("set", {}), **spec["set"]}.items():
        set_dotted(data, key, value)
    if "lr_scale" in p:
        data["trainer"]["lr"] = data["trainer"]["lr"] * p["lr_scale"]
    data["logging"] = {**data.get("logging", {}), "name": None}
    return PipelineConfig.parse(data, f"study plan {plan} seed {seed}")


# -- running things: in this process (tests, CPU) or as a subprocess with a hard backstop (GPU) --

def run_cli(argv: list[str], log: Path, timeout: float | None, inprocess: bool, env: dict | None = None) -> int:
    """`python -m trace_rl ARGV`, output appended to `log`. Subprocess: SIGTERM at `timeout` (the pipeline saves
    after its step and exits 143), SIGKILL 20 s later; in-process: trace_rl.cli.main (the run's own
    --time-limit stops it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"\n[{_now()}] trace-rl {shlex.join(argv)}\n")
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
           run_limit: float | None = None) -> dict:
    """Start, resume or restart one run until it finishes or the call's time is up; returns its status."""
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
    t0 = time.time()
    rc = run_cli(argv, run_dir.with_suffix(".log"), limit + 10, inprocess)   # backstop: the run stops itself
    status = {**study.status(plan, seed), "attempts": status["attempts"], "commands": status["commands"],
              "failures": status.get("failures", 0)}
    status["seconds"] = status.get("seconds", 0.0) + time.time() - t0
    if status["state"] != "finished":
        status["state"] = {142: "interrupted", 143: "interrupted", 130: "interrupted"}.get(rc, "failed")
        collapse = recorded_collapse(read_history(run_dir)) if run_dir.is_dir() else None
        if rc == 1 and collapse is not None and collapse["reason"] == "non-finite":
            status["state"] = "diverged"            # stopped on a non-finite gradient: a result, not a crash
        if status["state"] == "failed":
            status["failures"] = status.get("failures", 0) + 1
            status["error"] = "\n".join(run_dir.with_suffix(".log").read_text().splitlines()[-15:])
    status["rc"] = rc
    study.set_status(plan, seed, status)
    study.journal({"stage": "run", "plan": plan, "seed": seed, "how": how, "rc": rc, "state": status["state"],
                   "seconds": time.time() - t0})
    log(f"{plan} seed {seed}: {status['state']} (rc {rc}, {time.time() - t0:.0f} s)")
    return status


def pending_runs(study: Study) -> list[tuple[str, int]]:
    """Runs to (re)start, in order: not finished or diverged, and failed (crashed) fewer than MAX_FAILURES times."""
    return [(plan, seed) for plan, seed in study.order()
            if (s := study.status(plan, seed))["state"] not in TERMINAL and s.get("failures", 0) < MAX_FAILURES]


def stage_runs(study: Study, deadline: float, inprocess: bool, jobs: int, log, run_limit: float | None = None) -> None:
    queue = pending_runs(study)
    if jobs <= 1 or inprocess:
        for plan, seed in queue:
            if deadline - time.time() < study.spec["min_slice"]:
                log(f"{deadline - time.time():.0f} s left: less than a run's minimum slice; next call")
                return
            launch(study, plan, seed, deadline, inprocess, log, run_limit)
        return
    threads: list[threading.Thread] = []
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not queue or deadline - time.time() < study.spec["min_slice"]:
                    return
                plan, seed = queue.pop(0)
            launch(study, plan, seed, deadline, False, log, run_limit)

    for _ in range(jobs):
        threads.append(threading.Thread(target=worker))
        threads[-1].start()
    for t in threads:
        t.join()


# -- restore and pack --

def restore(work: Path, bundle: Path | None, spec: dict | None, log) -> Study:
    """The study to continue: the device disk when it is at least as new as the bundle (a warm machine), else
    the bundle unpacked into a clean `work`; a new study from `spec` when there is neither."""
    manifest = B.read_manifest(bundle)
    local = Study.load(work)
    if local is not None and (manifest is None or local.generation >= manifest["generation"]):
        log(f"restored from the device disk (generation {local.generation}: the machine was warm)")
        return local
    if work.exists():
        shutil.rmtree(work)
    if manifest is None:
        if spec is None:
            raise SystemExit("no study in --work or --bundle: start one with --preset gpu (or smoke)")
        study = Study(work, spec)
        study.save()
        log(f"new study ({spec['preset']}) in {work}")
        return study
    B.unpack(bundle, manifest["study"], work)
    if manifest.get("policy"):
        B.unpack(bundle, manifest["policy"], work / "policy")
    B.write_manifest(work, manifest)            # what the carried bundle holds (the policy need not travel back)
    study = Study.load(work)
    log(f"restored from the bundle (generation {study.generation}; fresh machine: checkpoints are not carried)")
    return study


def _keep_in_bundle(rel: Path) -> bool:
    parts = rel.parts
    if parts[0] in ("policy", B.MANIFEST) or any(p.startswith("checkpoint") for p in parts):
        return False
    return not (parts[0] == "runs" and rel.name in ("curves.png",)) and not rel.name.endswith(".tmp")


def pack_bundle(study: Study, out: Path) -> dict:
    """study.tgz parts always; policy.tar parts only when the policy differs from the one the carried bundle
    already holds (its policy.json, which names the weights' sha256, is compared)."""
    import hashlib

    out.mkdir(parents=True, exist_ok=True)
    last = B.read_manifest(study.work) or {}
    manifest = {"generation": study.generation, "created": _now(), "policy": None}
    policy_json = study.policy / "policy.json"
    if policy_json.is_file():
        digest = hashlib.sha256(policy_json.read_bytes()).hexdigest()
        carried = last.get("policy")
        manifest["policy"] = carried if carried and carried.get("policy_json_sha256") == digest else {
            **B.pack(study.policy, out, "policy.tar", compress=False), "policy_json_sha256": digest}
    B.write_manifest(study.work, manifest)      # in study.tgz too: the next call reads it from either place
    manifest["study"] = B.pack(study.work, out, "study.tgz", _keep_in_bundle, compress=True)
    B.write_manifest(out, manifest)
    return manifest


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
    elif spec is not None and spec != study.spec:
        log("note: --preset/--set/--steps apply only when a study starts; this one continues with its own spec")
    study.generation += 1
    study.save()
    study.journal({"stage": "call", "generation": study.generation, "budget": args.budget})
    with GPUSampler() as gpu:
        try:
            if stage_sft(study, deadline, log) and stage_preflight(study, deadline, args.inprocess, log):
                stage_runs(study, deadline, args.inprocess, args.jobs, log, args.run_time_limit)
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


# -- status / projection --

def status_text(study: Study) -> str:
    info = study.policy_info()
    lines = [f"policy: {'none yet' if info is None else ('done' if info['done'] else 'SFT unfinished')}"
             + ("" if info is None else f" (step {info['step']}, held-out accuracy {info['accuracy']})")]
    remaining, measured = 0.0, {}
    for plan, seed in study.order():
        s = study.status(plan, seed)
        history = _train_records(study.run_dir(plan, seed))
        if history:
            measured.setdefault(plan, []).append(sorted(r["step_seconds"] for r in history)[len(history) // 2])
        left = 0 if s["state"] in TERMINAL else study.spec["steps"] - len(history)
        per_step = (sum(measured[plan]) / len(measured[plan]) * 1.1) if plan in measured else \
            EST_STEP_SECONDS.get(plan.removesuffix("-lr3x"), 7.0)
        cost = left * per_step + (LAUNCH_SECONDS if left else 0.0)
        remaining += cost
        lines.append(f"  {plan:16s} seed {seed}: {s['state']:12s} {len(history):4d}/{study.spec['steps']} steps"
                     + (f", ~{cost / 60:.0f} min left" if left else ""))
    usable = 540.0 - 30.0
    calls = math.ceil(remaining / usable) if remaining else 0
    lines.append(f"left: ~{remaining / 60:.0f} device-minutes = ~{calls} calls of 600 s (~{math.ceil(calls / 2.5)} "
                 f"sessions of 30 min at ~2.5 calls each); step times measured for: {', '.join(measured) or 'none'}")
    return "\n".join(lines)


def _train_records(run_dir: Path) -> list[dict]:
    from trace_rl.pipelines.run_log import read_history

    return [r for r in read_history(run_dir) if r.get("kind") == "train"] if run_dir.is_dir() else []


def study_from_bundle(bundle: Path, into: Path) -> Study:
    manifest = B.read_manifest(bundle)
    if manifest is None:
        raise SystemExit(f"{bundle}: no {B.MANIFEST} (copy the files of the last call's $OUT there)")
    if into.exists():
        shutil.rmtree(into)
    B.unpack(bundle, manifest["study"], into)
    return Study.load(into)


def cmd_status(args) -> int:
    study = Study.load(Path(args.work)) if args.work else study_from_bundle(Path(args.bundle), Path(args.tmp))
    print(status_text(study))
    return 0


def cmd_report(args) -> int:
    from trace_rl.audit.study_report import write_report

    study = Study.load(Path(args.work)) if args.work else study_from_bundle(Path(args.bundle), Path(args.tmp))
    result = write_report(study.runs, Path(args.docs), title=args.title, order=[p for p, _ in study.order()])
    if args.raw:
        raw = Path(args.raw)
        raw.mkdir(parents=True, exist_ok=True)
        for plan, seed in study.order():
            d = study.run_dir(plan, seed)
            if (d / "metrics.jsonl").is_file():
                shutil.copy(d / "metrics.jsonl", raw / f"{plan}-seed{seed}.jsonl")
            if (study.runs / plan / "preflight.json").is_file():
                shutil.copy(study.runs / plan / "preflight.json", raw / f"{plan}-preflight.json")
        for name in ("calls.jsonl", "sft/sft.jsonl", "study.json"):
            if (study.work / name).is_file():
                shutil.copy(study.work / name, raw / name.replace("/", "-"))
    print(result["markdown"])
    print(f"wrote {args.docs}/report.md, report.json, curves.png"
          + (f"; raw records in {args.raw}" if args.raw else ""))
    return 0


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
    c.add_argument("--jobs", type=int, default=1, help="runs sharing the GPU at once (default 1)")
    c.add_argument("--inprocess", action="store_true", help="runs in this process (CPU, tests), no subprocesses")
    c.add_argument("--run-time-limit", type=float, help="cap on each run's --time-limit (0: every run stops after "
                                                        "one step, which is how the tests cross a call boundary)")
    c.set_defaults(func=call)
    for name, fn, helptext in (("status", cmd_status, "what is done and what is left (calls, sessions)"),
                               ("report", cmd_report, "tables and curves from the raw records")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--bundle", help="a bundle folder (the carried .stab)")
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
