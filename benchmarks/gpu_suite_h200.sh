#!/usr/bin/env bash
# benchmarks/gpu_suite_h200.sh OUT_DIR (check `gpusuite`): the whole `pytest -m gpu` suite on one H200, in SHARDS
# parallel pytest processes (default 8: their kernels compile in parallel on the 16 cores; the GPU has room for 8
# small test processes) cut at GPU_SUITE_S seconds (default 230). Per shard OUT/shard_<i>.{txt,log}; OUT/summary.json
# counts PASSED / FAILED / ERROR / SKIPPED from the -v logs (a shard cut by the timeout writes no junit XML, so the
# logs are read, and the ids it never reached are listed as `not_run`) and names every failed id with its last lines.
# GPU_SUITE_TESTS: the paths to collect (default tests/).
# Why: the suite's GPU half is not in CI (CI has no GPU); this is how a session sees every GPU test at once.
. "$(dirname "$0")/h200_check.sh"
SHARDS=${SHARDS:-8}
GPU_SUITE_S=${GPU_SUITE_S:-230}
$PY -m pytest --collect-only -q -p no:cacheprovider -m gpu ${GPU_SUITE_TESTS:-tests} 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
pids=()
set -f          # test ids carry [params]: no globbing
for i in $(seq 0 $((SHARDS - 1))); do
    awk -v i=$i -v n=$SHARDS 'NR % n == i' "$OUT/test_ids.txt" > "$OUT/shard_$i.txt"
    [ -s "$OUT/shard_$i.txt" ] || continue
    timeout "$GPU_SUITE_S" $PY -m pytest -v -p no:cacheprovider -rfEs -m gpu $(cat "$OUT/shard_$i.txt") \
        > "$OUT/shard_$i.log" 2>&1 &
    pids+=($!)
done
set +f
for p in "${pids[@]}"; do wait "$p"; done
$PY - "$OUT" <<'PY'
import glob, os, re, sys
sys.path.insert(0, "benchmarks")
from h200_summary import write
out = sys.argv[1]
ids = [l.strip() for l in open(os.path.join(out, "test_ids.txt")) if l.strip()]
status = {}
line_re = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")
for log in sorted(glob.glob(os.path.join(out, "shard_*.log"))):
    for line in open(log, errors="replace"):
        m = line_re.match(line)
        if m:
            status.setdefault(m.group(1), m.group(2))
counts = {}
for s in status.values():
    counts[s] = counts.get(s, 0) + 1
failed = sorted(t for t, s in status.items() if s in ("FAILED", "ERROR"))
# the short summary lines (`FAILED id - reason`) give each failure's reason
reasons = {}
for log in sorted(glob.glob(os.path.join(out, "shard_*.log"))):
    for line in open(log, errors="replace"):
        if line.startswith(("FAILED ", "ERROR ")) and " - " in line:
            tid, why = line.split(" ", 1)[1].split(" - ", 1)
            reasons[tid.strip()] = why.strip()[:300]
not_run = [t for t in ids if t not in status]
write(out, {"collected": len(ids), "counts": counts, "failed": [{"id": t, "why": reasons.get(t, "")} for t in failed],
            "not_run": len(not_run), "not_run_first": not_run[:20]})
PY
