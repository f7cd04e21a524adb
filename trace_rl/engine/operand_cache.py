"""The engine's opt-in persistent operand cache (`NativeEngine(operand_cache=True)`, `rollout.operand_cache`).

Every dense FP4 linear of the rollout model gets a bf16 copy of its operand (`kernels.operand_cache`), so decode steps
of >= `DEQUANT_CUBLAS_MIN_M` rows run cuBLAS on it (path `fp4.operand_cache_cublas`) instead of the FP4 GEMM or the
per-call dequantization. 2 bytes per weight element more; the caches are allocated when the engine is built, before
its KV cache, so anything sizing the page pool from free memory after building the model (the bench's
`workloads.fit_batch` / `kv_budget`, which call `attach_model` first) sees them. Experts (MoE grouped linears) keep
their grouped kernel: the cache is for dense linears.

**FP8** (`operand_cache="fp8"`, mxfp4 W4A4 plans only: `kernels.operand_cache_fp8`): each dense mxfp4 linear keeps
its operand as float8_e4m3fn instead (1 byte per weight element, half the bf16 cache) and those decode steps run
`torch._scaled_mm` on Hopper's FP8 tensor cores (path `fp4.operand_cache_fp8`), the activations stored as E4M3 by
their quantize launch. A weight whose operand E4M3 does not hold exactly (a row's block exponents spanning > 15
binades) keeps the bf16 cache, logged by name (`report()["operand_cache_kinds"]` counts both); one that stops
fitting at a weight sync raises. FP8 caches are never stacked (mxfp4 fuses q/k/v and gate/up into one layer).

Layers that read one input and stay apart (`Decoder.shared_input_groups`: q/k/v and gate/up of an nvfp4 model) get
one stacked cache per group when `STACK` is on (`kernels.operand_cache.attach_stacked`: the same bytes, one buffer,
so that `models.linear.shared_input` runs the group as one GEMM; `models.linear.STACK_ROLLOUT_OPERANDS` switches
the GEMM, not the layout).
"""

from __future__ import annotations

import torch

FIELD = "operand_cache"
KINDS = ("bf16", "fp8")
KEY = "operand_cache"      # kernels.operand_cache.KEY, the packed layout's entry (not imported: triton may be absent)
# Stack the caches of each shared-input group (q/k/v, gate/up) into one buffer at attach (False: one per layer).
STACK = True


def kind_of(setting) -> str:
    """The cache kind of an `operand_cache` setting: '' (False / None: off), 'bf16' (True or 'bf16'), 'fp8';
    ValueError naming the option otherwise."""
    if setting is None or setting is False:
        return ""
    if setting is True:
        return "bf16"
    if isinstance(setting, str) and setting in KINDS:
        return setting
    raise ValueError(f"{FIELD}={setting!r}: choose false, true (= 'bf16') or one of {', '.join(KINDS)}")


def fp8_why_not(plan) -> str:
    """Why `plan` cannot use the FP8 operand cache ('' when it can): mxfp4 weights and mxfp4 (W4A4) activations."""
    if plan.rollout_weights != "mxfp4" or plan.rollout_activations != "mxfp4":
        return (f"the FP8 operand cache holds mxfp4 operands exactly in E4M3 and multiplies W4A4 mxfp4 activations; "
                f"plan {plan.label!r} has {plan.rollout_weights!r} weights and {plan.rollout_activations!r} "
                f"activations (nvfp4's E4M3 scale x E2M1 code needs up to 6 significant bits, E4M3 holds 4). "
                f"Use a w4a4 mxfp4 plan "
                f"(e.g. w4a4-kv4-mx) or operand_cache 'bf16'")
    return ""


def why_not(plan, device: torch.device | str, kind: str = "bf16") -> str:
    """Why an engine of `plan` on `device` cannot use the operand cache of `kind` ('' when it can)."""
    from trace_rl.plan import format_family

    device = torch.device(device)
    if kind == "fp8" and fp8_why_not(plan):
        return fp8_why_not(plan)
    if format_family(plan.rollout_weights) != "fp4":
        return (f"the operand cache holds the bf16 operand of FP4 weights; plan {plan.label!r} has "
                f"{plan.rollout_weights!r} rollout weights (use an nvfp4/mxfp4 plan, e.g. w4a4-kv4, or turn it off)")
    if device.type != "cuda":
        return (f"the operand cache feeds the FP4 linears' cuBLAS path on a CUDA GPU; on {device.type} the fp4 "
                f"backend emulates in float32 and would never read it (turn it off)")
    from trace_rl.backends import get_backend

    avail = get_backend("fp4").available(device)
    if avail.path != "fp4.triton":
        return f"the fp4 backend runs {avail.path} here ({avail.reason}); the operand cache needs its Triton path"
    return ""


