"""Qwen3-MoE's sparse block: a softmax router (`mlp.gate`) and E SwiGLU experts (`mlp.experts`).

Semantics are transformers' `Qwen3MoeSparseMoeBlock`: router logits x W_g^T in the activations' dtype,
softmax in float32, the top `num_experts_per_tok` experts, their probabilities renormalised to sum to 1
when `norm_topk_prob`, cast back to the activations' dtype; output = sum over the chosen experts of
weight x down(silu(gate(x)) * up(x)).

- **Router**: not a `Linear`, so no precision plan reaches it — it stays in the model's dtype in every
  stage and plan (enforced by construction; `keep_high_precision` need not name it).
- **Experts**: trainer weights as transformers 5 holds them (`gate_up_proj [E, 2I, H]`, gate rows first;
  `down_proj [E, H, I]`). The plan sees each expert under its checkpoint name
  (`model.layers.3.mlp.experts.17.down_proj`), so globs name experts like other modules; all experts of
  one layer share the format of each projection (they run as one grouped GEMM; a glob that splits them
  is an error). Expert e is quantized as its own Linear would be (own scales, own nvfp4 global scale).
  Rollout stage: `GroupedQuantLinear`s. Gate and up are stacked into one (`gate_up`, `parts=2`) when they
  share formats and the weight format is row-local (bf16, fp8 per row, mxfp4) or nvfp4, whose halves keep their
  own per-tensor global scales as per-row factors (bit for bit the unstacked pair): the tokens are quantized
  once (W4A4), one grouped GEMM launch covers gate and up, and SiLU x up is fused into the down projection's
  activation quantize launch. Otherwise (other formats, or gate and up in different formats) `gate`, `up`;
  FP4 experts run the grouped FP4 kernel on CUDA (`experts.fp4_grouped`: one launch per projection, no host
  sync, so the decode step is CUDA-graph capturable), FP8 experts `torch._scaled_grouped_mm` on sm_90
  (`experts.fp8_grouped`, likewise capturable), CPU emulation and the rest the per-expert loop.
  `derive_kernel_layouts(offload_reference=True)` moves FP4 experts' reference codes to host memory once the
  kernel layout exists (rollout capacity; `GroupedQuantLinear.offload_reference`).
- **Dispatch**: `trace_rl.models.grouped` (sort by expert, static shapes, no host sync) and the grouped
  matmuls of `trace_rl.backends.grouped_linear`.
- **Routing hooks** (`MoEBlock`): `routing_hook(block, ids [B, T, k])` is called with the experts each
  token used (the rollout records them: `trace_rl.engine.routing`); `replay = (ids [B, T, k], valid
  [B, T])` makes the trainer use the rollout's experts where `valid` (its own router probabilities
  gathered at those experts and renormalised as above, so the router still gets gradients); with
  `track_routing`, the block keeps its own top-k in `own_ids` (routing drift metrics); with
  `collect_router_logits`, its logits in `router_logits` (the auxiliary load-balancing loss).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn.functional as F
from torch import nn

from trace_rl.backends import straight_through
from trace_rl.backends.grouped_linear import GroupedQuantLinear, grouped_mm
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import get_format
from trace_rl.models.config import ModelConfig
from trace_rl.models.grouped import gather_rows, permute, unpermute
from trace_rl.op_ranges import op_range

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# gate/up stacked into one GroupedQuantLinear: the row-local formats (as models.linear.FUSABLE_WEIGHT_FORMATS) and
# nvfp4, whose two halves keep their own per-tensor global scales (GroupedQuantLinear parts=2, per-row globals)
STACKABLE = ("bf16", "fp8_e4m3:row", "fp8_e5m2:row", "mxfp4", "nvfp4")


class Router(nn.Module):
    """`mlp.gate`: logits = x W^T (W [E, H]) in x's dtype. High precision in every plan (not a Linear)."""

    def __init__(self, hidden_size: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class Experts(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.hidden, self.intermediate = e, h, i
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        self.name = ""                                   # "model.layers.3.mlp.experts", set by the Decoder
        self.formats = {p: ("bf16", "bf16") for p in PROJECTIONS}   # (weight, activation) per projection
        self.trainer_mode = "bf16"
        self.align: int | None = None    # group rows padded to a multiple (None: 8 where torch._grouped_mm
                                         # runs on CUDA, as torchtitan pads for it; else 1)
        self.rollout: nn.ModuleDict | None = None        # rollout stage: "gate_up" or "gate"/"up", "down"

    # -- precision: config rewrites --
    def set_plan(self, plan) -> None:
        for proj in PROJECTIONS:
            names = [f"{self.name}.{e}.{proj}" for e in range(self.num_experts)]
            fmts = {(plan.weight_format(n), plan.activation_format(n)) if plan is not None else ("bf16", "bf16")
                    for n in names}
            if len(fmts) > 1:
                raise ValueError(f"{self.name}.*.{proj}: the plan gives this layer's experts different formats "
                                 f"{sorted(fmts)} (keep_high_precision {plan.keep_high_precision}); the experts "
                                 f"of a layer run as one grouped GEMM: name all of them, e.g. "
                                 f"'{self.name}.*' or '*.experts.*.{proj}'")
            if self.rollout is not None and fmts != {self.formats[proj]}:
                raise ValueError(f"{self.name}: a rollout layer's formats are fixed when it is built; build a "
                                 f"new rollout model for another plan")
            self.formats[proj] = fmts.pop()
        self.trainer_mode = "bf16" if plan is None else plan.trainer

    @property
    def is_quantized(self) -> bool:
        return any(f != ("bf16", "bf16") for f in self.formats.values())

    @torch.no_grad()
    def to_rollout(self) -> None:
        """Pack the weights into GroupedQuantLinears (gate/up stacked when they share formats and the weight
        format is STACKABLE; each half still quantized as its own Linear: `parts=2`)."""
        if self.rollout is not None:
            return
        i = self.intermediate
        gate, up = self.gate_up_proj.detach()[:, :i], self.gate_up_proj.detach()[:, i:]
        parts = {}
        if self.formats["gate_proj"] == self.formats["up_proj"] and self.formats["gate_proj"][0] in STACKABLE:
            parts["gate_up"] = GroupedQuantLinear(self.gate_up_proj.detach(), *self.formats["gate_proj"], parts=2)
        else:
            parts["gate"] = GroupedQuantLinear(gate.contiguous(), *self.formats["gate_proj"])
            parts["up"] = GroupedQuantLinear(up.contiguous(), *self.formats["up_proj"])
        parts["down"] = GroupedQuantLinear(self.down_proj.detach(), *self.formats["down_proj"])
        self.rollout = nn.ModuleDict(parts)
        self.gate_up_proj = None
        self.down_proj = None

    @torch.no_grad()
    def load_weight(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """Rollout stage: re-quantize trainer weights (transformers 5 layout) into the packed buffers."""
        r, i = self.rollout, self.intermediate
        if "gate_up" in r:
            r["gate_up"].load_weight(gate_up)
        else:
            r["gate"].load_weight(gate_up[:, :i])
            r["up"].load_weight(gate_up[:, i:])
        r["down"].load_weight(down)

    def grouped_linears(self) -> dict[str, GroupedQuantLinear]:
        return dict(self.rollout.items()) if self.rollout is not None else {}

    def capturable(self, device: torch.device, dtype: torch.dtype) -> bool:
        return all(g.capturable(device, dtype) for g in self.grouped_linears().values())

    def refresh_layouts(self) -> None:
        """Rollout stage: the packed buffers were rewritten in place (a packed weight sync): re-derive layouts."""
        for g in self.grouped_linears().values():
            g.refresh_layouts()

    def derive_kernel_layouts(self, offload_reference: bool = False) -> int:
        """Rollout stage: derive the FP4 grouped kernel's layouts now (else on the first forward); with
        `offload_reference`, move the reference codes of experts that run `fp4_grouped` to host memory.
        Returns the device bytes freed."""
        freed = 0
        for g in self.grouped_linears().values():
            g.derive_kernel_layout()
            probe = torch.empty(0, g.in_features, device=g.w_codes.device if g.weight_fmt != "bf16" else "cpu")
            if offload_reference and g.weight_fmt != "bf16" and g.path(probe) == "fp4_grouped":
                freed += g.offload_reference()
        return freed

    def _align(self, x: torch.Tensor) -> int:
        if self.align:
            return self.align
        if self.rollout is not None:
            return max(g.row_align(x) for g in self.rollout.values())
        return 8 if x.is_cuda else 1

    # -- forward --
    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], ids/weights [N, k] -> [N, H]."""
        with op_range("permute"):
            perm = permute(ids, self.num_experts, self._align(x))
        if self.rollout is not None:
            with op_range("experts"):
                ys = self._rollout_forward(x, perm)
            with op_range("unpermute"):
                return unpermute(ys, perm, weights)
        if self.trainer_mode != "bf16" and self.is_quantized:
            return unpermute(self._aligned_forward(x, perm), perm, weights)
        gate, up = grouped_mm(gather_rows(x, perm), self.gate_up_proj, perm.ends).chunk(2, dim=-1)
        return unpermute(grouped_mm(F.silu(gate) * up, self.down_proj, perm.ends), perm, weights)

    def _rollout_forward(self, x: torch.Tensor, perm) -> torch.Tensor:
        """The experts on the tokens x [N, H]. The permute's gather (and, with gate/up stacked, SiLU * up) are
        handed to the grouped linears as producers: the FP4 kernel path fuses them (W4A4 quantizes each token
        once, then gathers; SwiGLU runs inside the down projection's quantize launch), the others run them."""
        r, ends = self.rollout, perm.ends
        if "gate_up" in r:
            h = r["gate_up"](x, ends, src_rows=perm.token_of_row, src_padded=perm.padded)
            return r["down"](h, ends, silu_mul=True)
        if all(r[p].path(x) == "fp4_grouped" for p in ("gate", "up")):    # each quantizes the tokens once
            gate, up = (r[p](x, ends, src_rows=perm.token_of_row, src_padded=perm.padded) for p in ("gate", "up"))
        else:
            with op_range("permute"):
                xs = gather_rows(x, perm)
            gate, up = r["gate"](xs, ends), r["up"](xs, ends)
        with op_range("activation"):
            h = F.silu(gate) * up
        return r["down"](h, ends)

    def _aligned_forward(self, x: torch.Tensor, perm) -> torch.Tensor:
        """Trainer `aligned`/`guided`: weights per expert and activations per token fake-quantized to the
        rollout's formats (straight-through). Experts record no guidance: guided plans round them to nearest."""
        i = self.intermediate
        gate_w = _fake_quantize_experts(self.gate_up_proj[:, :i], self.formats["gate_proj"][0])
        up_w = _fake_quantize_experts(self.gate_up_proj[:, i:], self.formats["up_proj"][0])
        down_w = _fake_quantize_experts(self.down_proj, self.formats["down_proj"][0])
        xg = gather_rows(_fake_quantize_act(x, self.formats["gate_proj"][1]), perm)
        xu = gather_rows(_fake_quantize_act(x, self.formats["up_proj"][1]), perm)
        h = F.silu(grouped_mm(xg, gate_w, perm.ends)) * grouped_mm(xu, up_w, perm.ends)
        return grouped_mm(_fake_quantize_act(h, self.formats["down_proj"][1]), down_w, perm.ends)

    @torch.no_grad()
    def init_random(self, std: float, generator: torch.Generator | None) -> None:
        for p in (self.gate_up_proj, self.down_proj):
            p.normal_(0.0, std, generator=generator)

    def extra_repr(self) -> str:
        fmts = ", ".join(f"{p}={w}/{a}" for p, (w, a) in self.formats.items())
        stage = "rollout" if self.rollout is not None else f"trainer={self.trainer_mode}"
        return f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, {fmts}, {stage}"


def _fake_quantize_experts(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """Each expert's [N, K] weight quantize-dequantized on its own (its own scales), straight-through."""
    if fmt == "bf16":
        return w
    f = get_format(fmt)
    q = torch.stack([f.fake_quantize(w[e].detach()) for e in range(w.shape[0])])
    return straight_through(w, q)


def _fake_quantize_act(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x if fmt == "bf16" else backend_for_format(fmt).fake_quantize(x, fmt)


class MoEBlock(nn.Module):
    """The `mlp` of a sparse layer: `gate` (Router) and `experts`. Forward [B, T, H] -> [B, T, H]."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = Router(config.hidden_size, config.num_experts)
        self.experts = Experts(config)
        self.routing_hook = None          # rollout: hook(block, ids [B, T, k]) records the experts used
        self.replay: tuple[torch.Tensor, torch.Tensor] | None = None   # trainer: (ids [B,T,k], valid [B,T])
        self.track_routing = False        # keep own top-k in `own_ids` [B, T, k]
        self.own_ids: torch.Tensor | None = None
        self.collect_router_logits = False
        self.router_logits: torch.Tensor | None = None   # [B*T, E] when collected

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        with op_range("router"):
            logits = self.gate(flat)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            own = torch.topk(probs, self.top_k, dim=-1).indices
            ids = own
            if self.replay is not None:
                replay_ids, valid = self.replay
                if tuple(replay_ids.shape) != (b, t, self.top_k):
                    raise ValueError(f"router replay for layer {self.layer_idx}: records of shape "
                                     f"{tuple(replay_ids.shape)} for a forward of [{b}, {t}] tokens x "
                                     f"top-{self.top_k}; the records must come from the same rows, packed as "
                                     f"pack_full lays them out")
                ids = torch.where(valid.reshape(-1, 1), replay_ids.reshape(-1, self.top_k).long(), own)
            weights = probs.gather(1, ids)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            weights = weights.to(logits.dtype)
        if self.track_routing:
            self.own_ids = own.view(b, t, self.top_k)
        if self.collect_router_logits:
            self.router_logits = logits
        if self.routing_hook is not None:
            self.routing_hook(self, ids.view(b, t, self.top_k))
        return self.experts(flat, ids, weights).view(b, t, h)


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """The model's sparse blocks in layer order (empty for dense models)."""
    return [m for m in model.modules() if isinstance(m, MoEBlock)]


def expert_names(model: nn.Module, glob: str) -> list[str]:
    """Per-expert projection names (as in checkpoints) that match `glob`: what a plan glob selects."""
    out = []
    for block in moe_blocks(model):
        ex = block.experts
        out += [n for e in range(ex.num_experts) for p in PROJECTIONS
                if fnmatchcase(n := f"{ex.name}.{e}.{p}", glob)]
    return out


def load_balancing_loss(router_logits: list[torch.Tensor], num_experts: int, top_k: int,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' `load_balancing_loss_func` (Switch Transformer eqs. 4-6) over the MoE layers' router
    logits [N, E] (N = B*T tokens; `mask` [B, T] keeps real tokens): E * sum_e f_e * P_e, with f_e the
    fraction of top-k assignments and P_e the mean router probability of expert e over tokens and layers."""
    if not router_logits:
        raise ValueError("load_balancing_loss: no router logits (is this a mixture-of-experts model, and was "
                         "collect_router_logits on during the forward?)")
    dev = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=dev)
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=dev)
    rows = torch.zeros((), dtype=torch.float32, device=dev)
    weight = None if mask is None else mask.reshape(-1).to(device=dev, dtype=torch.float32)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        selected = torch.topk(probs, top_k, dim=-1).indices
        w = torch.ones(probs.shape[0], device=dev) if weight is None else weight
        counts = counts + torch.zeros_like(counts).scatter_add_(0, selected.reshape(-1), w.repeat_interleave(top_k))
        prob_sum = prob_sum + (probs * w.unsqueeze(-1)).sum(0)
        rows = rows + w.sum()
    return (counts / rows * (prob_sum / rows)).sum() * num_experts
