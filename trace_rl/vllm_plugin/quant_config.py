"""`TraceQuantConfig`: vLLM's QuantizationConfig for trace_rl's formats (config -> linear method per layer).

vLLM builds one per model from the HF config's `quantization_config` ({"quant_method": "trace_rl",
"plan": {...}}, see `trace_rl.vllm_plugin.quantization_config`) and asks it, for each layer, which
method computes it. Linear layers get the plan's formats, looked up by module name exactly as our
decoder does (`PrecisionPlan.weight_format(name)`); vLLM's fused layers (`qkv_proj`, `gate_up_proj`)
are looked up through their parts (`q_proj`, `k_proj`, `v_proj`), which must agree. Embeddings and the
LM head stay in the model dtype: the plugin does not quantize them.

Imports vLLM: loaded by `trace_rl.vllm_plugin.register` only.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

from trace_rl.plan import PrecisionPlan
from trace_rl.vllm_plugin import QUANT_METHOD
from trace_rl.vllm_plugin.linear_method import TraceLinearMethod


class TraceQuantConfig(QuantizationConfig):
    def __init__(self, plan: PrecisionPlan):
        super().__init__()
        self.plan = plan

    def __repr__(self) -> str:
        return f"TraceQuantConfig({self.plan.label}, keep_high_precision={list(self.plan.keep_high_precision)})"

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        # Ampere: the Triton FP4/FP8 kernels dequantize to BF16 and use BF16 tensor cores. Only CPU
        # emulation and the H200 (sm_90) have run them; older GPUs are refused by vLLM here.
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []    # the config travels in config.json / hf_overrides, never in a separate file

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TraceQuantConfig:
        if "plan" not in config:
            raise ValueError(f"quantization_config for quant_method={QUANT_METHOD!r} needs a 'plan' entry "
                             f"(build it with trace_rl.vllm_plugin.quantization_config(plan)); got keys "
                             f"{sorted(config)}")
        return cls(PrecisionPlan(**config["plan"]))

    def _formats(self, prefix: str) -> tuple[str, str]:
        """(weight format, activation format) of the layer `prefix`, through its parts when vLLM fused it."""
        parent, _, leaf = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(leaf, [leaf])
        names = [f"{parent}.{p}" if parent else p for p in parts]
        formats = {(self.plan.weight_format(n), self.plan.activation_format(n)) for n in names}
        if len(formats) != 1:
            raise ValueError(f"vLLM computes {names} as one fused layer {prefix!r}, but the plan gives them "
                             f"different formats {sorted(formats)}; make keep_high_precision treat them alike")
        return formats.pop()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, LinearBase):
            weight_fmt, act_fmt = self._formats(prefix)
            if (weight_fmt, act_fmt) == ("bf16", "bf16"):
                return UnquantizedLinearMethod()
            return TraceLinearMethod(weight_fmt, act_fmt)
        if isinstance(layer, VocabParallelEmbedding) and self.plan.weight_format(prefix) != "bf16":
            raise ValueError(f"the plan quantizes {prefix!r} ({self.plan.weight_format(prefix)}), but the vLLM "
                             f"plugin keeps embeddings and the LM head in the model dtype; keep 'lm_head' "
                             f"and 'embed_tokens' in keep_high_precision, or use the native engine")
        return None     # attention, norms, embeddings: vLLM's own (unquantized) methods
