#!/usr/bin/env bash
# guidedspeed: a guided RL step of the stability study's shape vs an aligned one, on one H200 (< 120 s).
# Usage: benchmarks/guided_step_h200.sh OUT_DIR (from the repo root, device wheels on PYTHONPATH).
# 1. benchmarks/guided_step.py (see its header): the study's 105M float32 model, 128 x 1024-token answers,
#    micro-batches of 64; fp4-guided then fp4-aligned (guided first: its numbers are the point, and the
#    Triton compiles land in its build_s/warm-up), one warm-up step and two steps split into phases
#    (collect / draw / score / optimize / sync seconds, peak GPU memory), the guided records' size and whether
#    the sample keeps them pinned, the fake-quant paths taken, and the former per-site stack of the records
#    timed on this host (former_layout.per_site_stack_s: what the replay buffer's sample cost before).
# 2. the GPU tests of what changed: densify keeps pinned records pinned, the guided trainer on records from
#    pinned host memory (k3 <= 1e-6), recording inside CUDA graphs.
# Writes OUT_DIR/{summary.json,guided_step.json,guided_step.log,pytest.log,pytest.xml}.
. "$(dirname "$0")/h200_check.sh"
timeout 90 $PY benchmarks/guided_step.py --plans fp4-guided,fp4-aligned --deadline-s 62 --out "$OUT/guided_step.json" \
    > "$OUT/guided_step.log" 2>&1
bench_rc=$?
run_pytest 116 tests/data/test_padding.py::test_densify_keeps_pinned_entries_pinned \
    tests/engine/test_guidance_records.py::test_gpu_guided_trainer_matches_rollout \
    tests/engine/test_guidance_records.py::test_gpu_recording_inside_cuda_graphs_equals_eager
# (the fp4-guided preset's pipeline is the presets check's; here it ran past the 116 s, 2026-12-02)
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 6)}
try:
    r = json.load(open(os.path.join(out, "guided_step.json")))
    s["min_seconds"] = r.get("summary_min_seconds")
    m = r.get("summary_min_seconds") or {}
    if "fp4-guided" in m and "fp4-aligned" in m:
        s["guided_over_aligned"] = {k: m["fp4-guided"][k] / max(m["fp4-aligned"][k], 1e-9) for k in m["fp4-guided"]}
    s["errors"] = r.get("errors")
    for plan, e in r["plans"].items():
        last = e["steps"][-1] if e["steps"] else {}
        s[plan] = {"warmup": e.get("warmup"), "build_s": e.get("build_s"), "peak_gpu_GB": last.get("peak_gpu_GB"),
                   "record_GB": last.get("record_GB"), "sample_records_pinned": last.get("sample_records_pinned"),
                   "packed_width": last.get("packed_width"), "former_layout": e.get("former_layout"),
                   "fake_quant_paths": e.get("fake_quant_paths")}
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
if bench_rc or "min_seconds" not in s:
    s["bench_log_tail"] = tail(out, "guided_step.log", 15)
write(out, s)
PY
