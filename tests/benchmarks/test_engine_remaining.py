"""benchmarks/engine_remaining_h200.sh end to end on CPU with the tiny preset (its env overrides), and its summary
(benchmarks/engine_remaining_summary.py) of a cut run: no HF row, one realistic plan of two."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import engine_remaining_summary as ers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_script_tiny_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HF_MODEL": "tiny", "HF_NEW": "4",
           "HF_ARGS": "--hf-batch 2 --prompt-len 5 --device cpu", "REAL_MODEL": "tiny", "REAL_PLANS": "bf16,w4a4-kv4",
           "REAL_PROMPTS": "1", "REAL_LAYERS": "0",
           "BENCH_ARGS": "--realistic-max 12 --realistic-median 6 --prompt-len 5 --device cpu"}
    done = subprocess.run(["bash", "benchmarks/engine_remaining_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bench_rc"] == {"hf": 0, "realistic": 0} and not s["errors"]
    hf = s["hf"]
    assert hf["model"] == "tiny" and hf["batch"] == 2 and hf["new_tokens"] == 4 and hf["hf_time_limit_s"] == 120
    assert not hf["hf_truncated"] and hf["hf_tokens_reached"] == 4 and hf["native_vs_hf_decode_same_tokens"] > 0
    assert hf["issue16_bar_20x"] == (hf["native_vs_hf_decode_same_tokens"] >= 20)
    assert "hf_decode_tokens_per_s" in hf["rate_definitions"]
    assert [r["plan"] for r in s["realistic"]] == ["bf16", "w4a4-kv4"] and not s["realistic_plans_missing"]
    assert s["headline"]["native_vs_hf_decode_same_tokens"] == hf["native_vs_hf_decode_same_tokens"]
    assert list(s["headline"]["realistic"]) == ["bf16", "w4a4-kv4"]
    for r in s["realistic"]:
        assert r["rows"] == 8 and r["lengths_honoured"] and r["tokens_per_s"] > 0 and r["vs_bf16"] > 0
        assert r["preemptions"] >= 0 and r["shared_prompt_pages"] >= 0 and r["mean_decode_batch"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "hf.log", "realistic", "realistic.log",
                                                          "summary.json"]


def test_summary_of_a_cut_run(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "realistic").mkdir()
    (tmp_path / "hf.log").write_text("[ 18.1s] HF-vs-native qwen3-1.7b B=16: native 6354 tok/s\n"
                                     "[ 90.0s] HF generate: token 128 at 60.0 s (300 decode tok/s since token 1)\n")
    row = {"plan": "bf16", "tokens_per_s": 100.0, "preemptions": 3, "lengths": {"honoured": True, "mean": 9.0}}
    (tmp_path / "realistic" / "rollout.json").write_text(json.dumps(
        {"realistic": [row], "args": {"realistic_plans": "bf16,w4a4-kv4"}, "errors": [], "device": "H200"}))
    s = ers.summarize(str(tmp_path), 124, 124)
    assert s["timed_out"] == {"hf": True, "realistic": True}
    assert "missing" in s["hf"] and any("token 128" in x for x in s["hf"]["log_tail"])
    assert s["realistic"][0]["vs_bf16"] == 1.0 and s["realistic"][0]["preemptions"] == 3
    assert s["realistic_plans_missing"] == ["w4a4-kv4"]
    assert list(s)[0] == "headline" and s["headline"]["realistic"]["bf16"]["preemptions"] == 3
