#!/usr/bin/env bash
# attnsplit (issue 16): bf16 decode attention with 1-4 split-KV counts against cuDNN SDPA, then the GPU tests of the
# split candidates. Usage: benchmarks/attention_splits_h200.sh OUT_DIR (from the repo root, device wheels on PYTHONPATH). < 120 s.
# Writes OUT_DIR/attention_splits.json (benchmarks/attention.py: rows[].split_rows per count: us, read_TBps,
# speedup_vs_cudnn, rel_err_vs_reference; rows[].us / read_TBps the default launch; sdpa[].sdpa.read_TBps per backend),
# OUT_DIR/attention_splits.log, OUT_DIR/pytest.log, OUT_DIR/pytest.xml, OUT_DIR/summary.json.
. "$(dirname "$0")/h200_check.sh"
# (b) first: B = 100, Qwen3-8B heads (32 q / 8 kv x 128), bf16 cache of 16-token pages, L = 4352 and 8447
timeout 60 $PY benchmarks/attention.py --out "$OUT/attention_splits.json" --batches 100 --contexts 4352,8447 \
    --formats bf16 --splits 1,2,3,4 > "$OUT/attention_splits.log" 2>&1
bench_rc=$?
# (a) the GPU tests touched (kernel split counts, split candidates in the engine, path names / span narrowing)
run_pytest 112 tests/kv/test_cache.py tests/kernels/test_decode_attention.py tests/engine/test_native_gpu.py \
    -k "(split or path_names or candidates) and not nan"
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 3)}
try:
    res = json.load(open(os.path.join(out, "attention_splits.json")))
    s["read_ceiling_TBps"] = res["ceilings"]["read_TBps"]
    sd = {x["context"]: x.get("sdpa", {}) for x in res.get("sdpa", [])}
    for r in res["rows"]:
        c = sd.get(r["context"], {})
        s[f"B{r['batch']}/L{r['context']}"] = {
            "cudnn_us": c.get("cudnn_us"), "cudnn_TBps": c.get("read_TBps", {}).get("cudnn"),
            "sdpa_best": c.get("best"), "default_us": r.get("us"), "default_TBps": r.get("read_TBps"),
            "default_splits": r.get("default_splits"),
            "splits": {x["splits"]: {k: x.get(k) for k in ("us", "read_TBps", "speedup_vs_cudnn", "launched",
                                                            "rel_err_vs_reference", "error")}
                       for x in r.get("split_rows", [])},
            "error": r.get("error")}
except Exception as e:
    s["bench_error"] = repr(e)
write(out, s)
PY
echo "total $(( $(date +%s) - start )) s"
