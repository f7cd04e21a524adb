"""MoE rollout and trainer bench: `python benchmarks/moe_rollout.py --help`.

Qwen3-30B-A3B shape (48 layers, 128 experts x 768, top 8), random weights. Rollout: N prompts x G samples
(default 64 x 8) with R-token answers (default 8192, stop tokens ignored), as many sequences at once as
fit in memory beside the weights, the KV cache and the routing records (router replay's, 768 B/token);
per plan (bf16, fp8, w4a16, w4a4-kv4): decode step time at three contexts (captured forward alone and
with sampling and bookkeeping; medians after warm-up), prefill of the prompts, tokens/s of one wave =
B*R / (prefill + (R-1) x mean step), the expert paths the engine took, and the roofline: per step,
bytes = dense weights + the experts a batch of B tokens touches (E * (1 - (1 - k/E)^B) per layer) + the
live KV cache, over the measured read bandwidth. Expert paths: bf16 `grouped_mm`, FP4 `fp4_grouped` (the grouped
FP4 kernel) and FP8 `fp8_grouped` (`torch._scaled_grouped_mm`, sm_90) decode in CUDA graphs. FP4 experts' kernel
layouts are derived, and their reference codes moved to host memory (`offload_reference`; `--keep-reference`
keeps them on the GPU), before the KV cache is sized to the free memory. `--profile`: one eager decode step per
plan at the last context under torch.profiler, GPU time by op class (expert GEMMs, dense GEMMs, activation
quantization, attention, router/top-k/permute/un-permute, SiLU x mul, norms, KV write, sampling, other;
benchmarks/moe_profile.py).
`--estimate`: the batch each plan fits on an H200 (`--gpu-gib`), computed from the shapes alone (any device).

Trainer (run first, in a fresh memory state): forward + backward of `--train-rows` sequences of prompt+response
tokens in bf16 through one model, without and then with router replay (the replayed experts differ from the
trainer's own), median of `--iters` after warm-up each, the cache emptied between them.
The bench sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (`--alloc-conf`) before CUDA starts: the rollout
plans and the trainer allocate tens of GiB in different shapes, and fixed segments fragment.

Each configuration runs in its own try/except and the JSON (`--out`/moe_rollout.json) is rewritten after
each, so a failure or a cut-off run keeps the others' numbers; a table is printed last. On a CPU the same
script runs a tiny shape (`--model tiny-moe --prompts 2 --group 2 --response-len 16 ...`, see
docs/benchmarks.md) to prove the code path, not to measure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
from moe_profile import profile_decode  # benchmarks/ (the script's folder, or appended by the tests)

from trace_rl.bench import measure as bm

PLANS = ("bf16", "fp8", "w4a16", "w4a4-kv4")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--model", default="qwen3-30b-a3b", help="MoE model preset (qwen3-30b-a3b; tiny-moe on CPU)")
    a("--plans", default=",".join(PLANS), help=f"comma-separated plan presets (default {','.join(PLANS)})")
    a("--prompts", type=int, default=64, help="N prompts")
    a("--group", type=int, default=8, help="G samples per prompt")
    a("--prompt-len", type=int, default=256, help="tokens per prompt")
    a("--response-len", type=int, default=8192, help="tokens per answer")
    a("--max-batch", type=int, default=0, help="cap on concurrent sequences (0: what fits in memory)")
    a("--iters", type=int, default=5, help="timed repetitions per measurement")
    a("--prefill-tokens", type=int, default=4096, help="prompt tokens per prefill chunk")
    a("--reserve-gb", type=float, default=8.0, help="GPU memory kept free beside weights, KV cache and records")
    a("--train-rows", type=int, default=4, help="sequences in the timed trainer step")
    a("--train-prompt", type=int, default=256, help="prompt tokens per trainer sequence")
    a("--train-response", type=int, default=768, help="response tokens per trainer sequence")
    a("--layers", type=int, default=0, help="first N layers of the preset only (0: all; smoke tests)")
    a("--profile", action="store_true", help="per plan: an eager decode step at the last context, by op class")
    a("--keep-reference", action="store_true", help="keep FP4 experts' reference codes on the GPU (no offload)")
    a("--estimate", action="store_true", help="only the per-plan batch estimate from the shapes (no device)")
    a("--gpu-gib", type=float, default=139.8, help="device memory for --estimate (H200: 139.8 GiB)")
    a("--alloc-conf", default="expandable_segments:True",
      help="PYTORCH_CUDA_ALLOC_CONF set before CUDA starts unless already set ('' leaves it alone)")
    a("--skip-rollout", action="store_true", help="only the trainer step")
    a("--skip-trainer", action="store_true", help="only the rollout")
    a("--device", default=None, help="cuda (default when present) or cpu")
    a("--out", default="runs/bench_moe", help="folder for moe_rollout.json")
    a("--seed", type=int, default=0, help="seed of weights, caches and prompts")
    return p.parse_args(argv)


def _config(args):
    from dataclasses import replace

    from trace_rl.models import preset

    config = preset(args.model)
    return replace(config, num_layers=args.layers) if args.layers else config


def _random_model(args, plan, device, dtype):
    """A trainer-stage model of the preset's shape (first `--layers`) with random weights."""
    from trace_rl.models import build

    model = build(_config(args), device=device, dtype=dtype, plan=plan)
    return model.init_random(generator=torch.Generator(device=device).manual_seed(args.seed))


