"""OUT/summary.json of benchmarks/engine_remaining_h200.sh: the HF comparison's ratio (and whether HF was cut by its
time limit) and the realistic workload per plan. Usage: python benchmarks/engine_remaining_summary.py OUT HF_RC
REAL_RC. A part that timed out or failed is summarised from what it wrote (rows finished, the log's tail)."""

from __future__ import annotations

import json
import os
import sys

HF_KEYS = ("model", "layers", "batch", "prompt_len", "new_tokens", "native_vs_hf_decode_same_tokens", "hf_truncated",
           "hf_tokens_reached", "hf_time_limit_s", "hf_s", "hf_decode_s", "hf_decode_tokens_per_s",
           "native_decode_tokens_per_s_same_tokens", "native_decode_tokens_per_s_full", "native_full_vs_hf_decode",
           "native_same_tokens_s", "native_one_token_s", "native_s", "native_first_run_s", "hf_generated_tokens",
           "hf_last_token_synced", "speedup", "hf_attention", "hf_progress", "rate_definitions")
REAL_KEYS = ("rows", "layers", "full_layers", "tokens", "seconds", "graph_capture_s", "tokens_per_s",
             "tokens_per_s_with_capture", "preemptions", "shared_prompt_pages", "mean_decode_batch", "decode_steps",
             "prefill_tokens", "peak_pages", "num_pages", "page_size", "kv_pool_GB", "attention_used")


def _tail(path: str, n: int) -> list[str]:
    try:
        lines = open(path).read().strip().splitlines()
    except OSError:
        return []
    return [x for x in lines if "Warning" not in x and "warnings.warn" not in x][-n:]


def _report(path: str) -> dict | None:
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def summarize(out: str, hf_rc: int, real_rc: int) -> dict:
    s: dict = {"bench_rc": {"hf": hf_rc, "realistic": real_rc},
               "timed_out": {"hf": hf_rc in (124, 137), "realistic": real_rc in (124, 137)}}
    hf = _report(os.path.join(out, "hf", "rollout.json"))
    if hf and hf.get("hf"):
        row = hf["hf"][0]
        s["hf"] = {k: row.get(k) for k in HF_KEYS}
        r = row.get("native_vs_hf_decode_same_tokens")
        s["hf"]["issue16_bar_20x"] = r >= 20 if r else None
    else:   # no row: the native line and HF's progress lines are in the log
        s["hf"] = {"missing": "no hf row (timed out or failed); see log_tail",
                   "errors": (hf or {}).get("errors"),
                   "log_tail": [x for x in _tail(os.path.join(out, "hf.log"), 40) if "HF" in x or "FAILED" in x][-12:]}
    real = _report(os.path.join(out, "realistic", "rollout.json"))
    rows = (real or {}).get("realistic", [])
    bf16 = next((x for x in rows if x["plan"] == "bf16"), None)
    s["realistic"] = []
    for x in rows:
        keep = {"plan": x["plan"], **{k: x.get(k) for k in REAL_KEYS},
                "vs_bf16": x["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None,
                "lengths_honoured": (x.get("lengths") or {}).get("honoured"),
                "mean_length": (x.get("lengths") or {}).get("mean")}
        s["realistic"].append(keep)
    if real:
        asked = [p for p in real["args"]["realistic_plans"].split(",") if p]
        s["realistic_plans_missing"] = [p for p in asked if p not in {x["plan"] for x in rows}]
        s["device"], s["read_TBps"] = real.get("device"), real.get("read_bandwidth_TBps")
    # first in the file: what the session-checks script's `head -c 3000` must show
    h = s["hf"]
    brief = ("tokens_per_s", "vs_bf16", "preemptions", "shared_prompt_pages", "mean_decode_batch")
    s = {"headline": {"native_vs_hf_decode_same_tokens": h.get("native_vs_hf_decode_same_tokens"),
                      "hf_truncated": h.get("hf_truncated"), "hf_tokens_reached": h.get("hf_tokens_reached"),
                      "hf_s": h.get("hf_s"),
                      "realistic": {x["plan"]: {k: x[k] for k in brief} for x in s["realistic"]}}, **s}
    s["errors"] = (hf or {}).get("errors", []) + (real or {}).get("errors", [])
    s["log_tail"] = {"hf": _tail(os.path.join(out, "hf.log"), 8), "realistic": _tail(os.path.join(out, "realistic.log"),
                                                                                        8)}
    return s


def main(argv: list[str]) -> dict:
    out, hf_rc, real_rc = argv[0], int(argv[1]), int(argv[2])
    s = summarize(out, hf_rc, real_rc)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1, default=str)
    print(json.dumps(s, indent=1, default=str)[:8000])
    return s


if __name__ == "__main__":
    main(sys.argv[1:])
