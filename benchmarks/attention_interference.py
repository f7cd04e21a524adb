"""Why the Gluon FP4-KV attention runs ~13% slower inside the engine's decode step than alone (issue 16; docs/
benchmarks.md run 9: 920 vs 816 us per layer at B = 313 x 8447, nvfp4, LEAN). Three CUDA graphs over the same
tensors, the fixed workload's shapes (Qwen3-8B heads, 64-token pages scattered at random, every sequence at L):

- `attn`: the attention N times (what benchmarks/attention_sass.py times);
- `gemm`: N rounds of the step's bf16 cuBLAS GEMMs at M = 313 (q/k/v 4096 -> 6144, o 4096 -> 4096, gate/up
  4096 -> 24576, down 12288 -> 4096: the operand cache's linears), compute-bound;
- `mixed`: N rounds of those GEMMs each followed by the attention (a layer's order).

If `mixed` > `attn` + `gemm` by more than noise, the attention is slowed by what runs around it (the GEMMs' power
draw lowering the SM clock of an issue-bound kernel, or their L2 footprint); if not, the loss inside the engine
comes from elsewhere (its page pool, its inputs). SM clocks are sampled with nvidia-smi during each graph's replays.

    python benchmarks/attention_interference.py --out OUT.json [--L 8447] [--B 313] [--fmt nvfp4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attention as A  # noqa: E402
import torch  # noqa: E402

GEMMS = ((4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096))     # (K, N) of one Qwen3-8B layer's linears


def _clock_sampler(stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=5)
            out.append(r.stdout.strip())
        except Exception as e:   # noqa: BLE001
            out.append(repr(e))
            return
        time.sleep(0.05)


def _timed(calls: list, reps: int) -> tuple[float, list]:
    """Median us per call of `calls` in one CUDA graph (engine.timing.graph_median_us), with the SM clock / power
    samples taken meanwhile."""
    from trace_rl.engine.timing import graph_median_us

    stop, samples = threading.Event(), []
    t = threading.Thread(target=_clock_sampler, args=(stop, samples))
    t.start()
    try:
        us = graph_median_us(calls, reps)
    finally:
        stop.set()
        t.join()
    return us, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--B", type=int, default=313)
    ap.add_argument("--L", type=int, default=8447)
    ap.add_argument("--fmt", default="nvfp4")
    ap.add_argument("--rounds", type=int, default=8, help="layers per graph")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    from trace_rl.kernels.paged_attention_gluon import decode_attention_gluon

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    pages = -(-args.L // 64)
    blocks = args.B * pages
    table = torch.randperm(blocks, device=dev).to(torch.int32).reshape(args.B, pages)
    lens = torch.full((args.B,), args.L, device=dev, dtype=torch.int32)
    q = torch.randn(args.B, A.HQ, A.D, device=dev, dtype=torch.bfloat16)
    k, v = A.random_cache(args.fmt, "k", blocks, 64, gen), A.random_cache(args.fmt, "v", blocks, 64, gen)
    x = {K: torch.randn(args.B, K, device=dev, dtype=torch.bfloat16) for K in {K for K, _ in GEMMS}}
    w = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for K, N in GEMMS]
    scale = A.D ** -0.5

    def attn():
        decode_attention_gluon(q, k, v, table, lens, scale)

    def gemms():
        for (K, _), wi in zip(GEMMS, w):
            torch.nn.functional.linear(x[K], wi)

    rounds = {"attn": [attn] * args.rounds, "gemm": [gemms] * args.rounds,
              "mixed": [f for _ in range(args.rounds) for f in (gemms, attn)]}
    res = {"device": torch.cuda.get_device_name(), "B": args.B, "L": args.L, "fmt": args.fmt, "rounds": args.rounds}
    for name, calls in rounds.items():
        us, samples = _timed(calls, args.reps)
        per_round = us * len(calls) / args.rounds
        res[name] = {"ms": per_round * args.rounds / 1e3, "us_per_round": per_round,
                     "clock_power_samples": samples[:40]}
        print(name, round(per_round, 1), "us per round", samples[:5], flush=True)
    extra = res["mixed"]["us_per_round"] - res["attn"]["us_per_round"] - res["gemm"]["us_per_round"]
    res["mixed_minus_sum_us_per_round"] = extra
    res["attention_slowdown_if_all_on_it"] = (res["attn"]["us_per_round"] + extra) / res["attn"]["us_per_round"]
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)}), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
