"""Where a decode step goes: GPU time per op class, from `torch.profiler` over one eager step.

The step's parts run inside named ranges (`trace_rl.op_ranges.op_range`: linear, attention, norm, rope,
kv_write, prologue (fused q/k-norm + RoPE + KV write), activation, embedding, sampling, bookkeeping); every
GPU kernel is attributed to the innermost range that launched it (kernels of the activation quantization
inside a W4A4 linear count as `quantization`). The same step captured in a CUDA graph is timed as well: graph
time minus the kernels' sum is what remains of launch gaps and kernel tails inside the graph (`gaps_ms`; eager
launch overhead is not counted, the engine never runs eagerly on a GPU).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from trace_rl.op_ranges import PREFIX

CLASSES = ("linear", "quantization", "attention", "kv_write", "prologue", "norm", "rope", "activation", "embedding",
           "sampling", "bookkeeping", "other")


# Kernels launched outside torch ops (Triton's launcher) have no CPU-side op in the trace: named here.
NAMED = (("_decode_attention", "attention"), ("_merge_splits", "attention"), ("flash", "attention"),
         ("fmha", "attention"), ("cudnn", "attention"), ("_add_rms_norm", "norm"), ("_silu_mul", "activation"),
         ("_sample_kernel", "sampling"), ("_epilogue", "linear"), ("_qk_norm_rope", "prologue"),
         ("kv_write", "kv_write"), ("_kv_", "kv_write"), ("rope", "rope"),
         ("quant", "quantization"), ("gemm", "linear"), ("fp4", "linear"), ("nvjet", "linear"),
         ("sm90_xmma", "linear"), ("cutlass", "linear"))


def _range_of(evt) -> str | None:
    while evt is not None:
        if evt.name.startswith(PREFIX):
            return evt.name[len(PREFIX):]
        evt = evt.cpu_parent
    return None


def _named(name: str, following: str) -> str:
    low = name.lower()
    if "_quantize_rows" in low:        # one kernel quantizes both: before a GEMM it is the activations
        return "quantization" if any(k in following.lower() for k in ("gemm", "fp4", "linear")) else "kv_write"
    return next((cls for key, cls in NAMED if key in low), "other")


def _annotation_of(k, annotations) -> str | None:
    """The innermost GPU-side op range (`gpu_user_annotation` event "op:<class>") whose span holds kernel `k`."""
    best = None
    for a in annotations:
        if a.time_range.start <= k.time_range.start and k.time_range.end <= a.time_range.end:
            if best is None or a.time_range.end - a.time_range.start < best.time_range.end - best.time_range.start:
                best = a
    return best.name[len(PREFIX):] if best is not None else None


def kernel_rows(prof) -> list[tuple[str, str, float]]:
    """(kernel name, op class, ms) of every GPU kernel of a finished profiler, in launch order: attributed to the
    op range that launched it (through its CPU op, or, for kernels no CPU op of the trace launched, such as
    Triton's, the GPU-side span of the range), or by its name. The ranges' own GPU-side spans (torch >= 2.x
    records a `record_function` as a CUDA-device "gpu_user_annotation" event named like the range) are not
    kernels: counting them (H200, 2026-12-02) doubled the kernel sum and filed every range under "other"."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    cpu_by_id = {e.id: e for e in events if e.device_type == DeviceType.CPU}
    gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    annotations = [e for e in gpu if e.name.startswith(PREFIX)]
    kernels = sorted((e for e in gpu if not e.name.startswith(PREFIX)), key=lambda e: e.time_range.start)
    rows = []
    for i, k in enumerate(kernels):
        label = _range_of(cpu_by_id.get(getattr(k, "linked_correlation_id", 0))) or _annotation_of(k, annotations)
        if label is None or (label == "linear" and "quant" in k.name.lower()):
            label = _named(k.name, kernels[i + 1].name if i + 1 < len(kernels) else "")
        rows.append((k.name, label if label in CLASSES else "other", (k.time_range.end - k.time_range.start) / 1e3))
    return rows


def classify(prof) -> tuple[dict[str, float], dict[str, float], int]:
    """(ms per class, ms per kernel name, kernel count) of a finished profiler (`kernel_rows`)."""
    per_class, per_kernel = defaultdict(float), defaultdict(float)
    rows = kernel_rows(prof)
    for name, cls, ms in rows:
        per_class[cls] += ms
        per_kernel[name[:80]] += ms
    return dict(per_class), dict(per_kernel), len(rows)


def layer_kernels(rows: list[tuple[str, str, float]], layer: int = 1) -> list[tuple[str, str, float]]:
    """The kernels of decoder layer `layer` (from its input norm to the next layer's): a layer launches two
    residual-add RMSNorm kernels, the input and the post-attention norm. [] when the trace has fewer layers."""
    norms = [i for i, (name, _, _) in enumerate(rows) if "_add_rms_norm" in name]
    if len(norms) < 2 * layer + 3:
        return []
    return rows[norms[2 * layer]:norms[2 * layer + 2]]


def profile_step(engine, batch: int, length: int, iters: int, sampling=(1.0, 0, 1.0)) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from trace_rl.bench.decode_grid import prime_decode, time_step

    graph_ms = time_step(engine, batch, length, iters, sampling=sampling)
    path = engine.attention_path(batch, length)
    span = engine.attention_span(path, length)                 # as decode_step passes it
    prime_decode(engine, batch, length)
    engine._step(batch, path, sampling, span)                  # eager warm-up: compiles, handles
    prime_decode(engine, batch, length)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine._step(batch, path, sampling, span)
        torch.cuda.synchronize()
    per_class, per_kernel, count = classify(prof)
    total = sum(per_class.values())
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]
    layer = layer_kernels(kernel_rows(prof))
    layer_cls = defaultdict(float)
    for _, cls, ms in layer:
        layer_cls[cls] += ms
    return {"batch": batch, "L": length, "attention_path": path, "graph_step_ms": graph_ms,
            "kernel_sum_ms": total, "gaps_ms": graph_ms - total, "kernels": count,
            "classes_ms": {c: round(per_class.get(c, 0.0), 4) for c in CLASSES},
            "top_kernels_ms": [(n, round(ms, 4)) for n, ms in top],
            # one decoder layer (the second) as launched: what each layer costs, kernel by kernel
            "layer_kernels": [(n[:70], c, round(ms, 4)) for n, c, ms in layer],
            "layer_classes_ms": {c: round(ms, 4) for c, ms in layer_cls.items()}}


