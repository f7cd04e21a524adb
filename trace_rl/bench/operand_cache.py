"""`--operand-cache`: which fixed-workload runs are repeated with the engine's persistent operand cache.

Spec: comma-separated entries, each `PLAN` (every attention choice of the plan runs once more with the cache) or
`PLAN=CHOICE` (only that `--engine-attention` choice). `--plans bf16,w4a4-kv4 --engine-attention w4a4-kv4=gluon
--operand-cache w4a4-kv4` measures bf16, then w4a4-kv4 on Gluon without and with the cache, in one run. The cache
(`engine/operand_cache.py`) is allocated before the batch is fitted to free memory, so the row's B is what fits beside
it; each row records `operand_cache`, `operand_cache_GB` and `batch`. Only FP4-weight plans take it (an error naming
the flag otherwise).
"""

from __future__ import annotations

FLAG = "--operand-cache"


def parse(spec: str, plans: tuple[str, ...], choices_of=None) -> dict[str, list[str] | None]:
    """{plan: the attention choices that also run with the cache, None for all}; ValueError naming the flag.
    `choices_of(plan)`: the plan's --engine-attention choices; a `PLAN=CHOICE` naming another would add no row."""
    from trace_rl.plan import PrecisionPlan, format_family

    out: dict[str, list[str] | None] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        plan, sep, choice = entry.partition("=")
        if plan not in plans:
            raise ValueError(f"{FLAG}: plan {plan!r} (in {entry!r}) is not one of the fixed workload's --plans "
                             f"({', '.join(plans)})")
        try:
            weights = PrecisionPlan.preset(plan).rollout_weights
        except (KeyError, ValueError) as err:
            raise ValueError(f"{FLAG}: {plan!r}: {err}") from None
        if format_family(weights) != "fp4":
            raise ValueError(f"{FLAG}: plan {plan!r} has {weights!r} weights; the operand cache holds the bf16 "
                             f"operand of FP4 weights (name an nvfp4/mxfp4 plan, e.g. w4a4-kv4)")
        if sep and choices_of is not None and choice not in choices_of(plan):
            raise ValueError(f"{FLAG}: {entry!r}: {plan} runs with attention {', '.join(choices_of(plan))} "
                             f"(--engine-attention), so {choice!r} would add no row; name one of those")
        if not sep:
            out[plan] = None
        elif out.get(plan, []) is not None:
            out.setdefault(plan, []).append(choice)
    return out


def runs_for(parsed: dict[str, list[str] | None], plan: str, choice: str) -> list[bool]:
    """The operand-cache settings the fixed workload runs `plan` with `choice` at: [False] or [False, True]."""
    if plan not in parsed:
        return [False]
    choices = parsed[plan]
    return [False, True] if choices is None or choice in choices else [False]
