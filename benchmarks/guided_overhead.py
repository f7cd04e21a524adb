"""Trainer-side cost of TRACE guided rounding: forward+backward time of a trainer step in `bf16`, `aligned`
and `guided` modes on the same batch, plus the record's bytes per token. Records come from quantizing the
trainer's own activations (what the rollout would have recorded for identical inputs: same shapes and cost).

    python benchmarks/guided_overhead.py [--preset qwen3-1.7b] [--layers 4] [--batch 4] [--seq 512] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trace_rl.correction.guided import record_guidance
from trace_rl.formats import per_token
from trace_rl.models.decoder import build
from trace_rl.models.presets import preset
from trace_rl.plan import PrecisionPlan


def capture_records(model, tokens):
    """Run once in aligned mode, recording every quantized Linear input (and K/V) as the rollout would."""
    records, kv_records = {}, {}
    for name, lin in model.linears().items():
        if lin.act_fmt != "bf16":
            lin.activation_hook = lambda layer, x, n=name: records.__setitem__(
                n, record_guidance(x.detach(), per_token(layer.act_fmt))) or None
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.kv_hook = lambda a, k, v: kv_records.__setitem__(a.layer_idx, (
            record_guidance(k.detach(), per_token(a.kv_fake_fmt)),
            record_guidance(v.detach(), per_token(a.kv_fake_fmt)))) or None
    with torch.no_grad():
        model(tokens)
    for name, lin in model.linears().items():
        lin.activation_hook = (lambda layer, x, r=records[name]: r) if name in records else None
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.kv_hook = lambda a, k, v, r=kv_records[attn.layer_idx]: r
    return records, kv_records


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_step(model, tokens, reps: int) -> float:
    times = []
    for i in range(reps + 2):
        sync()
        t0 = time.perf_counter()
        loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-1.7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="guided_overhead.json")
    args = ap.parse_args()
    config = preset(args.preset).replace(num_layers=args.layers)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "preset": args.preset,
               "layers": args.layers, "batch": args.batch, "seq": args.seq, "ms": {}}
    for mode in ("bf16", "aligned", "guided"):
        plan = PrecisionPlan.preset("fp4-guided").model_copy(update={"trainer": "aligned" if mode == "bf16"
                                                                     else mode})
        model = build(config, device=args.device, dtype=torch.bfloat16).init_random(
            generator=torch.Generator(device=args.device).manual_seed(0))
        model.apply_plan(None if mode == "bf16" else plan)
        if mode == "guided":
            records, kv = capture_records(model.apply_plan(plan.model_copy(update={"trainer": "aligned"})), tokens)
            model.apply_plan(plan)
            per_token_bytes = (sum(r.bytes_per_row() for r in records.values())
                               + sum(a.bytes_per_row() + b.bytes_per_row() for a, b in kv.values()))
            results["record_bytes_per_token"] = per_token_bytes
            results["record_bytes_per_token_per_layer"] = per_token_bytes / args.layers
        results["ms"][mode] = time_step(model, tokens, args.reps)
        del model
    ms = results["ms"]
    results["guided_over_aligned"] = ms["guided"] / ms["aligned"]
    results["guided_over_bf16"] = ms["guided"] / ms["bf16"]
    print(json.dumps(results, indent=1))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
