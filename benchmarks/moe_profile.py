"""Where one decode step's GPU time goes (`benchmarks/moe_rollout.py --profile`): one eager decode step under
torch.profiler, each kernel put in an op class (expert GEMMs, dense GEMMs, activation quantization, attention,
router/top-k/permute/un-permute, SiLU x mul, norms, KV write, sampling, other) by the `trace_rl.op_ranges`
span it runs in, or by its name."""

from __future__ import annotations

import torch

PROFILE_CLASSES = ("experts_gemm", "dense_gemm", "act_quant", "attention", "router_permute", "activation", "norm",
                   "kv_write", "sampling", "other")
_RANGE_CLASS = {"experts": "experts_gemm", "linear": "dense_gemm", "quantization": "act_quant",
                "attention": "attention", "prologue": "attention", "rope": "attention", "router": "router_permute",
                "permute": "router_permute", "unpermute": "router_permute", "activation": "activation",
                "norm": "norm", "kv_write": "kv_write", "sampling": "sampling", "bookkeeping": "sampling"}
# kernels no CPU op of the trace launched (Triton's launcher): by name, first match
_NAME_CLASS = (("_fp4_grouped", "experts_gemm"), ("_quantize_rows", "act_quant"), ("_decode_attention", "attention"),
               ("_merge_splits", "attention"), ("flash", "attention"), ("_qk_norm_rope", "attention"),
               ("_add_rms_norm", "norm"), ("rms", "norm"), ("_silu_mul", "activation"), ("_sample", "sampling"),
               ("kv_write", "kv_write"), ("_kv_", "kv_write"), ("gemm", "dense_gemm"), ("fp4", "dense_gemm"),
               ("nvjet", "dense_gemm"), ("cutlass", "dense_gemm"), ("sm90_xmma", "dense_gemm"))


def _op_range(evt) -> str | None:
    from trace_rl.op_ranges import PREFIX

    while evt is not None:
        if evt.name.startswith(PREFIX):
            return evt.name[len(PREFIX):]
        evt = evt.cpu_parent
    return None


_GEMM_NAMES = ("gemm", "nvjet", "cutlass", "xmma", "fp4", "grouped", "matmul", "cublas")


def kernel_class(range_name: str | None, kernel: str, following: str = "") -> str:
    low = kernel.lower()
    if range_name is None and "_quantize_rows" in low:    # one kernel quantizes both: before a GEMM, activations
        return "act_quant" if any(k in following.lower() for k in ("gemm", "fp4", "grouped")) else "kv_write"
    if "quant" in low and range_name != "kv_write":       # activation quantization launched inside a linear
        return "act_quant"
    if range_name in ("linear", "experts"):               # the GEMM, or what prepares its input (FP8: torch ops)
        if any(g in low for g in _GEMM_NAMES):
            return "experts_gemm" if range_name == "experts" else "dense_gemm"
        return "other" if ("memset" in low or "fill" in low) else "act_quant"
    if range_name in _RANGE_CLASS:
        return _RANGE_CLASS[range_name]
    return next((cls for key, cls in _NAME_CLASS if key in low), "other")


def span_ranges(kernels: list, spans: list) -> list[str | None]:
    """The innermost op range whose GPU-side span (the profiler's gpu_user_annotation of a `record_function`)
    contains each kernel's start: one stream in an eager step, so the spans nest. (The CPU-side link from a
    kernel to the op that launched it came back empty on the H200 in call 2: every MoE kernel fell to 'other'.)"""
    from trace_rl.op_ranges import PREFIX

    items = sorted([(s.time_range.start, 0, -s.time_range.end, i) for i, s in enumerate(spans)] +
                   [(k.time_range.start, 1, 0, i) for i, k in enumerate(kernels)])
    out: list[str | None] = [None] * len(kernels)
    stack: list[tuple[float, str]] = []
    for start, kind, _, i in items:
        while stack and stack[-1][0] <= start:
            stack.pop()
        if kind == 0:
            stack.append((spans[i].time_range.end, spans[i].name[len(PREFIX):]))
        else:
            out[i] = stack[-1][1] if stack else None
    return out


def profile_decode(engine, batch: int, length: int, sampling=(1.0, 0, 1.0)) -> dict:
    """GPU ms per op class of one eager decode step (slots primed at context `length`), kernels by op range
    (`trace_rl.op_ranges`; MoE blocks mark router, permute, experts, activation, unpermute) or by name."""
    from collections import defaultdict

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from trace_rl.bench.decode_grid import prime_decode

    path = engine.attention_path(batch, length)
    prime_decode(engine, batch, length)
    engine._step(batch, path, sampling)                          # eager warm-up
    prime_decode(engine, batch, length)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine._step(batch, path, sampling)
        torch.cuda.synchronize()
    events = list(prof.events())
    cpu = {e.id: e for e in events if e.device_type == DeviceType.CPU}
    per_class, per_kernel = defaultdict(float), defaultdict(float)
    from trace_rl.op_ranges import PREFIX

    # GPU-side spans of the op ranges (gpu_user_annotation) are no kernels: counting them counts twice
    kernels = sorted((e for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith(PREFIX)),
                     key=lambda e: e.time_range.start)
    spans = [e for e in events if e.device_type == DeviceType.CUDA and e.name.startswith(PREFIX)]
    ranges = span_ranges(kernels, spans)
    for i, k in enumerate(kernels):
        ms = (k.time_range.end - k.time_range.start) / 1e3
        following = kernels[i + 1].name if i + 1 < len(kernels) else ""
        where = ranges[i] or _op_range(cpu.get(getattr(k, "linked_correlation_id", 0)))
        per_class[kernel_class(where, k.name, following)] += ms
        per_kernel[k.name[:80]] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]
    return {"batch": batch, "L": length, "attention_path": path, "kernels": len(kernels), "range_spans": len(spans),
            "kernels_in_a_range": sum(r is not None for r in ranges),
            "kernel_sum_ms": sum(per_class.values()),
            "classes_ms": {c: round(per_class.get(c, 0.0), 4) for c in PROFILE_CLASSES},
            "top_kernels_ms": [(n, round(ms, 4)) for n, ms in top]}
