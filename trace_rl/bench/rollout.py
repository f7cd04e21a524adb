"""`trace-rl bench rollout`: RL rollout throughput of the native engine per precision plan, against the
read-bandwidth roofline, a plain PyTorch decode step (bf16) and transformers' `generate`.

Workload: N prompts x G samples, a fixed prompt length, a fixed response length (stop tokens ignored),
random weights of a real model's shape. Per (model, response length, plan):

- concurrency B = the sequences that fit in memory beside the weights (capped by N*G and --max-batch);
- decode step time at contexts L0 = P+1, L1 = P+R/2, L2 = P+R-1 (CUDA events, median after warm-up), as
  the captured forward alone (`forward_ms`) and with sampling and bookkeeping (`step_ms`); the decode
  time of a wave is (R-1) x the Simpson mean over the three (step time is linear in L);
- prefill of B prompts, timed through `generate(max_new_tokens=1)`; one wave = prefill + decode;
  tokens/s = B*R / wave time. `--mode full` instead times complete generations (long on real shapes);
- an end-to-end check: `generate` of a short response vs prefill + steps predicted from the step times;
- roofline: floor = (weight bytes + B*L*KV bytes per token) / measured read bandwidth.

Then the plain PyTorch step (bf16, same B and L) and HF `generate` against our engine on a short workload.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
from pathlib import Path

import torch

from trace_rl.bench import measure as bm

PLANS = ("bf16", "fp8", "w4a16", "w4a4-kv4", "w4a4-kv4-mx")


def add_rollout_bench_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    a = parser.add_argument
    a("--models", default="qwen3-8b", help="comma-separated model presets (qwen3-1.7b, qwen3-8b, tiny)")
    a("--plans", default=",".join(PLANS), help=f"comma-separated plan presets (default: {','.join(PLANS)})")
    a("--prompts", type=int, default=64, help="N prompts")
    a("--group", type=int, default=8, help="G samples per prompt")
    a("--prompt-len", type=int, default=256, help="tokens per prompt")
    a("--response-lens", default="1024,8192", help="comma-separated response lengths (tokens)")
    a("--max-batch", type=int, default=0, help="cap on concurrent sequences (0: what fits in memory)")
    a("--mode", choices=("steps", "full"), default="steps", help="steps: timed decode steps at 3 contexts; "
      "full: time whole generations")
    a("--iters", type=int, default=10, help="timed repetitions per measurement")
    a("--e2e-tokens", type=int, default=16, help="response length of the end-to-end check (32 rows)")
    a("--prefill-tokens", type=int, default=4096, help="prompt tokens per prefill chunk")
    a("--bf16-attention", default="flash_varlen,kernels", help="decode-attention paths timed for bf16 KV")
    a("--hf-batch", type=int, default=64, help="sequences in the HF comparison (0 skips it)")
    a("--hf-new-tokens", type=int, default=64, help="response length of the HF comparison")
    a("--no-baseline", action="store_true", help="skip the plain PyTorch decode step")
    a("--reserve-gb", type=float, default=6.0, help="GPU memory kept free beside weights and KV cache")
    a("--device", default=None, help="cuda (default when present) or cpu")
    a("--out", default="runs/bench_rollout", help="folder for rollout.json and rollout.png")
    a("--seed", type=int, default=0, help="seed of weights, caches and prompts")
    return parser


def _free(*objs) -> None:
    """Collect garbage (engines and their graphs form reference cycles) and return cached GPU memory."""
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _build_rollout_model(name: str, plan, device, dtype, seed: int):
    """Random weights of a preset's shape, converted in place to the plan's rollout form (no trainer copy)."""
    from trace_rl.models import build, preset

    model = build(preset(name), device=device, dtype=dtype, plan=plan)
    model.init_random(generator=torch.Generator(device=device).manual_seed(seed))
    return model.to_rollout()


def _fit_batch(args, model, plan, capacity: int, device) -> tuple[int, dict]:
    c = model.config
    per_token = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
    want = args.prompts * args.group
    if args.max_batch:
        want = min(want, args.max_batch)
    if device.type != "cuda":
        return want, {"kv_bytes_per_token": per_token}
    _free()
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)   # cached, reusable
    emulated = sum(4 * lin.quant.out_features * lin.quant.in_features for lin in model.linears().values()
                   if "emulated" in lin.quant.backend.available(device).path and lin.quant.weight_fmt != "bf16")
    per_seq = capacity * per_token + 40 * c.vocab_size          # KV + sampling temporaries over the vocab
    fit = int((free - args.reserve_gb * 2**30 - emulated) // per_seq)
    return max(1, min(want, fit)), {"kv_bytes_per_token": per_token, "fit": fit, "free_GB": free / 2**30,
                                    "emulated_dequant_GB": emulated / 2**30}


def _engine_steps(engine, batch: int, lengths: list[int], args, sampling) -> list[dict]:
    from trace_rl.engine.native import _Run

    dev = engine.device
    vocab = min(1000, engine.model.config.vocab_size)
    prompts = torch.randint(4, vocab, (batch, 1), device=dev)
    run = _Run(engine, sampling, prompts, torch.ones(batch, dtype=torch.long, device=dev), [1] * batch, batch)
    out = []
    warmup = 3
    for length in lengths:
        # A full step advances every position: start early enough that the last timed step feeds position
        # length-1 (the slot's capacity is the bound); the forward-only timing does not advance.
        start = max(1, length - 1 - warmup - args.iters)
        engine.positions[:batch] = start
        engine.ngen[:batch] = 1
        engine.live[:batch] = True
        engine.slot_row[:batch] = torch.arange(batch, device=dev)
        engine.tokens[:batch] = torch.randint(4, vocab, (batch,), device=dev)
        fwd = bm.median_ms(lambda: engine.decode_logits(batch), dev, args.iters, warmup)
        full = bm.median_ms(lambda: run._decode_step(batch), dev, args.iters, warmup)
        out.append({"L": length, "forward_ms": fwd, "step_ms": full})
    return out


def _random_prompts(batch: int, length: int, vocab: int, device, seed: int):
    from tensordict import TensorDict

    from trace_rl.data import schema as K

    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randint(4, min(1000, vocab), (batch, length), device=device, generator=gen)
    return TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: torch.ones_like(tokens, dtype=torch.bool)},
                      batch_size=[batch])


def _simpson(values: list[float]) -> float:
    return (values[0] + 4 * values[1] + values[2]) / 6


def _bench_plan(args, name: str, plan_name: str, response: int, device, bw, attention: str = "auto") -> dict:

    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.native import NativeEngine
    from trace_rl.plan import PrecisionPlan

    _free()                                   # the previous configuration's engine, graphs and cache
    plan = PrecisionPlan.preset(plan_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = _build_rollout_model(name, plan, device, dtype, args.seed)
    model.plan = plan
    p, r = args.prompt_len, response
    block = 16
    capacity = math.ceil((p + r) / block) * block
    batch, fit = _fit_batch(args, model, plan, capacity, device)
    engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=p + r, block_size=block, device=device,
                          attention=attention, graph_buckets=[batch], prefill_tokens=args.prefill_tokens)
    bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=r, ignore_stop=True, seed=args.seed)
    lengths = [p + 1, p + r // 2, p + r - 1]
    steps = _engine_steps(engine, batch, lengths, args, sampling)
    # Prefill is compute-bound and linear in the prompts at a fixed chunk size: time 64 prompts (after a
    # warm-up chunk that compiles the kernels for the chunk's shape) and scale to B.
    vocab = model.config.vocab_size
    one = sampling.model_copy(update={"max_new_tokens": 1})
    warm = max(1, engine.prefill_tokens // p)
    engine.generate(_random_prompts(min(warm, batch), p, vocab, device, args.seed), one)
    timed = min(64, batch)
    prefill_s = bm.wall_s(lambda: engine.generate(_random_prompts(timed, p, vocab, device, args.seed + 1), one),
                          device) * batch / timed
    # End to end: a short generate through the same captured graph (bucket B) vs prefill + steps predicted.
    e2e_rows, e2e_new = min(32, batch), min(args.e2e_tokens, r)
    e2e_prompts = _random_prompts(e2e_rows, p, vocab, device, args.seed + 2)
    e2e_s = bm.wall_s(lambda: engine.generate(e2e_prompts, sampling.model_copy(update={"max_new_tokens": e2e_new})),
                      device)
    predicted = prefill_s * e2e_rows / batch + (e2e_new - 1) * steps[0]["step_ms"] * 1e-3
    step_mean = _simpson([s["step_ms"] for s in steps])
    fwd_mean = _simpson([s["forward_ms"] for s in steps])
    if args.mode == "full":
        wave_s = bm.wall_s(lambda: engine.generate(_random_prompts(batch, p, vocab, device, args.seed), sampling),
                           device)
    else:
        wave_s = prefill_s + (r - 1) * step_mean * 1e-3
    wbytes = bm.weight_bytes(engine.model)
    per_token = engine.cache.bytes_per_token()
    read_bw = bw.get("read") or 4.0e12
    for s in steps:
        s["bytes"] = wbytes + batch * s["L"] * per_token
        s["floor_ms"] = s["bytes"] / read_bw * 1e3
        s["roofline_frac"] = s["floor_ms"] / s["forward_ms"]
        s["achieved_TBps"] = s["bytes"] / (s["forward_ms"] * 1e-3) / 1e12
    total = args.prompts * args.group
    result = {
        "model": name, "plan": plan_name, "plan_label": plan.label, "attention": engine.cache.attention_path,
        "response_len": r, "prompt_len": p, "batch": batch, "waves": math.ceil(total / batch), **fit,
        "weight_GB": wbytes / 1e9, "kv_bytes_per_token": per_token, "steps": steps,
        "forward_ms_mean": fwd_mean, "step_ms_mean": step_mean, "decode_tokens_per_s": batch / (fwd_mean * 1e-3),
        "prefill_s": prefill_s, "wave_s": wave_s, "tokens_per_s": batch * r / wave_s,
        "e2e": {"rows": e2e_rows, "new_tokens": e2e_new, "seconds": e2e_s, "predicted_s": predicted,
                "ratio": e2e_s / predicted},
        "paths": engine.report(), "mode": args.mode,
        "peak_memory_GB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    _free(engine, model)
    return result


def _bench_baseline(args, name: str, response: int, batch: int, device, bw) -> dict:
    from trace_rl.bench.baseline import PlainDecode
    from trace_rl.models import preset

    _free()
    p, r = args.prompt_len, response
    base = PlainDecode(preset(name), batch, p + r, device, seed=args.seed)
    read_bw = bw.get("read") or 4.0e12
    steps = []
    for length in (p + 1, p + r // 2, p + r - 1):
        ms = bm.median_ms(lambda length=length: base.replay(length), device, args.iters)
        nbytes = base.weight_bytes + base.kv_bytes_read(length)
        steps.append({"L": length, "forward_ms": ms, "floor_ms": nbytes / read_bw * 1e3,
                      "roofline_frac": nbytes / read_bw * 1e3 / ms})
    mean = _simpson([s["forward_ms"] for s in steps])
    backend = base.sdpa_backend
    _free(base)
    return {"model": name, "response_len": r, "batch": batch, "sdpa_backend": backend, "steps": steps,
            "forward_ms_mean": mean,
            "decode_tokens_per_s": batch / (mean * 1e-3)}


def _bench_hf(args, name: str, device) -> dict:
    """HF generate and our engine (bf16) on the same short workload."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.hf import HFEngine
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import preset
    from trace_rl.plan import PrecisionPlan

    _free()
    batch, new, p = args.hf_batch, args.hf_new_tokens, args.prompt_len
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prompts = _random_prompts(batch, p, preset(name).vocab_size, device, args.seed)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_stop=True, seed=args.seed)
    cfg = AutoConfig.for_model(**preset(name).to_hf_dict("bfloat16"))
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    engine = HFEngine(hf, return_log_probs=False)
    short = sampling.model_copy(update={"max_new_tokens": 2})
    engine.generate(prompts, short)
    hf_s = bm.wall_s(lambda: engine.generate(prompts, sampling), device)
    _free(engine, hf)
    model = _build_rollout_model(name, PrecisionPlan(), device, dtype, args.seed)
    model.plan = PrecisionPlan()
    ours = NativeEngine(model, PrecisionPlan(), max_batch=batch, max_seq_len=p + new, device=device,
                        graph_buckets=[batch])
    ours.generate(prompts, short)
    ours_s = bm.wall_s(lambda: ours.generate(prompts, sampling), device)
    _free(ours, model)
    return {"model": name, "batch": batch, "prompt_len": p, "new_tokens": new,
            "hf_tokens_per_s": batch * new / hf_s, "native_tokens_per_s": batch * new / ours_s,
            "speedup": hf_s / ours_s}