def run_profiles(args, name: str, device, log) -> list[dict]:
    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.engine.native import NativeEngine
    from trace_rl.plan import PrecisionPlan

    out = []
    if device.type != "cuda":
        log("profile: needs a CUDA device (skipped)")
        return out
    lengths = [int(x) for x in args.profile_lens.split(",") if x]
    for plan_name in filter(None, args.profile_plans.split(",")):
        engine = model = None
        try:
            free()
            plan = PrecisionPlan.preset(plan_name)
            model = build_rollout_model(name, plan, device, torch.bfloat16, args.seed, args.layers)
            layout = "contiguous" if plan.kv_cache == "bf16" else "pool"
            engine = NativeEngine(model, plan, max_batch=args.profile_batch, max_seq_len=max(lengths) + 1,
                                  device=device, graph_buckets=[args.profile_batch], kv_layout=layout)
            from trace_rl.bench import measure as bm

            bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
            for length in lengths:
                res = {"model": name, "plan": plan_name, "layout": layout,
                       **profile_step(engine, args.profile_batch, length, args.iters)}
                out.append(res)
                cls = " ".join(f"{c}={ms:.2f}" for c, ms in res["classes_ms"].items() if ms)
                log(f"profile {plan_name} B={args.profile_batch} L={length}: graph {res['graph_step_ms']:.2f} ms, "
                    f"kernels {res['kernel_sum_ms']:.2f} ms ({res['kernels']}), gaps {res['gaps_ms']:.2f} | {cls}")
        except Exception as err:
            out.append({"model": name, "plan": plan_name, "error": f"{type(err).__name__}: {err}"})
            log(f"profile {plan_name} FAILED: {type(err).__name__}: {err}")
        finally:
            free(engine, model)
    return out
