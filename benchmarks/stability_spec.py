"""The stability study's plan and state (benchmarks/stability_study.py drives it): the precision plans and study
presets, `Study` (its folder: spec, per-run status, journal) and the PipelineConfig of one run.

Imported by stability_study.py after it has put benchmarks/ and scripts/ on sys.path."""

from __future__ import annotations

import json
import time
from pathlib import Path

import train_study_policy as SFT

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

def _rl_config(*, lr: float, micro_batch_size: int, warmup_steps: int, prompts_per_step: int, group_size: int,
               eval_every: int, eval_prompts: int, checkpoint_every: int, max_batch: int, device: str,
               plot: bool) -> dict:
    """Every run's pipeline config (before the plan's preset and overrides): GRPO without a KL term, constant lr
    after warm-up, native engine at temperature 1, fp32 trainer, stop on collapse, evaluation at bf16 too; the
    sizes per preset."""
    return {"trainer": {"lr": lr, "micro_batch_size": micro_batch_size,
                        "lr_schedule": {"kind": "constant", "warmup_steps": warmup_steps},
                        "loss": {"kind": "grpo", "kl_to_ref_coeff": None}},
            "loop": {"prompts_per_step": prompts_per_step, "group_size": group_size, "eval_every": eval_every,
                     "eval_prompts": eval_prompts, "checkpoint_every": checkpoint_every, "collapse": {"stop": True},
                     "eval_reference": True},     # held-out accuracy at bf16 too (quantized plans; SPEC_ADDITIONS)
            "rollout": {"engine": "native", "max_batch": max_batch, "sampling": {"temperature": 1.0}},
            "model": {"dtype": "float32", "device": device},
            "logging": {"progress": False, "plot": plot}}


STUDY_PRESETS = {
    "gpu": {
        "recipe": "gpu", "steps": 150, "order": DEFAULT_ORDER, "k3_fail_above": 0.01,
        "preflight": {"num_prompts": 64, "samples": 4},
        "rl": _rl_config(lr=2.0e-5, micro_batch_size=64, warmup_steps=5, prompts_per_step=16, group_size=8,
                         eval_every=10, eval_prompts=128, checkpoint_every=10, max_batch=128, device="auto",
                         plot=True),
        "min_slice": 120.0, "preflight_seconds": 150.0,
    },
    "smoke": {
        "recipe": "smoke", "steps": 2, "order": [f"{p}:0" for p in ("bf16", "fp8", "fp4", "fp4-tis", "fp4-geo",
                                                                     "fp4-aligned", "fp4-guided")],
        "k3_fail_above": 0.01, "preflight": {"num_prompts": 4, "samples": 2},
        "rl": _rl_config(lr=1e-4, micro_batch_size=16, warmup_steps=0, prompts_per_step=4, group_size=2,
                         eval_every=1, eval_prompts=4, checkpoint_every=1, max_batch=8, device="cpu", plot=False),
        "min_slice": 0.0, "preflight_seconds": 0.0,
    },
}
# Settings added to the presets' "rl" after studies had started ({dotted key: why}). A study keeps the spec it
# started with, so `upgrade_spec` adds to a continued study's spec those it lacks (value from its preset): runs
# (re)started from step 0 from then on carry them; finished runs keep their records, and a run resumed from its
# checkpoint keeps its own config.yaml. Each addition is noted in the spec ("additions") and the journal.
SPEC_ADDITIONS = {
    "loop.eval_reference": "held-out eval also at bf16 (eval_ref_*): separates FP4 inference from FP4 training",
}
TERMINAL = ("finished", "diverged")
MAX_FAILURES = 2                 # a run that crashed twice is left for a person to look at (its log says why)


def timestamp() -> str:
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
            f.write(json.dumps({"time": timestamp(), **entry}) + "\n")

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

    carried_policy: dict | None = None   # policy.json read from a bundle (status and report unpack no policy)

    def policy_info(self) -> dict | None:
        return SFT.read_policy_info(self.policy) or self.carried_policy


def upgrade_spec(study: Study) -> list[str]:
    """Add the SPEC_ADDITIONS the study's spec lacks (see there); saves and journals each; one line per addition."""
    preset = STUDY_PRESETS.get(study.spec.get("preset"), {}).get("rl", {})
    notes = []
    for key, why in SPEC_ADDITIONS.items():
        value, ours = _dotted(preset, key), _dotted(study.spec["rl"], key)
        if value is None or ours is not None:
            continue
        from trace_rl.config import set_dotted

        set_dotted(study.spec["rl"], key, value)
        entry = {"key": f"rl.{key}", "value": value, "from_generation": study.generation, "why": why}
        study.spec.setdefault("additions", []).append(entry)
        study.journal({"stage": "spec", **entry, "note": "runs started from step 0 from this call on carry it; "
                                                         "finished runs keep their records"})
        notes.append(f"spec: rl.{key} = {value!r} added from generation {study.generation} ({why}); runs started "
                     f"from now on carry it, finished ones keep their records")
    if notes:
        study.save()
    return notes


def _dotted(data: dict, key: str):
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


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


def plan_trainer(study: Study, plan: str) -> str:
    """The trainer mode (bf16, aligned, guided) of a plan's runs: its preset's, unless the plan or the study's
    --set overrides precision.trainer (what run_config would give, without needing the policy)."""
    from trace_rl.pipelines.presets import preset_overrides

    p = PLANS[plan]
    sets = {**p.get("set", {}), **study.spec.get("set", {})}
    return sets.get("precision.trainer") or preset_overrides(p["preset"])["precision"].get("trainer", "bf16")


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
