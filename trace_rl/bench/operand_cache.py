"""`--operand-cache`: which fixed-workload runs are repeated with the engine's persistent operand cache.

Spec: comma-separated entries, each `PLAN` (every attention choice of the plan runs once more with the bf16 cache),
`PLAN=CHOICE` (only that `--engine-attention` choice), `PLAN=KIND` or `PLAN=CHOICE:KIND` with KIND `bf16` (the
same as none) or `fp8` (the FP8 operand cache of mxfp4 W4A4 plans, kernels/operand_cache_fp8.py). `--plans
bf16,w4a4-kv4 --engine-attention w4a4-kv4=gluon --operand-cache w4a4-kv4` measures bf16, then w4a4-kv4 on Gluon
without and with the cache, in one run; `--operand-cache w4a4-kv4-mx,w4a4-kv4-mx=fp8` runs w4a4-kv4-mx without, with
the bf16 and with the FP8 cache. The cache (`engine/operand_cache.py`) is allocated before the batch is fitted to
free memory, so the row's B is what fits beside it (the FP8 cache's 1 byte per weight element, not 2); each row
records `operand_cache`, `operand_cache_kind`, `operand_cache_GB` and `batch`. Only FP4-weight plans take it (an
error naming the flag otherwise; fp8 only mxfp4 W4A4 plans).

`--realistic-operand-cache` takes the same spec for the realistic workload's plans (`--realistic-plans`;
`parse(..., flag=REALISTIC_FLAG, plans_flag=...)`): the cache is attached before that workload's page pool is sized
from free memory, so the pool is what fits beside it. `--realistic-uncached 0` drops the uncached run of each plan
(and attention choice) the spec names (`runs_for(..., uncached=False)`): one engine per plan, e.g. the 36-layer check
(benchmarks/engine_realistic36.py), whose budget has no room for both.
"""

from __future__ import annotations

FLAG = "--operand-cache"
REALISTIC_FLAG = "--realistic-operand-cache"
UNCACHED_FLAG = "--realistic-uncached"


KINDS = ("bf16", "fp8")


def parse(spec: str, plans: tuple[str, ...], choices_of=None, flag: str = FLAG,
          plans_flag: str = "the fixed workload's --plans") -> dict[str, dict[str, list[str] | None]]:
    """{plan: {kind: the attention choices that also run with that cache kind, None for all}}; ValueError naming
    `flag`. `choices_of(plan)`: the plan's --engine-attention choices; a CHOICE naming another would add no row.
    `plans_flag`: where `plans` come from (said when an entry names another plan)."""
    from trace_rl.engine.operand_cache import fp8_why_not
    from trace_rl.plan import PrecisionPlan, format_family

    out: dict[str, dict[str, list[str] | None]] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        plan, sep, rest = entry.partition("=")
        choice, _, kind = rest.partition(":")
        if not kind and choice in KINDS:
            choice, kind = "", choice
        kind = kind or "bf16"
        if plan not in plans:
            raise ValueError(f"{flag}: plan {plan!r} (in {entry!r}) is not one of {plans_flag} "
                             f"({', '.join(plans)})")
        if kind not in KINDS:
            raise ValueError(f"{flag}: {entry!r}: cache kind {kind!r}; choose one of {', '.join(KINDS)}")
        try:
            pp = PrecisionPlan.preset(plan)
        except (KeyError, ValueError) as err:
            raise ValueError(f"{flag}: {plan!r}: {err}") from None
        if format_family(pp.rollout_weights) != "fp4":
            raise ValueError(f"{flag}: plan {plan!r} has {pp.rollout_weights!r} weights; the operand cache holds the "
                             f"operand of FP4 weights (name an nvfp4/mxfp4 plan, e.g. w4a4-kv4)")
        if kind == "fp8" and fp8_why_not(pp):
            raise ValueError(f"{flag}: {entry!r}: {fp8_why_not(pp)}")
        if choice and choices_of is not None and choice not in choices_of(plan):
            raise ValueError(f"{flag}: {entry!r}: {plan} runs with attention {', '.join(choices_of(plan))} "
                             f"(--engine-attention), so {choice!r} would add no row; name one of those")
        kinds = out.setdefault(plan, {})
        if not choice:
            kinds[kind] = None
        elif kinds.get(kind, []) is not None:
            kinds.setdefault(kind, []).append(choice)
    return out


def runs_for(parsed: dict[str, dict[str, list[str] | None]], plan: str, choice: str,
             uncached: bool = True) -> list[bool | str]:
    """The operand-cache settings a workload runs `plan` with `choice` at: False, then True (the bf16 cache)
    and/or "fp8" where the spec names them (`NativeEngine(operand_cache=...)` takes each). `uncached=False`
    (`--realistic-uncached 0`): no False run where the spec names a cache for this plan and choice."""
    out: list[bool | str] = []
    for kind, choices in parsed.get(plan, {}).items():
        if choices is None or choice in choices:
            out.append(True if kind == "bf16" else kind)
    return out if out and not uncached else [False, *out]


def parse_uncached(value: int, parsed: dict) -> bool:
    """`--realistic-uncached`: 1 (default) also runs each named plan without the cache, 0 only with it; ValueError
    naming the flag for another value, or for 0 when `--realistic-operand-cache` names no plan (0 would change
    nothing: every plan would still run uncached)."""
    if value not in (0, 1):
        raise ValueError(f"{UNCACHED_FLAG} {value}: choose 1 (also run the plans {REALISTIC_FLAG} names without the "
                         f"cache) or 0 (only with it)")
    if value == 0 and not parsed:
        raise ValueError(f"{UNCACHED_FLAG} 0 drops the uncached run of the plans {REALISTIC_FLAG} names, and it names "
                         f"none; name a plan there (e.g. {REALISTIC_FLAG} w4a4-kv4) or leave {UNCACHED_FLAG} at 1")
    return bool(value)


def label(setting: bool | str) -> str:
    """The run's log suffix: '', ' operand_cache' (bf16) or ' operand_cache=fp8'."""
    return "" if not setting else " operand_cache" if setting is True else f" operand_cache={setting}"
