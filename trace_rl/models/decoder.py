"""`Decoder`: one module tree for Llama / Qwen2 / Qwen3 / Qwen3-MoE (RMSNorm, RoPE, GQA, SwiGLU, QK-norm, tied
embeddings; sparse layers are `trace_rl.models.moe.MoEBlock`s).

Module names equal transformers' (`model.layers.3.self_attn.q_proj`, `lm_head`, ...), so HF state dicts
load unchanged and `PrecisionPlan.keep_high_precision` globs read the same as in HF code.

Precision is a config rewrite over this tree:
- `apply_plan(plan)` sets each `Linear`'s formats (`plan.weight_format(name)`, ...) and the trainer mode,
  and, for aligned/guided trainers, the attention's KV fake-quantization format.
- `to_rollout()` turns every `Linear` into its packed `QuantLinear` form (the engine's copy).

Forward: `model(tokens [B, T]) -> logits [B, T, V]` (trainer: full causal attention). The engine calls
`model(tokens, positions=..., kv=..., logits_at=...)`: positions [B, T], a KV object (see
`attention.KVAttend`), and optionally the index [B] of the single position whose logits it needs.
Embeddings and norms are never quantized (an embedding lookup reads B rows, not the table).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trace_rl.models.attention import Attention, KVAttend
from trace_rl.models.config import ModelConfig
from trace_rl.models.linear import (
    Linear,
    group_input,
    joined_output,
    shared_input,
    silu_mul_linear,
    stacked_silu_mul_linear,
)
from trace_rl.models.moe import Experts, MoEBlock, Router
from trace_rl.models.norm import RMSNorm
from trace_rl.models.norm_input import norm_into_group
from trace_rl.models.rope import inverse_frequencies, rope_cos_sin
from trace_rl.op_ranges import op_range

# Rollout MLPs whose gate | up come out of one stacked GEMM (the operand cache's stack, nvfp4, large decode batches):
# SiLU x mul fused into the down projection's W4A4 input quantization (`linear.silu_mul_linear`), one launch instead
# of torch's SiLU, multiply and the quantize launch; the same bits (kernels.swiglu.EXACT_SILU). False: apart (the A/B
# switch of tests/kernels/test_silu_exact_gpu.py and tests/models/test_silu_mul_linear.py).
FUSE_ROLLOUT_SILU_QUANTIZE = True
# ... and where that gate | up comes out of the stacked operand cache's cuBLAS GEMM, its FP4 epilogue fused into the
# same quantize launch (`linear.stacked_silu_mul_linear`, kernels/epilogue_silu_quantize.py): the quantize reads the
# float32 accumulator, one launch and the bf16 gate | up buffer fewer, the same bits. False: the epilogue kernel, then
# the SiLU x mul quantize (the A/B switch of tests/engine/test_mlp_fuse_gpu.py and the `mlpfuse` GPU check).
FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE = True


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Linear(h, i, bias=bias)
        self.up_proj = Linear(h, i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)
        self.gate_up_proj: Linear | None = None   # rollout only: gate/up stacked

        self.fused = False                          # rollout on a GPU: SiLU*mul in one kernel

    def input_projections(self) -> list[Linear]:
        """The layers that read this block's input: [gate_up_proj] once stacked, else [gate_proj, up_proj]."""
        return [self.gate_up_proj] if self.gate_up_proj is not None else [self.gate_proj, self.up_proj]

    def forward(self, x: torch.Tensor | None, xq=None) -> torch.Tensor:
        """`xq`: x already quantized for `input_projections()` by the norm before (models/norm_input.py); x may
        then be None (not written: no activation hook)."""
        if self.gate_up_proj is not None:
            gate_up = self.gate_up_proj(x) if xq is None else shared_input([self.gate_up_proj], x, xq)[0]
            if FUSE_ROLLOUT_SILU_QUANTIZE:     # mxfp4 (and any stacked W4A4 gate/up): SiLU x mul into down's quantize
                y = silu_mul_linear(self.down_proj, gate_up)
                if y is not None:
                    return y
            if self.fused and gate_up.is_cuda:
                from trace_rl import kernels

                with op_range("activation"):
                    h = kernels.silu_mul(gate_up)
                return self.down_proj(h)
            gate, up = gate_up.chunk(2, dim=-1)
        else:
            parts = [self.gate_proj, self.up_proj]
            group = group_input(parts, x, xq)
            if group is None:
                gate, up = (p(x) for p in parts)
            else:
                if FUSE_ROLLOUT_SILU_QUANTIZE and FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE:
                    y = stacked_silu_mul_linear(group, parts, self.down_proj)
                    if y is not None:
                        return y
                joined = joined_output(group, parts)
                if isinstance(joined, torch.Tensor):      # gate | up in one buffer: the stacked GEMM's output
                    if FUSE_ROLLOUT_SILU_QUANTIZE:
                        y = silu_mul_linear(self.down_proj, joined)
                        if y is not None:
                            return y
                    gate, up = joined.chunk(2, dim=-1)
                else:
                    gate, up = joined
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoEBlock(config, layer_idx) if config.is_moe_layer(layer_idx) else MLP(config)

    def forward(self, x, cos, sin, kv: KVAttend | None = None, residual: torch.Tensor | None = None):
        """The residual stream is carried as (x, residual) so that each add meets its norm in one kernel:
        returns (this layer's MLP output, the stream before it); stream after = sum of the two. Same numbers
        as `h = h + attn(norm(h)); h = h + mlp(norm(h))`."""
        h, residual, xq = norm_into_group(self.input_layernorm, x, residual, self.self_attn.input_projections())
        h = self.self_attn(h, cos, sin, kv, xq=xq)
        if isinstance(self.mlp, MLP):     # its gate/up quantize their input in the norm where the backend fuses it
            h, residual, xq = norm_into_group(self.post_attention_layernorm, h, residual, self.mlp.input_projections())
            return self.mlp(h, xq=xq), residual
        h, residual = self.post_attention_layernorm.add(h, residual)      # MoE: the router reads h
        return self.mlp(h), residual


