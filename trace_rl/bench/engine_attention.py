"""`--engine-attention`: the decode attention the fixed and realistic workloads ask of each plan's engine.

Spec: comma-separated entries, each `CHOICE` (every plan without an entry of its own) or `PLAN=CHOICE` (that plan).
A plan named several times runs once per choice, in the order given: `--plans bf16,w4a4-kv4 --engine-attention
w4a4-kv4=gluon,w4a4-kv4=kernels` measures the bf16 engine (auto) and the nvfp4 engine with each kernel, in one run.
CHOICE is one of the engine's `ATTENTION_CHOICES` ("auto": the engine's own graph-timed choice; the default).

A choice a plan's cache or this machine cannot take (gluon on a bf16/fp8 cache, off sm_90 or Triton 3.6; the Triton
kernels on a CPU; a bf16 torch path on a quantized cache or a page pool) is not forced: that engine runs on auto and
its row says so (`attention_forced: null`, `attention_refused`: why), as does the log. Not a silent fallback: the
row is never labelled with the choice it did not run. Every row also carries `attention_used`, the paths its steps
ran (`used_paths`).
"""

from __future__ import annotations

import torch

FLAG = "--engine-attention"


def parse(spec: str, plans: tuple[str, ...] | None = None) -> tuple[str, dict[str, list[str]]]:
    """(the default choice, {plan: its choices in order}); ValueError naming the flag on an unknown choice or plan."""
    from trace_rl.kv.cache import ATTENTION_CHOICES

    default, per_plan = None, {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        plan, sep, choice = entry.rpartition("=")
        if choice not in ATTENTION_CHOICES:
            raise ValueError(f"{FLAG}: {choice!r} (in {entry!r}) is not an attention choice; choose from "
                             f"{', '.join(ATTENTION_CHOICES)}, or PLAN=CHOICE")
        if not sep:
            if default not in (None, choice):
                raise ValueError(f"{FLAG}: two default choices ({default!r}, {choice!r}); name the plan of one "
                                 f"(PLAN=CHOICE) or list the plan twice to run it with each")
            default = choice
        elif plans is not None and plan not in plans:
            raise ValueError(f"{FLAG}: unknown plan {plan!r} in {entry!r}; plans: {', '.join(plans)}")
        else:
            per_plan.setdefault(plan, []).append(choice)
    return default or "auto", per_plan


def choices_for(parsed: tuple[str, dict[str, list[str]]], plan: str) -> list[str]:
    default, per_plan = parsed
    return list(dict.fromkeys(per_plan.get(plan) or [default]))


def refusal(choice: str, plan, config, block: int, layout: str, device: torch.device, dtype: torch.dtype) -> str:
    """Why an engine of `plan` (its cache: `block`-token pages, `layout`) cannot be built with attention=`choice`
    here ("" when it can): the cache's own checks (`kv.gluon`, `kv.cache.PagedKVCache._choose_paths`) beforehand."""
    from trace_rl.kv import gluon
    from trace_rl.kv.cache import CONTIGUOUS_ONLY, _kernels

    if choice in ("auto", "reference"):
        return ""
    if choice == "gluon":
        why = gluon.why_not(plan.kv_cache, block, config.head_dim, config.num_kv_heads, config.num_heads, device,
                            dtype)
        if why:
            return why
    if choice in ("kernels", "gluon"):
        if device.type != "cuda":
            return f"attention={choice!r} runs the Triton/Gluon kernels on a GPU; this engine is on {device}"
        kernels, why = _kernels()
        return "" if kernels is not None else f"attention={choice!r}: {why}"
    if f"torch.{choice}" in CONTIGUOUS_ONLY and (device.type != "cuda" or plan.kv_cache != "bf16"
                                                 or layout != "contiguous"):
        return (f"attention={choice!r} needs a bf16 KV cache in the contiguous layout on a GPU; this one is "
                f"{plan.kv_cache!r}, {layout}, on {device}")
    return ""


def resolve(choice: str, plan, config, block: int, layout: str, device, dtype, log, what: str) -> tuple[str, dict]:
    """(the `attention=` to build the engine with, the row's attention fields). A refused choice runs on auto and
    is logged with why."""
    why = refusal(choice, plan, config, block, layout, torch.device(device), dtype)
    if why:
        log(f"{what}: attention={choice!r} not forced ({why}); this engine runs on auto")
    forced = None if why or choice == "auto" else choice
    return forced or "auto", {"attention_requested": choice, "attention_forced": forced,
                              "attention_refused": why or None}


def used_paths(engine, step_paths=()) -> list[str]:
    """The decode-attention paths an engine ran: those of the timed steps (`step_paths`), those it chose per
    (batch, context) bucket, else (one candidate, never timed: a forced path) its cache's path."""
    paths = list(step_paths) + list(engine.report()["attention_chosen"].values())
    return list(dict.fromkeys(paths)) or [engine.cache.attention_path]


def label(row: dict) -> str:
    """'plan' or 'plan/choice' for a row forced to a choice (the summary's and the log's key); '+oc' for a row run
    with the operand cache (`--operand-cache`), '+oc8' with the FP8 operand cache."""
    forced = row.get("attention_forced")
    kind = "+oc8" if row.get("operand_cache_kind") == "fp8" else "+oc" if row.get("operand_cache") else ""
    return (f"{row['plan']}/{forced}" if forced else row["plan"]) + kind
