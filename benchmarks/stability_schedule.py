"""Which of the stability study's runs may share the GPU, and the slots that run them (`stability_study.py call
--jobs N`; stability_study.py's `launch` runs one).

Memory decides what may share, and on the H200 (2026-12-02) it is the trainer's, not the rollout engine's: the
native engine's KV pool is fixed by rollout.max_batch x max_seq_len (128 x 1281 tokens of the 17.4M policy:
< 1 GB; nothing sizes it from the free memory), while the fp32 trainer's attention at 64 rows x ~1280 tokens
materialises its scores (the 2.32 GiB the guided run failed to allocate in backward is 64 x 6 x 1274^2 fp32:
SDPA's math kernel, it seems, for fp32 with GQA), and PyTorch's allocator keeps the peak cached: the bf16 and
fp4-aligned runs' processes held 84-103 GB. Two such runs fit
side by side; the guided trainer (it also keeps the rollout's rounding records) held 36-55 GB at its first
step and ran out of memory there twice beside one. Hence:

- a plan whose trainer is in EXCLUSIVE_TRAINERS runs **exclusive**: it starts only when no other run is going
  and nothing starts beside it (the other slots wait); the call log says which runs and why;
- a run that runs out of CUDA memory while another run was going is not a crash of its plan: its failure is
  not counted (MAX_FAILURES), its status is marked exclusive (for later calls too) and it goes back to the
  queue's front to run alone. Out of memory alone counts as a failure, as before.

A per-run memory cap (torch.cuda.set_per_process_memory_fraction) was not taken: the pairs that work today
hold more than half the GPU each (cache included), so a cap of a share could break them, and it would only move
a guided run's OOM from one process to the other.

Imported by stability_study.py after it has put benchmarks/ and scripts/ on sys.path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stability_spec import MAX_FAILURES, TERMINAL, Study, plan_trainer
from stability_status import seconds_left

SHARING_SLOWDOWN = 1.85          # a step's time with two runs on one H200 against one alone (2026-12-01)

EXCLUSIVE_TRAINERS = {
    "guided": "the guided trainer keeps the rollout's rounding records: it needs more than 55 GB at its first step "
              "and ran out of CUDA memory there twice beside another run (H200, 2026-12-02)",
}
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED")
OOM_SHARED = "oom-shared"        # the state of a run that ran out of memory beside another: pending, not failed

Run = tuple[str, int]


def out_of_memory(log_text: str) -> bool:
    """Whether a run's log (what this attempt wrote) ends in a CUDA out-of-memory error."""
    return any(m in log_text for m in OOM_MARKERS)


def exclusive_reason(study: Study, plan: str, seed: int, share_trainers: bool = False) -> str | None:
    """Why this run must have the GPU to itself (None: it may share): marked after an OOM beside another run,
    or its plan's trainer (unless `share_trainers`: `call --share-trainers`, for when the trainer's memory has
    come down; an OOM beside another run still marks the run exclusive)."""
    marked = study.status(plan, seed).get("exclusive")
    return marked or (None if share_trainers else EXCLUSIVE_TRAINERS.get(plan_trainer(study, plan)))


def pending_runs(study: Study) -> list[Run]:
    """Runs to (re)start, in order: not finished or diverged, and failed (crashed) fewer than MAX_FAILURES times."""
    return [(plan, seed) for plan, seed in study.order()
            if (s := study.status(plan, seed))["state"] not in TERMINAL and s.get("failures", 0) < MAX_FAILURES]


def stage_runs(study: Study, deadline: float, inprocess: bool, jobs: int, log, run_limit: float | None = None,
               only_finishable: bool = False, *, launch: Callable[..., dict], share_trainers: bool = False) -> None:
    """Start the pending runs in order while a slice is left, `jobs` at a time (one in-process), an exclusive
    run alone; with `only_finishable` (a session's last call, where an unfinished run is lost), skip those whose
    estimated time to finish exceeds what is left when a slot frees. `launch(study, plan, seed, deadline,
    inprocess, log, run_limit, shared=...)` runs one and returns its status; `shared()` tells it, when the run
    has ended, whether another run was going at any time during it."""
    queue = pending_runs(study)
    threaded = jobs > 1 and not inprocess
    why: dict[Run, str | None] = ({run: exclusive_reason(study, *run, share_trainers) for run in queue}
                                  if threaded else {})
    for (plan, seed), reason in why.items():
        if reason:
            log(f"{plan} seed {seed}: exclusive, runs alone (the other slots wait): {reason}")

    def next_run() -> Run | None:
        while queue:
            if deadline - time.time() < study.spec["min_slice"]:
                log(f"{deadline - time.time():.0f} s left: less than a run's minimum slice; next call")
                return None
            plan, seed = queue.pop(0)
            if only_finishable:
                sharing = SHARING_SLOWDOWN if threaded and not why.get((plan, seed)) else 1.0
                _, need = seconds_left(study, plan, seed, sharing=sharing)
                if need > deadline - time.time():
                    log(f"{plan} seed {seed}: not started (needs ~{need:.0f} s, {deadline - time.time():.0f} s left)")
                    continue
            return plan, seed
        return None

    if not threaded:
        while (run := next_run()) is not None:
            launch(study, *run, deadline, inprocess, log, run_limit)
        return
    cond = threading.Condition()
    running: dict[Run, bool] = {}        # the runs going now -> exclusive
    overlapped: dict[Run, bool] = {}     # whether another run was going at any time during it
    told: set[Run] = set()

    def take() -> Run | None:
        """The next run this slot starts; waits while an exclusive run holds the GPU, or while the next run is
        exclusive and others are going. None: nothing more in this call."""
        with cond:
            while True:
                if any(running.values()):
                    cond.wait()
                    continue
                run = next_run()
                if run is None:
                    cond.notify_all()
                    return None
                if why.get(run) and running:
                    queue.insert(0, run)
                    if run not in told:
                        told.add(run)
                        log(f"{run[0]} seed {run[1]}: waits for the GPU to itself ({len(running)} run(s) going)")
                    cond.wait()
                    continue
                running[run], overlapped[run] = bool(why.get(run)), bool(running)
                for other in running:
                    overlapped[other] = overlapped[other] or len(running) > 1
                return run

    def worker() -> None:
        while (run := take()) is not None:
            status: dict = {}
            try:
                status = launch(study, *run, deadline, False, log, run_limit, shared=lambda r=run: overlapped[r])
            finally:
                with cond:
                    del running[run]
                    if status.get("state") == OOM_SHARED:
                        why[run] = status.get("exclusive") or "out of CUDA memory beside another run"
                        queue.insert(0, run)
                        log(f"{run[0]} seed {run[1]}: back to the queue's front, to run alone")
                    cond.notify_all()

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