class DecoderStack(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", inverse_frequencies(config), persistent=False)
        self.plan = None
        for name, module in self.named_modules():
            if isinstance(module, (Linear, Experts)):
                module.name = name
        self.tie_weights()

    def _apply(self, fn, recurse=True):
        # RoPE frequencies stay float32 whatever dtype the weights are cast to (as in transformers).
        super()._apply(fn, recurse)
        self.inv_freq = inverse_frequencies(self.config, self.inv_freq.device)
        return self

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings and self.lm_head.quant is None:
            self.lm_head.weight = self.model.embed_tokens.weight

    def linears(self) -> dict[str, Linear]:
        return {name: m for name, m in self.named_modules() if isinstance(m, Linear)}

    def shared_input_groups(self) -> list[list[Linear]]:
        """The layers that read one input and stay apart (q/k/v, gate/up that `to_rollout` did not stack, e.g.
        nvfp4): what `models.linear.shared_input` runs together, and what the engine's operand cache stacks."""
        groups = []
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            if a.q_proj is not None:
                groups.append([a.q_proj, a.k_proj, a.v_proj])
            if isinstance(m, MLP) and m.gate_proj is not None:
                groups.append([m.gate_proj, m.up_proj])
        return groups

    def experts(self) -> list[Experts]:
        """The expert groups of the sparse layers (empty for dense models)."""
        return [m for m in self.modules() if isinstance(m, Experts)]

    # -- precision: config rewrites --
    def apply_plan(self, plan) -> Decoder:
        """Set every Linear's formats and the trainer mode from a `PrecisionPlan` (None: plain bf16)."""
        self.plan = plan
        for name, lin in self.linears().items():
            if plan is None:
                lin.set_formats("bf16", "bf16", "bf16")
            else:
                lin.set_formats(plan.weight_format(name), plan.activation_format(name), plan.trainer)
        for experts in self.experts():
            experts.set_plan(plan)
        aligned_kv = plan is not None and plan.trainer != "bf16" and plan.kv_cache != "bf16"
        for layer in self.model.layers:
            layer.self_attn.kv_fake_fmt = plan.kv_cache if aligned_kv else None
        return self

    @torch.no_grad()
    def to_rollout(self, fuse: bool = True) -> Decoder:
        """Pack every Linear's weight into its plan format (QuantLinear buffers), in place.

        `fuse`: layers that share an input (q/k/v -> `qkv_proj`, gate/up -> `gate_up_proj`) become one
        stacked Linear when their weight format quantizes rows independently (`FUSABLE_WEIGHT_FORMATS`):
        one matmul instead of three, the same numbers. A tied bf16 `lm_head` keeps reading the embedding
        table (no second copy of the vocabulary). Norms and SiLU*mul switch to their fused kernels
        (`trace_rl.kernels`; used when the tensors are on a GPU, torch otherwise)."""
        if fuse:
            self._fuse_projections()
        for lin in self.linears().values():
            lin.to_rollout()
        for experts in self.experts():
            experts.to_rollout()
        if self.config.tie_word_embeddings and self.lm_head.quant.weight_fmt == "bf16":
            self.lm_head.quant.weight = self.model.embed_tokens.weight.data
        for module in self.modules():              # fused kernels where the tensors are on a GPU
            if isinstance(module, (RMSNorm, MLP)):
                module.fused = True
        for p in self.parameters():
            p.requires_grad_(False)
        return self

    def _fuse_projections(self) -> None:
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            if not isinstance(m, MLP):
                m = None
            if a.q_proj is not None and Linear.can_fuse([a.q_proj, a.k_proj, a.v_proj]):
                prefix = a.q_proj.name.rsplit(".", 1)[0]
                a.qkv_proj = Linear.fuse([a.q_proj, a.k_proj, a.v_proj], f"{prefix}.qkv_proj")
                a.q_proj = a.k_proj = a.v_proj = None
            if m is not None and m.gate_proj is not None and Linear.can_fuse([m.gate_proj, m.up_proj]):
                prefix = m.gate_proj.name.rsplit(".", 1)[0]
                m.gate_up_proj = Linear.fuse([m.gate_proj, m.up_proj], f"{prefix}.gate_up_proj")
                m.gate_proj = m.up_proj = None

    @property
    def is_rollout(self) -> bool:
        return self.lm_head.quant is not None

    # -- forward --
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                kv: KVAttend | None = None, logits_at: torch.Tensor | None = None) -> torch.Tensor:
        b, t = tokens.shape
        if positions is None:
            positions = torch.arange(t, device=tokens.device).expand(b, t)
        with op_range("embedding"):
            x = self.model.embed_tokens(tokens)
        with op_range("rope"):
            cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, cos, sin, kv, residual)
        if logits_at is not None:                                   # [B, H]: only the positions sampled from
            rows = torch.arange(b, device=x.device)
            x, residual = x[rows, logits_at], residual[rows, logits_at]
        return self.lm_head(self.model.norm.add(x, residual)[0])

    @torch.no_grad()
    def init_random(self, std: float = 0.02, generator: torch.Generator | None = None) -> Decoder:
        """N(0, std) Linear/embedding weights, zero biases, unit norms (HF's init; for tests and benches)."""
        for module in self.modules():
            if isinstance(module, (Linear, nn.Embedding)) and module.weight is not None:
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, Router):
                module.weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, Experts):
                module.init_random(std, generator)
        return self


def build(config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
          plan=None) -> Decoder:
    """A Decoder with uninitialised weights on `device` (built on the meta device, then materialised)."""
    with torch.device("meta"):
        model = Decoder(config).to(dtype)
    model.to_empty(device=device)
    model.tie_weights()          # to_empty materialises a tied parameter once per owner: tie again
    return model.apply_plan(plan)