def run_rollout_bench(args) -> dict:
    """Run the bench described by `args` (see `add_rollout_bench_args`); writes JSON + PNG, returns the dict."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bw = bm.bandwidth_ceilings(device)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "read_bandwidth_TBps": (bw["read"] or 0) / 1e12,
              "copy_bandwidth_TBps": (bw["copy"] or 0) / 1e12, "workload": {k: v for k, v in vars(args).items()
                                                                        if not callable(v)},
              "results": [], "baseline": [], "hf": [], "errors": []}
    models = [m for m in args.models.split(",") if m]
    responses = [int(r) for r in args.response_lens.split(",") if r]
    for name in models:
        for r in responses:
            for plan_name in [p for p in args.plans.split(",") if p]:
                attentions = ["auto"]
                if plan_name == "bf16" and device.type == "cuda":
                    attentions = [a for a in args.bf16_attention.split(",") if a]
                for attention in attentions:
                    try:
                        res = _bench_plan(args, name, plan_name, r, device, bw, attention)
                        report["results"].append(res)
                        _print_result(res)
                        _write(report, out_dir)
                    except Exception as err:  # one failing configuration must not hide the others
                        report["errors"].append({"model": name, "plan": plan_name, "response_len": r,
                                                 "attention": attention, "error": f"{type(err).__name__}: {err}"})
                        print(f"FAILED {name} {plan_name} R={r} attention={attention}: {type(err).__name__}: {err}")
                        _free()
            bf16 = [x for x in report["results"] if x["model"] == name and x["response_len"] == r
                    and x["plan"] == "bf16"]
            if bf16 and device.type == "cuda" and not args.no_baseline:
                try:
                    report["baseline"].append(_bench_baseline(args, name, r, bf16[0]["batch"], device, bw))
                except Exception as err:
                    report["errors"].append({"model": name, "baseline": r, "error": f"{type(err).__name__}: {err}"})
        if args.hf_batch:
            try:
                report["hf"].append(_bench_hf(args, name, device))
            except Exception as err:
                report["errors"].append({"model": name, "hf": True, "error": f"{type(err).__name__}: {err}"})
    report["summary"] = _summary(report)
    _write(report, out_dir)
    _plot(report, out_dir / "rollout.png")
    _print_summary(report)
    return report


def _write(report: dict, out_dir: Path) -> None:
    """Written after every configuration, so a run cut short still leaves its numbers."""
    (out_dir / "rollout.json").write_text(json.dumps(report, indent=1, default=str))


def _best(results, **match):
    rows = [x for x in results if all(x[k] == v for k, v in match.items())]
    return max(rows, key=lambda x: x["tokens_per_s"]) if rows else None


def _summary(report: dict) -> list[dict]:
    lines = []
    for base in report["baseline"]:
        ours = _best(report["results"], model=base["model"], response_len=base["response_len"], plan="bf16")
        w4 = _best(report["results"], model=base["model"], response_len=base["response_len"], plan="w4a4-kv4")
        lines.append({"model": base["model"], "response_len": base["response_len"],
                      "bf16_decode_vs_plain": ours["decode_tokens_per_s"] / base["decode_tokens_per_s"],
                      "w4a4kv4_vs_bf16_tokens_per_s": w4["tokens_per_s"] / ours["tokens_per_s"] if w4 else None})
    for hf in report["hf"]:
        lines.append({"model": hf["model"], "native_vs_hf_same_workload": hf["speedup"]})
    return lines


def _print_result(x: dict) -> None:
    st = " ".join(f"L{s['L']}:{s['forward_ms']:.2f}/{s['step_ms']:.2f}ms({s['roofline_frac']:.0%})" for s in x["steps"])
    print(f"{x['model']} R={x['response_len']} {x['plan']:<12} attn={x['attention']:<26} B={x['batch']:<4} "
          f"tok/s={x['tokens_per_s']:9.0f} decode tok/s={x['decode_tokens_per_s']:9.0f} {st} "
          f"prefill={x['prefill_s']:.2f}s e2e/pred={x['e2e']['ratio']:.2f} peak={x['peak_memory_GB'] or 0:.1f}GB")


def _print_summary(report: dict) -> None:
    print(f"read bandwidth {report['read_bandwidth_TBps']:.2f} TB/s, copy {report['copy_bandwidth_TBps']:.2f} TB/s")
    for b in report["baseline"]:
        print(f"plain PyTorch {b['model']} R={b['response_len']} B={b['batch']}: decode tok/s "
              f"{b['decode_tokens_per_s']:.0f} " + " ".join(f"L{s['L']}:{s['forward_ms']:.2f}ms"
                                                            f"({s['roofline_frac']:.0%})" for s in b["steps"]))
    for h in report["hf"]:
        print(f"HF {h['model']} B={h['batch']} new={h['new_tokens']}: HF {h['hf_tokens_per_s']:.0f} tok/s, "
              f"native {h['native_tokens_per_s']:.0f} tok/s ({h['speedup']:.1f}x)")
    for s in report["summary"]:
        print("summary:", json.dumps(s))
    for e in report["errors"]:
        print("error:", json.dumps(e))


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(x["model"], x["response_len"]) for x in report["results"]})
    plans = [p for p in PLANS if any(x["plan"] == p for x in report["results"])]
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(2.5 + 2.2 * len(groups), 4))
    width = 0.8 / (len(plans) + 1)
    for i, plan in enumerate(plans):
        vals = [(_best(report["results"], model=m, response_len=r, plan=plan) or {}).get("tokens_per_s", 0)
                for m, r in groups]
        ax.bar([g + i * width for g in range(len(groups))], vals, width, label=plan)
    base = [next((b["decode_tokens_per_s"] for b in report["baseline"] if (b["model"], b["response_len"]) == g), 0)
            for g in groups]
    ax.bar([g + len(plans) * width for g in range(len(groups))], base, width, label="plain PyTorch bf16 (decode)",
           color="grey")
    ax.set_xticks([g + 0.4 for g in range(len(groups))], [f"{m}\nR={r}" for m, r in groups])
    ax.set_ylabel("tokens / s")
    ax.set_title(f"rollout throughput, {report['device']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = add_rollout_bench_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    return run_rollout_bench(parser.parse_args(argv))
