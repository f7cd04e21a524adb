"""`PrecisionPlan`: which numeric format each stage of RL runs in (DESIGN.md, "Precision plan").

Stages: the rollout's weights, its activations (the inputs of each quantized Linear), its KV cache, and
how the trainer computes log-probs (`bf16`: plain; `aligned`: fake-quantizes the same tensors to the same
formats; `guided`: TRACE rollout-guided rounding). Modules whose names match a `keep_high_precision` glob
stay in bf16 in every stage.

Format granularity is fixed by role, not by the plan: weights are quantized per output row (blocks along
the input dim), activations per token, K and V per token and head (`formats.per_token` gives the
per-row variant: nvfp4 activations and KV use a per-row global scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from pydantic import Field, model_validator

from trace_rl.config import ConfigError, TraceConfig

WeightFormat = Literal["bf16", "fp8_e4m3:tensor", "fp8_e4m3:row", "fp8_e4m3:block", "nvfp4", "mxfp4"]
ActivationFormat = Literal["bf16", "fp8_e4m3:tensor", "fp8_e4m3:row", "fp8_e4m3:block", "nvfp4", "mxfp4"]
KVFormat = Literal["bf16", "fp8_e4m3", "nvfp4", "mxfp4"]
TrainerMode = Literal["bf16", "aligned", "guided"]


def format_family(name: str) -> str:
    """'bf16', 'fp8' or 'fp4': which backend computes with a format."""
    if name.startswith("fp8"):
        return "fp8"
    if name in ("nvfp4", "mxfp4", "nvfp4:row"):
        return "fp4"
    return "bf16"


class PrecisionPlan(TraceConfig):
    """The formats of each stage. Presets: see `PLAN_PRESETS` / `PrecisionPlan.preset(name)`."""

    rollout_weights: WeightFormat = Field("bf16", description="Format of the rollout's Linear weights.")
    rollout_activations: ActivationFormat = Field(
        "bf16", description="Format the rollout quantizes each Linear's input to (per token); bf16 = W-only.")
    kv_cache: KVFormat = Field("bf16", description="Format of the rollout's KV cache (per token and head).")
    trainer: TrainerMode = Field(
        "bf16", description="Trainer log-probs: bf16 (plain), aligned (same fake quantization as the "
                            "rollout, straight-through), guided (TRACE: reproduce the rollout's rounding).")
    keep_high_precision: tuple[str, ...] = Field(
        ("lm_head", "embed_tokens", "*norm*"),
        description="Globs over module names (e.g. 'model.layers.0.mlp.down_proj') kept in bf16 everywhere.")
    guided_layers: str = Field(
        "all", description="Guided plans: which Linear layers record rounding guidance: 'all', "
                           "'deeper_half', or a glob over module names.")

    @model_validator(mode="after")
    def _check_combination(self) -> PrecisionPlan:
        w, a = self.rollout_weights, self.rollout_activations
        fw, fa = format_family(w), format_family(a)
        if fa == "fp4" and a != w:
            raise ValueError(
                f"rollout_activations={a!r} needs rollout_weights={a!r} (W4A4 runs both operands in one FP4 "
                f"format); got rollout_weights={w!r}. Use rollout_activations='bf16' for weight-only FP4.")
        if fa == "fp8" and fw != "fp8":
            raise ValueError(
                f"rollout_activations={a!r} needs FP8 weights (W8A8); got rollout_weights={w!r}. "
                f"Use rollout_activations='bf16' for weight-only quantization.")
        if self.trainer == "guided" and fa != "fp4":
            raise ValueError(
                f"trainer='guided' reproduces the rollout's FP4 activation rounding, so rollout_activations "
                f"must be 'nvfp4' or 'mxfp4'; got {a!r}")
        if self.trainer == "aligned" and fw == "bf16" and fa == "bf16":
            raise ValueError("trainer='aligned' has nothing to align: rollout weights and activations are bf16")
        return self

    # -- queries used by models and engines --
    def keeps_high_precision(self, module_name: str) -> bool:
        return any(fnmatchcase(module_name, g) or fnmatchcase(module_name.rsplit(".", 1)[-1], g)
                   for g in self.keep_high_precision)

    def weight_format(self, module_name: str) -> str:
        return "bf16" if self.keeps_high_precision(module_name) else self.rollout_weights

    def activation_format(self, module_name: str) -> str:
        return "bf16" if self.keeps_high_precision(module_name) else self.rollout_activations

    @property
    def is_quantized(self) -> bool:
        return (self.rollout_weights, self.rollout_activations, self.kv_cache) != ("bf16", "bf16", "bf16")

    @property
    def label(self) -> str:
        """Short name, e.g. 'w4a4-kv4(nvfp4)', 'w8a8-kv8', 'w4a16', 'bf16'."""
        bits = {"bf16": "16", "fp8": "8", "fp4": "4"}
        fw, fa, fk = (format_family(f) for f in (self.rollout_weights, self.rollout_activations, self.kv_cache))
        if (fw, fa, fk) == ("bf16", "bf16", "bf16"):
            return "bf16"
        label = f"w{bits[fw]}a{bits[fa]}" + (f"-kv{bits[fk]}" if fk != "bf16" else "")
        fp4 = {f for f in (self.rollout_weights, self.rollout_activations, self.kv_cache) if format_family(f) == "fp4"}
        return label + (f"({'/'.join(sorted(fp4))})" if fp4 else "")

    @classmethod
    def preset(cls, name: str) -> PrecisionPlan:
        """The plan of a preset (`PRESETS`; the same names as `trace-rl run --preset` and `drift --plans`).
        A preset that also names corrections (e.g. 'fp4-tis') gives its plan here; the corrections apply
        where a pipeline is configured (`run --preset`)."""
        return cls(**resolve_preset(name).plan)


@dataclass(frozen=True)
class Preset:
    """One named setting: a precision plan plus the drift corrections a pipeline applies with it."""

    name: str
    plan: dict = field(default_factory=dict)
    corrections: tuple[dict, ...] = ()
    about: str = ""


_TOKEN_TIS = ({"kind": "token_tis", "params": {"C": 2.0}},)
_NVFP4 = dict(rollout_weights="nvfp4", rollout_activations="nvfp4", kv_cache="nvfp4")
_MXFP4 = dict(rollout_weights="mxfp4", rollout_activations="mxfp4", kv_cache="mxfp4")

# The one preset namespace: `trace-rl run --preset`, `trace-rl drift --plans`, `trace-rl compare --presets`,
# `PrecisionPlan.preset` and `trace_rl.pipelines.apply_preset` all read this table.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("bf16", {}, (), "no quantization (reference)"),
    Preset("fp8", dict(rollout_weights="fp8_e4m3:row", rollout_activations="fp8_e4m3:row", kv_cache="fp8_e4m3"),
           (), "W8A8, FP8 KV cache"),
    Preset("w4a16", dict(rollout_weights="nvfp4"), (), "nvfp4 weights only"),
    Preset("w4a16-mx", dict(rollout_weights="mxfp4"), (), "mxfp4 weights only"),
    Preset("fp4", dict(_NVFP4), (), "nvfp4 weights, activations and KV cache; no correction"),
    Preset("fp4-mx", dict(_MXFP4), (), "mxfp4 weights, activations and KV cache; no correction"),
    Preset("fp4-tis", dict(_NVFP4), _TOKEN_TIS, "fp4 + token TIS (C = 2)"),
    Preset("fp4-aligned", dict(_NVFP4, trainer="aligned"), (), "fp4, trainer fake-quantizes the same tensors"),
    Preset("fp4-guided", dict(_NVFP4, trainer="guided"), (), "fp4, TRACE rollout-guided trainer rounding"),
)}
# Earlier names, still accepted everywhere a preset is.
PRESET_ALIASES: dict[str, str] = {"w4a4-kv4": "fp4", "w4a4-kv4-mx": "fp4-mx"}


def preset_names(aliases: bool = False) -> list[str]:
    return [*PRESETS, *(PRESET_ALIASES if aliases else ())]


def resolve_preset(name: str) -> Preset:
    """The preset called `name` (or an alias of it); an unknown name is a ConfigError listing the names."""
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(PRESETS)} "
                          f"(aliases: {', '.join(f'{a} = {b}' for a, b in PRESET_ALIASES.items())})", ("preset",))
    return PRESETS[name]


# name -> plan fields, every preset and alias (kept for code that wants only the plans).
PLAN_PRESETS: dict[str, dict] = {n: resolve_preset(n).plan for n in preset_names(aliases=True)}