def fp4_dense(model, within: str = "") -> list:
    """The model's dense FP4 QuantLinears (`within`: only those whose Linear's name starts with it)."""
    return [lin.quant for name, lin in model.linears().items() if name.startswith(within)
            and getattr(lin, "quant", None) is not None and lin.quant.weight_fmt in ("nvfp4", "mxfp4")]


def attach_model(model, plan, device, kind="bf16") -> int:
    """Attach (idempotent) the operand cache of `kind` (`kind_of`) to every dense FP4 linear of `model`; its bytes.
    ValueError naming the option where it cannot work (`why_not`)."""
    kind = kind_of(kind) or "bf16"
    why = why_not(plan, device) if kind == "bf16" else why_not(plan, device, kind)
    if why:
        raise ValueError(f"{FIELD}: {why}")
    from trace_rl.kernels.operand_cache import attach, attach_stacked

    if kind == "fp8":
        from trace_rl.kernels.operand_cache_fp8 import attach_fp8

        for name, lin in model.linears().items():
            q = getattr(lin, "quant", None)
            if q is not None and q.weight_fmt == "mxfp4" and attach_fp8(q.packed, name) is None:
                attach(q.packed)        # does not fit E4M3 exactly (logged by attach_fp8): the bf16 cache
        return model_bytes(model)
    if STACK:
        for group in stack_groups(model):
            attach_stacked([q.packed for q in group])
    for q in fp4_dense(model):
        attach(q.packed)
    return model_bytes(model)


def stack_groups(model) -> list[list]:
    """The QuantLinears whose caches are stacked: each shared-input group of dense FP4 layers of one weight format
    and K, none with a bias (the stacked GEMM's epilogue takes one row factor vector and no bias)."""
    groups = getattr(model, "shared_input_groups", lambda: [])()
    out = []
    for group in groups:
        qs = [getattr(lin, "quant", None) for lin in group]
        if (len(qs) > 1 and all(q is not None and q.weight_fmt in ("nvfp4", "mxfp4") and q.bias is None for q in qs)
                and len({(q.weight_fmt, q.in_features) for q in qs}) == 1):
            out.append(qs)
    return out


def model_bytes(model, within: str = "") -> int:
    """Bytes of the operand caches `model` holds (0 without): the bf16 operands (a stack's counted once, through
    its parts' views) and the stacks' float32 row factors. `within`: only the Linears whose name starts with it
    (e.g. one layer's, as bench.workloads.kv_budget scales a layer-cut model)."""
    caches = [q.packed.layout[KEY] for q in fp4_dense(model, within) if KEY in q.packed.layout]
    stacks = {id(oc.stack): oc.stack for oc in caches if getattr(oc, "stack", None) is not None}
    return sum(oc.nbytes for oc in caches) + sum(st.nbytes for st in stacks.values())


def kinds(model) -> dict[str, int]:
    """How many dense FP4 linears of `model` hold each cache kind ({'bf16': n, 'fp8': m}; empty without)."""
    out: dict[str, int] = {}
    for q in fp4_dense(model):
        oc = q.packed.layout.get(KEY)
        if oc is not None:
            k = "fp8" if getattr(oc, "fp8", False) else "bf16"
            out[k] = out.get(k, 0) + 1
    return out


def check_model(model) -> None:
    """RuntimeError if a dense FP4 linear lost its operand cache (its packed weight rebuilt, e.g. by `.to()`), or a
    stacked group is no longer one stack: the layers would then run the per-call (per-part) paths without saying so,
    and the engine's memory report would be wrong."""
    missing = [q for q in fp4_dense(model) if KEY not in q.packed.layout]
    if missing:
        raise RuntimeError(f"{FIELD}: {len(missing)} dense FP4 linear(s) have no operand cache any more (their packed "
                           f"weights were rebuilt after the engine attached it, e.g. by moving the model); build the "
                           f"engine again on the model's final device")
    from trace_rl.kernels.operand_cache import stacked

    broken = [g for g in stack_groups(model) if any(getattr(q.packed.layout[KEY], "stack", None) is not None
                                                    for q in g) and stacked([q.packed for q in g]) is None]
    if broken:      # its layers would run one GEMM each, without saying so, beside a buffer no layer reads whole
        raise RuntimeError(f"{FIELD}: the stacked operand cache of {len(broken)} shared-input group(s) (e.g. "
                           f"{[q.out_features for q in broken[0]]} rows) is no longer whole (a part's cache was "
                           f"replaced after the engine stacked them); build the engine again")
