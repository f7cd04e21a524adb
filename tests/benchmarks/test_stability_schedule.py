"""Co-scheduling of the stability study's runs (`call --jobs 2`): guided plans run alone and the other slot waits;
a run out of CUDA memory beside another is retried alone in the same call, its failure not counted; out of
memory alone counts. The real `launch` runs each, with `run_cli` replaced by a stand-in that "trains" for a
moment (writing summary.json, or an OOM traceback when told to); no GPU, no trace_rl run."""

import json
import threading
import time

import stability_schedule as SCH
import stability_study as S

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of "
       "139.80 GiB of which 272.19 MiB is free.")


def make_study(tmp_path, runs):
    spec = {"preset": "smoke", "order": runs, "steps": 2, "min_slice": 0.0, "set": {}}
    study = S.Study(tmp_path / "work", spec)
    study.save()
    return study


class FakeCLI:
    """Stands in for run_cli: each run lasts `seconds`; a run in `oom_beside` fails out of memory when another
    was going at some time during it, one in `oom_alone` always does. Records (run, start, end, others going)."""

    def __init__(self, seconds=0.3, oom_beside=(), oom_alone=(), step_seconds=None):
        self.seconds, self.oom_beside, self.oom_alone = seconds, set(oom_beside), set(oom_alone)
        self.step_seconds = step_seconds            # if set: each run logs one step of this time before its end
        self.lock, self.going, self.beside, self.spans = threading.Lock(), set(), {}, []

    def __call__(self, argv, log, timeout, inprocess, env=None):
        run_dir = log.with_suffix("")
        name = f"{run_dir.parent.name}:{run_dir.name.removeprefix('seed')}"
        with self.lock:
            self.going.add(name)
            self.beside[name] = False
            if len(self.going) > 1:       # every run going now has had another beside it
                self.beside.update(dict.fromkeys(self.going, True))
        t0 = time.time()
        time.sleep(self.seconds)
        with self.lock:
            beside = self.beside.pop(name)
            self.going.discard(name)
            self.spans.append((name, t0, time.time()))
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.step_seconds is not None:
            record = {"kind": "train", "step": 1, "step_seconds": self.step_seconds}
            (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        with log.open("a") as f:
            f.write(f"trace-rl {' '.join(argv)}\n")
            if name in self.oom_alone or (name in self.oom_beside and beside):
                f.write(f"Traceback (most recent call last):\n{OOM}\n")
                return 1
        (run_dir / "summary.json").write_text("{}")
        return 0

    def overlapping(self, name):
        """The runs whose span overlapped one of `name`'s."""
        mine = [(a, b) for n, a, b in self.spans if n == name]
        return {n for n, a, b in self.spans if n != name and any(a < y and x < b for x, y in mine)}


def run_stage(tmp_path, monkeypatch, runs, fake, jobs=2, seconds=60.0, only_finishable=False, share_trainers=False):
    monkeypatch.setattr(S, "run_cli", fake)
    monkeypatch.setattr(S, "write_config", lambda study, plan, seed: tmp_path / "config.yaml")
    study, lines = make_study(tmp_path, runs), []
    SCH.stage_runs(study, time.time() + seconds, False, jobs, lines.append, only_finishable=only_finishable,
                   launch=S.launch, share_trainers=share_trainers)
    return study, "\n".join(lines)


def test_guided_plans_are_exclusive_and_the_others_share(tmp_path, monkeypatch):
    study = make_study(tmp_path, ["bf16:0"])
    assert SCH.exclusive_reason(study, "fp4-guided", 0) == SCH.EXCLUSIVE_TRAINERS["guided"]
    assert SCH.exclusive_reason(study, "fp4-guided-lr3x", 1) == SCH.EXCLUSIVE_TRAINERS["guided"]
    assert all(SCH.exclusive_reason(study, p, 0) is None for p in ("bf16", "fp4", "fp4-aligned", "fp4-tis"))
    study.spec["set"] = {"precision.trainer": "guided"}            # --set makes every plan guided
    assert SCH.exclusive_reason(study, "fp4", 0) == SCH.EXCLUSIVE_TRAINERS["guided"]

    fake = FakeCLI()
    study, log = run_stage(tmp_path / "s", monkeypatch, ["bf16:0", "fp4:0", "fp4-guided:0", "fp8:0", "fp4-guided:1"],
                           fake)
    assert all(study.status(plan, seed)["state"] == "finished" for plan, seed in study.order())
    assert fake.overlapping("bf16:0") == {"fp4:0"}                  # two shared the GPU ...
    assert fake.overlapping("fp4-guided:0") == set() and fake.overlapping("fp4-guided:1") == set()   # ... not these
    assert "fp4-guided seed 0: exclusive, runs alone (the other slots wait): the guided trainer" in log
    assert "fp4-guided seed 1: exclusive" in log and "bf16 seed 0: exclusive" not in log
    assert "fp4-guided seed 0: waits for the GPU to itself" in log
    journal = [json.loads(line) for line in (study.work / "calls.jsonl").read_text().splitlines()]
    beside = {(e["plan"], e["seed"]): e["beside_another"] for e in journal if e["stage"] == "run"}
    assert beside[("bf16", 0)] and not beside[("fp4-guided", 0)]


def test_share_trainers_lets_guided_runs_share_until_one_runs_out_of_memory(tmp_path, monkeypatch):
    study = make_study(tmp_path, ["fp4-guided:0"])
    assert SCH.exclusive_reason(study, "fp4-guided", 0, share_trainers=True) is None
    study.set_status("fp4-guided", 0, {**study.status("fp4-guided", 0),
                                        "exclusive": "ran out of CUDA memory beside another run"})
    assert SCH.exclusive_reason(study, "fp4-guided", 0, share_trainers=True).startswith("ran out")

    fake = FakeCLI(oom_beside={"fp4-guided:1"})
    study, log = run_stage(tmp_path / "s", monkeypatch, ["fp4-guided:0", "fp4-guided:1"], fake, share_trainers=True)
    assert all(study.status(plan, seed)["state"] == "finished" for plan, seed in study.order())
    assert "fp4-guided:0" in fake.overlapping("fp4-guided:1")          # they shared the GPU at first ...
    last = max((s for s in fake.spans if s[0] == "fp4-guided:1"), key=lambda s: s[1])
    assert not any(a < last[2] and last[1] < b for n, a, b in fake.spans if n != "fp4-guided:1")   # ... then alone
    assert "exclusive, runs alone" not in log.split("out of CUDA memory")[0]
    assert study.status("fp4-guided", 1)["failures"] == 0


def test_out_of_memory_beside_another_run_is_retried_alone(tmp_path, monkeypatch):
    fake = FakeCLI(oom_beside={"fp4:0"})
    study, log = run_stage(tmp_path, monkeypatch, ["bf16:0", "fp4:0", "fp8:0"], fake)
    status = study.status("fp4", 0)
    assert status["state"] == "finished" and status["failures"] == 0 and status["attempts"] == 2
    assert "ran out of CUDA memory beside another run" in status["exclusive"]       # for later calls too
    assert [n for n, _, _ in fake.spans].count("fp4:0") == 2
    last = max((s for s in fake.spans if s[0] == "fp4:0"), key=lambda s: s[1])
    assert not any(a < last[2] and last[1] < b for n, a, b in fake.spans if n != "fp4:0")   # the retry: alone
    assert "fp4 seed 0: out of CUDA memory beside another run: not counted as a failure (0 of 2)" in log
    assert "fp4 seed 0: back to the queue's front, to run alone" in log
    assert SCH.exclusive_reason(study, "fp4", 0) == status["exclusive"]


def test_out_of_memory_alone_is_a_failure(tmp_path, monkeypatch):
    fake = FakeCLI(seconds=0.05, oom_alone={"fp4-guided:0"}, step_seconds=9.0)
    study, log = run_stage(tmp_path, monkeypatch, ["fp4-guided:0"], fake)
    status = study.status("fp4-guided", 0)
    assert status["state"] == "failed" and status["failures"] == 1 and status["attempts"] == 1
    assert "CUDA out of memory" in status["error"] and "FAILED" in log and "not counted" not in log
    assert "exclusive" in log and "exclusive" not in status                  # by its trainer, not by an OOM
    # its first step's time is kept: the restart from step 0 (--overwrite) will drop the records
    assert status["measured_step_seconds"] == 9.0 and status["measured_beside_another"] is False


def test_only_finishable_estimates_an_exclusive_run_alone(tmp_path, monkeypatch):
    """fp4-guided, not measured: 2 steps x 3.5 s x UNMEASURED_FACTOR 2 + a 40 s launch = 54 s, counted alone
    (it runs alone; at the sharing slowdown it would be ~66 s): it starts with 60 s left, not with 52 s, where
    fp4 (2 x 2.8 s x 1.85 for sharing + 40 = ~50 s) still does."""
    fake = FakeCLI(seconds=0.05)
    study, log = run_stage(tmp_path, monkeypatch, ["fp4-guided:0", "fp4:0"], fake, seconds=60.0,
                           only_finishable=True)
    assert study.status("fp4-guided", 0)["state"] == "finished" and "not started" not in log
    study, log = run_stage(tmp_path / "b", monkeypatch, ["fp4-guided:0", "fp4:0"], fake, seconds=52.0,
                           only_finishable=True)
    assert "fp4-guided seed 0: not started (needs ~54 s" in log and study.status("fp4", 0)["state"] == "finished"
