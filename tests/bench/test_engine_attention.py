"""`--engine-attention` (trace_rl.bench.engine_attention): the spec's parsing and its errors, and which choices a
plan's engine can be forced to here (CPU: the torch reference only; gluon never, and says why)."""

from __future__ import annotations

import pytest
import torch

from trace_rl.bench import engine_attention as ea
from trace_rl.models import preset
from trace_rl.plan import PrecisionPlan

PLANS = ("bf16", "w4a4-kv4", "w4a4-kv4-mx")


def test_parse_default_and_per_plan_entries_in_order():
    parsed = ea.parse("w4a4-kv4=gluon,kernels,w4a4-kv4=kernels,w4a4-kv4=gluon", PLANS)
    assert parsed == ("kernels", {"w4a4-kv4": ["gluon", "kernels", "gluon"]})
    assert ea.choices_for(parsed, "w4a4-kv4") == ["gluon", "kernels"]      # a repeat runs once
    assert ea.choices_for(parsed, "bf16") == ["kernels"]
    assert ea.choices_for(ea.parse("auto", PLANS), "w4a4-kv4-mx") == ["auto"]
    assert ea.choices_for(ea.parse("", PLANS), "bf16") == ["auto"]


@pytest.mark.parametrize("spec, match", [("fast", "'fast'"), ("w4a4-kv4=", "''"), ("w4a4=gluon", "unknown plan"),
                                         ("gluon,kernels", "two default choices"), ("=gluon", "unknown plan")])
def test_parse_errors_name_the_flag(spec, match):
    with pytest.raises(ValueError, match="--engine-attention") as err:
        ea.parse(spec, PLANS)
    assert match in str(err.value)


def test_refusal_on_cpu():
    cpu, config = torch.device("cpu"), preset("qwen3-8b")
    nvfp4, bf16 = PrecisionPlan.preset("w4a4-kv4"), PrecisionPlan.preset("bf16")
    assert ea.refusal("auto", nvfp4, config, 64, "pool", cpu, torch.bfloat16) == ""
    assert ea.refusal("reference", bf16, config, 16, "contiguous", cpu, torch.float32) == ""
    assert "nvfp4 or mxfp4 KV caches only" in ea.refusal("gluon", bf16, config, 16, "contiguous", cpu, torch.bfloat16)
    assert "pages of 64" in ea.refusal("gluon", nvfp4, config, 16, "pool", cpu, torch.bfloat16)
    assert "sm_90 GPU" in ea.refusal("gluon", nvfp4, config, 64, "pool", cpu, torch.bfloat16)   # the machine
    assert "on a GPU" in ea.refusal("kernels", nvfp4, config, 64, "pool", cpu, torch.bfloat16)
    assert "contiguous layout" in ea.refusal("sdpa_cudnn", bf16, config, 16, "pool", cpu, torch.bfloat16)


def test_resolve_logs_a_refusal_and_runs_auto():
    lines = []
    cpu, config, nvfp4 = torch.device("cpu"), preset("qwen3-8b"), PrecisionPlan.preset("w4a4-kv4")
    engine_arg, fields = ea.resolve("gluon", nvfp4, config, 64, "pool", cpu, torch.bfloat16, lines.append, "x")
    assert engine_arg == "auto" and fields["attention_forced"] is None and "sm_90" in fields["attention_refused"]
    assert fields["attention_requested"] == "gluon" and "not forced" in lines[0] and "sm_90" in lines[0]
    engine_arg, fields = ea.resolve("reference", nvfp4, config, 64, "pool", cpu, torch.float32, lines.append, "x")
    assert (engine_arg, fields["attention_forced"], fields["attention_refused"]) == ("reference", "reference", None)
    assert len(lines) == 1
    assert ea.label({"plan": "w4a4-kv4", **fields}) == "w4a4-kv4/reference"
    assert ea.label({"plan": "bf16", "attention_forced": None}) == "bf16"
