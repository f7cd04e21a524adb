"""trace_rl's numeric formats as a vLLM quantization method (`quant_method: trace_rl`).

vLLM loads this through the `vllm.general_plugins` entry point (pyproject.toml), in the main process and
in every worker process, so a `vllm.LLM` built with `quantization_config(plan)` in its `hf_overrides`
computes each Linear exactly as trace_rl's rollout does: weights quantized per output row to the plan's
format, activations per token, through trace_rl's backends (Triton kernels on GPU, the formats'
torch reference on CPU; which path ran is logged by the backend).

This module stays light: it never imports vLLM (`import trace_rl` must not). The modules that subclass
vLLM's classes (`quant_config`, `linear_method`) are imported by `register()` only.
"""

from __future__ import annotations

QUANT_METHOD = "trace_rl"


def quantization_config(plan) -> dict:
    """The `quantization_config` entry of an HF config (or of vLLM's `hf_overrides`) for a PrecisionPlan.

    Only the Linear formats travel: the KV cache is vLLM's (`kv_cache_dtype`), the trainer mode is the
    trainer's business."""
    return {"quant_method": QUANT_METHOD,
            "plan": plan.model_dump(mode="json", include={"rollout_weights", "rollout_activations",
                                                          "keep_high_precision"})}


def register() -> None:
    """The `vllm.general_plugins` entry point: registers `TraceQuantConfig` under `QUANT_METHOD`.

    vLLM may call it several times per process (its docs ask plugins to allow that); registering the same
    class again only replaces the entry."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from trace_rl.vllm_plugin.quant_config import TraceQuantConfig

    register_quantization_config(QUANT_METHOD)(TraceQuantConfig)