def _rollout_model(args, plan, device, dtype) -> tuple:
    """The plan's rollout model, FP4 expert layouts derived (and their reference codes offloaded unless
    `--keep-reference`) before anything sizes a cache: (model, seconds per stage, GiB offloaded)."""
    times, t = {}, time.perf_counter()
    model = _random_model(args, plan, device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize()
    times["build_init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    model = model.to_rollout()
    model.plan = plan
    times["to_rollout_s"] = time.perf_counter() - t
    t = time.perf_counter()
    freed = sum(ex.derive_kernel_layouts(offload_reference=not args.keep_reference) for ex in model.experts())
    bm.free()
    times["layouts_s"] = time.perf_counter() - t
    return model, times, freed / 2**30


def _weight_bytes(model) -> tuple[int, int, int]:
    """(dense bytes read per step, bytes of one layer's expert set, MoE layers) of a rollout model."""
    dense = bm.weight_bytes(model)
    experts = model.experts()
    per_layer = sum(g.nbytes for g in experts[0].grouped_linears().values()) if experts else 0
    return dense, per_layer, len(experts)


def _touched(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected experts a batch of `tokens` (top-k each, uniform routing) reads in one layer."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def _fit(args, model, plan, capacity: int, device) -> tuple[int, dict]:
    c = model.config
    kv = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
    routing = 2 * len(c.moe_layers()) * c.num_experts_per_tok            # int16 record per token
    want = args.prompts * args.group if not args.max_batch else min(args.prompts * args.group, args.max_batch)
    info = {"kv_bytes_per_token": kv, "routing_bytes_per_token": routing}
    if device.type != "cuda":
        return want, info
    bm.free()
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    per_seq = capacity * (kv + routing) + 40 * c.vocab_size
    fit = int((free - args.reserve_gb * 2**30) // per_seq)
    return max(1, min(want, fit)), {**info, "fit": fit, "free_GB": free / 2**30}


def _step_with_records(engine, batch: int, length: int, sampling=(1.0, 0, 1.0)):
    """One decode step as the scheduler runs it for an MoE model: the captured step, then the routing
    records of the live slots moved to their rows (outside the graph)."""
    def step():
        where = None if engine.routing is None else (
            torch.where(engine.live[:batch], engine.slot_row[:batch], batch), (engine.ngen[:batch] - 1).clamp(min=0))
        engine.decode_step(batch, length, sampling)
        if where is not None:
            engine.routing.store_decode(*where)
    return step


def bench_rollout(args, plan_name: str, device, bw) -> dict:
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.workloads import _simpson, random_prompts
    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.native import NativeEngine
    from trace_rl.kv.cache import default_page_size
    from trace_rl.plan import PrecisionPlan

    bm.free()
    plan = PrecisionPlan.preset(plan_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model, build_parts, offloaded_gib = _rollout_model(args, plan, device, dtype)
    build_s = time.perf_counter() - t0
    probe = torch.empty(1, model.config.hidden_size, device=device, dtype=dtype)
    expert_paths = sorted({g.path(probe) for ex in model.experts() for g in ex.grouped_linears().values()})
    p, r = args.prompt_len, args.response_len
    block = default_page_size(plan.kv_cache)
    layout = "contiguous" if plan.kv_cache == "bf16" else "pool"
    capacity = math.ceil((p + r) / block) * block
    batch, fit = _fit(args, model, plan, capacity, device)
    engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=p + r, block_size=block, device=device,
                          graph_buckets=[batch], prefill_tokens=args.prefill_tokens, kv_layout=layout)
    bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
    engine.routing.begin(1, p, batch, r)          # per-row record store of this many rows (row `batch` = idle)
    steps, warmup = [], 3
    for length in (p + 1, p + r // 2, p + r - 1):
        prime_decode(engine, batch, length, args.seed)
        fwd = bm.median_ms(lambda n=length: engine.decode_logits(batch, n), device, args.iters, warmup)
        prime_decode(engine, batch, max(1, length - 1 - warmup - args.iters), args.seed)
        step = bm.median_ms(_step_with_records(engine, batch, length), device, args.iters, warmup)
        steps.append({"L": length, "forward_ms": fwd, "step_ms": step})
    profile = None
    if args.profile and device.type != "cuda":
        profile = {"skipped": "the profile times GPU kernels: needs a CUDA device"}
    elif args.profile:
        try:
            profile = profile_decode(engine, batch, p + r - 1)
            profile["graph_step_ms"] = steps[-1]["step_ms"]     # the same step, captured: gaps = graph - kernels
            print(f"profile {plan_name} B={batch} L={p + r - 1}: " + "  ".join(
                f"{c}={ms:.2f}" for c, ms in profile["classes_ms"].items() if ms) +
                f"  (kernels {profile['kernel_sum_ms']:.2f} ms, graph step {steps[-1]['step_ms']:.2f} ms)", flush=True)
        except Exception as err:  # the profile must not lose the plan's numbers
            profile = {"error": f"{type(err).__name__}: {err}"}
            print(f"profile {plan_name} FAILED: {profile['error']}", flush=True)
    vocab = model.config.vocab_size
    group = min(args.group, batch)
    one = SamplingParams(n=group, temperature=1.0, max_new_tokens=1, ignore_stop=True, seed=args.seed)
    timed = max(1, min(64, batch) // group)
    # Warm up with the timed call's shape: the FP4 GEMMs pick their tile by M (prompt tokens), and a first call
    # at a new M compiles its Triton kernels, which the timed prefill must not include (x batch/(timed x group)
    # below, a 2 s compile would read as ~15 s of prefill; calls 5-6 on 2026-12-01 were measured that way).
    engine.generate(random_prompts(timed, p, vocab, device, args.seed), one)
    prefill_s = bm.wall_s(lambda: engine.generate(random_prompts(timed, p, vocab, device, args.seed + 1), one),
                          device) * batch / (timed * group)
    c = model.config
    dense, expert_layer, moe_layers = _weight_bytes(engine.model)
    touched = _touched(c.num_experts, c.num_experts_per_tok, batch)
    read_bw = bw.get("read") or 4.0e12
    per_token = engine.cache.bytes_per_token()
    for st in steps:
        st["bytes"] = dense + moe_layers * expert_layer * touched / c.num_experts + batch * st["L"] * per_token
        st["floor_ms"] = st["bytes"] / read_bw * 1e3
        st["roofline_frac"] = st["floor_ms"] / st["forward_ms"]
    step_mean = _simpson([st["step_ms"] for st in steps])
    wave_s = prefill_s + (r - 1) * step_mean * 1e-3
    result = {
        "plan": plan_name, "label": plan.label, "model": args.model, "batch": batch, "kv_layout": layout, **fit,
        "waves": math.ceil(args.prompts * args.group / batch), "build_s": build_s, "build_parts": build_parts,
        "layers": model.config.num_layers, "reference_offloaded_GiB": offloaded_gib, "profile": profile,
        "dense_weight_GB": dense / 1e9, "expert_weight_GB": moe_layers * expert_layer / 1e9,
        "experts_touched_per_layer": touched, "steps": steps, "step_ms_mean": step_mean,
        "forward_ms_mean": _simpson([st["forward_ms"] for st in steps]), "prefill_s": prefill_s, "wave_s": wave_s,
        "tokens_per_s": batch * r / wave_s, "cuda_graphs": engine.graphs is not None, "expert_paths": expert_paths,
        "paths": engine.report(),
        "peak_memory_GB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    bm.free(engine, model)
    return result


def bench_trainer(args, device) -> list[dict]:
    """Forward + backward without and with router replay through one bf16 model, each timed after its own
    warm-up from the same memory state (gradients dropped, cache emptied in between)."""
    from tensordict import TensorDict

    from trace_rl.data import schema as K
    from trace_rl.objectives.logprobs import response_log_probs
    from trace_rl.objectives.router_replay import router_replay

    bm.free()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _random_model(args, None, device, dtype)
    c, rows, lp, lr = model.config, args.train_rows, args.train_prompt, args.train_response
    gen = torch.Generator(device=device).manual_seed(args.seed)
    prompt = torch.randint(4, min(1000, c.vocab_size), (rows, lp), device=device, generator=gen)
    resp = torch.randint(4, min(1000, c.vocab_size), (rows, lr), device=device, generator=gen)
    ones = lambda t: torch.ones_like(t, dtype=torch.bool)  # noqa: E731
    moe = len(c.moe_layers())
    # replayed experts: distinct per token, not the trainer's own (as a rollout that routed otherwise)
    experts = torch.rand(rows, lp + lr, moe, c.num_experts, device=device, generator=gen).topk(
        c.num_experts_per_tok, dim=-1).indices.to(torch.int16)
    td = TensorDict({K.TOKENS_PROMPT: prompt, K.MASK_PROMPT: ones(prompt), K.TOKENS_RESPONSE: resp,
                     K.MASK_RESPONSE: ones(resp), K.ROUTING_EXPERTS: experts,
                     K.ROUTING_VALID: torch.ones(rows, lp + lr, dtype=torch.bool, device=device)}, batch_size=[rows])
    paths = sorted({"grouped_mm" if _grouped(ex, dtype, device) else "loop" for ex in model.experts()})
    out = []
    for replay in (False, True):
        def step(replay=replay):
            model.zero_grad(set_to_none=True)
            with router_replay(model, td) if replay else _null():
                logp, _ = response_log_probs(model, prompt, ones(prompt), resp, ones(resp))
            logp.sum().backward()

        try:
            model.zero_grad(set_to_none=True)
            bm.free()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ms = bm.median_ms(step, device, args.iters, warmup=2)
            res = {"replay": replay, "rows": rows, "tokens": rows * (lp + lr), "fwd_bwd_ms": ms,
                   "tokens_per_s": rows * (lp + lr) / (ms * 1e-3), "expert_path": paths,
                   "layers": c.num_layers,
                   "peak_memory_GB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
        except Exception as err:  # replay off's number must survive replay on's failure
            res = {"replay": replay, "error": f"{type(err).__name__}: {err}"}
        out.append(res)
    model.zero_grad(set_to_none=True)
    bm.free(model)
    return out


def _grouped(experts, dtype, device) -> bool:
    from trace_rl.backends.grouped_linear import grouped_mm_runs

    x = torch.empty(1, experts.hidden, dtype=dtype, device=device, requires_grad=True)
    return grouped_mm_runs(x, experts.gate_up_proj)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.alloc_conf and not torch.cuda.is_initialized():
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", args.alloc_conf)   # read when CUDA starts, just below
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.estimate:
        report = {"estimate": estimate_batches(args)}
        (out / "moe_rollout_estimate.json").write_text(json.dumps(report, indent=1))
        return report
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bw = bm.bandwidth_ceilings(device) if device.type == "cuda" else {"read": None, "copy": None}
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "read_bandwidth_TBps": (bw["read"] or 0) / 1e12,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "args": vars(args), "rollout": [], "trainer": [], "errors": []}

    def write():
        (out / "moe_rollout.json").write_text(json.dumps(report, indent=1, default=str))

    if not args.skip_trainer:          # first: a fresh memory state, before any rollout engine existed
        try:
            report["trainer"] = bench_trainer(args, device)
        except Exception as err:
            report["errors"].append({"trainer": True, "error": f"{type(err).__name__}: {err}"})
            bm.free()
        for t in report["trainer"]:
            if "error" in t:
                report["errors"].append({"trainer_replay": t["replay"], "error": t["error"]})
                print(f"FAILED trainer replay={t['replay']}: {t['error']}", flush=True)
            else:
                print(f"trainer fwd+bwd replay={'on ' if t['replay'] else 'off'} {t['tokens']} tokens: "
                      f"{t['fwd_bwd_ms']:.1f} ms, peak {t['peak_memory_GB'] or 0:.1f} GiB", flush=True)
        write()
    if not args.skip_rollout:
        for plan in [p for p in args.plans.split(",") if p]:
            try:
                res = bench_rollout(args, plan, device, bw)
                report["rollout"].append(res)
                roof = [round(s["roofline_frac"], 2) for s in res["steps"]]
                print(f"{plan:<9} B={res['batch']:<4} tok/s={res['tokens_per_s']:9.0f} "
                      f"step={res['step_ms_mean']:.2f}ms graphs={res['cuda_graphs']} experts={res['expert_paths']} "
                      f"roofline={roof} offloaded={res['reference_offloaded_GiB']:.1f}GiB", flush=True)
            except Exception as err:  # one failing plan must not lose the others
                report["errors"].append({"plan": plan, "error": f"{type(err).__name__}: {err}"})
                print(f"FAILED {plan}: {type(err).__name__}: {err}", flush=True)
                bm.free()
            write()
    bf16 = next((x for x in report["rollout"] if x["plan"] == "bf16"), None)
    report["summary"] = {x["plan"]: {"tokens_per_s": x["tokens_per_s"], "batch": x["batch"],
                                     "vs_bf16": x["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None}
                         for x in report["rollout"]}
    write()
    print(f"\n{args.model} on {report['device']}: {args.prompts}x{args.group} prompts, "
          f"{args.response_len}-token answers")
    print(f"{'plan':<10}{'batch':>7}{'tok/s':>11}{'vs bf16':>9}{'step ms':>10}{'graphs':>8}  experts")
    for x in report["rollout"]:
        ratio = report["summary"][x["plan"]]["vs_bf16"]
        print(f"{x['plan']:<10}{x['batch']:>7}{x['tokens_per_s']:>11.0f}{(ratio or 0):>9.2f}{x['step_ms_mean']:>10.2f}"
              f"{str(x['cuda_graphs']):>8}  {','.join(x['expert_paths'])}")
    for t in report["trainer"]:
        if "error" not in t:
            print(f"trainer fwd+bwd replay={'on ' if t['replay'] else 'off'} {t['tokens']} tokens: "
                  f"{t['fwd_bwd_ms']:.1f} ms ({t['tokens_per_s']:.0f} tok/s, experts {t['expert_path']})")
    for e in report["errors"]:
        print("error:", json.dumps(e))
    return report


# -- estimate: the batch each plan fits, from the shapes --

def _bytes_per_param(fmt: str) -> float:
    return {"bf16": 2.0, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}.get(fmt, 1.0)   # fp8: 1 B (+ row scales)


def estimate_batches(args, context_gib: float = 0.7) -> list[dict]:
    """Per plan: device bytes of the rollout weights (FP4 experts: kernel layout, plus the reference codes
    unless offloaded), the free memory left on a `--gpu-gib` device (minus `context_gib`, the CUDA context and
    allocator slack call 1 measured: 139.8 - 82.3 free - 56.8 bf16 weights), and the batch `_fit` would take."""
    from trace_rl.plan import PrecisionPlan

    c = _config(args)
    h, moe = c.hidden_size, len(c.moe_layers())
    expert_params = 3 * c.num_experts * c.moe_intermediate_size * h * moe
    attn = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim * h + c.num_heads * c.head_dim * h
    dense_mlp = 3 * c.intermediate_size * h * (c.num_layers - moe)
    embed = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
    p, r = args.prompt_len, args.response_len
    out = []
    for name in [x for x in args.plans.split(",") if x]:
        plan = PrecisionPlan.preset(name)
        wf = plan.rollout_weights
        kv = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
        capacity = math.ceil((p + r) / 256) * 256
        per_seq = capacity * (kv + 2 * moe * c.num_experts_per_tok) + 40 * c.vocab_size
        experts = expert_params * _bytes_per_param(wf)
        dense = (attn * c.num_layers + dense_mlp) * _bytes_per_param(wf) + embed * 2
        row = {"plan": name, "dense_GB": dense / 1e9, "experts_GB": experts / 1e9}
        for offload in (False, True):
            resident = dense + experts * (2 if wf in ("nvfp4", "mxfp4") and not offload else 1)
            free = args.gpu_gib * 2**30 - context_gib * 2**30 - resident
            fit = int((free - args.reserve_gb * 2**30) // per_seq)
            row["offloaded" if offload else "kept"] = {"free_GiB": free / 2**30,
                                                       "batch": min(fit, args.prompts * args.group)}
        out.append(row)
        print(f"estimate {name:<9} weights {dense / 1e9:.1f}+{experts / 1e9:.1f} GB, B={row['kept']['batch']} "
              f"(reference kept) B={row['offloaded']['batch']} (offloaded)", flush=True)
    return out


if __name__ == "__main__":
    main()
