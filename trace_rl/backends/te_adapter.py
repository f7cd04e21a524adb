"""Transformer Engine adapter: the only module of trace_rl that names `transformer_engine`.

Nothing here imports TE at module import. `probe()` tries the import once (lazily, torch first: TE's
core library needs the NCCL that torch loads) and caches a `TEStatus`: whether TE runs here, why not,
its version, the GPU's compute capability and, per recipe, whether it runs here and why not. TE raises
RuntimeError or OSError (not ImportError) when its CUDA libraries are missing; those are caught and
become the status's reason.

Recipes are our own names, mapped to TE's classes by `make_recipe`:
- `delayed`  -> DelayedScaling: per-tensor scales from an amax history (stateful: the codes depend on
                earlier calls, so two modules agree only if their histories do).
- `current`  -> Float8CurrentScaling: per-tensor scales from the current tensor (activations are scaled
                per batch, not per token).
- `block`    -> Float8BlockScaling: 1x128 blocks for activations, 128x128 for weights; we switch TE's
                default power-of-two scales off so the scales are amax / 448 like formats/fp8.py's
                `fp8_e4m3:block` (the trainer's reference fake quantization). TE computes
                x * (448 / amax) where the reference computes x / (amax / 448): the codes agree
                except on rounding midpoints (1 weight code in 16.8 M on an H200, one step apart).
MXFP8 and NVFP4 recipes need Blackwell (sm_100+); they are refused up front on older GPUs.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

log = logging.getLogger("trace_rl.backends.te")

TE_RECIPES = ("delayed", "current", "block")
BLACKWELL_RECIPES = ("mxfp8", "nvfp4")
# The formats (formats/fp8.py names) each recipe quantizes weights and activations to in the forward pass.
RECIPE_FORMATS = {
    "delayed": ("fp8_e4m3:tensor", "fp8_e4m3:tensor"),
    "current": ("fp8_e4m3:tensor", "fp8_e4m3:tensor"),
    "block": ("fp8_e4m3:block128x128", "fp8_e4m3:block"),
}
FP8_MIN_CAPABILITY = (8, 9)
BLACKWELL_CAPABILITY = (10, 0)
# te.Linear's FP8 GEMM needs prod(leading dims) % 8 == 0 and last dim % 16 == 0 (assert_dim_for_fp8_exec).
TE_ROW_MULTIPLE = 8
TE_DIM_MULTIPLE = 16


class TEUnavailableError(RuntimeError):
    """Transformer Engine (or the asked-for recipe) cannot run here; the message says why."""


@dataclass(frozen=True)
class TEStatus:
    """What `probe()` found. `recipes` maps each recipe name to "" (runs here) or the reason it does not."""

    available: bool
    reason: str
    version: str | None = None
    device_capability: tuple[int, int] | None = None
    recipes: dict[str, str] = field(default_factory=dict)

    def supported_recipes(self) -> tuple[str, ...]:
        return tuple(r for r, why in self.recipes.items() if not why)

    def why_not(self, recipe: str) -> str:
        """'' if `recipe` runs here, else the reason (TE's own reason first when TE itself is missing)."""
        if recipe not in self.recipes:
            raise ValueError(f"unknown TE recipe {recipe!r}; allowed: {', '.join(TE_RECIPES + BLACKWELL_RECIPES)}")
        if not self.available:
            return self.reason
        return self.recipes[recipe]

    def as_dict(self) -> dict:
        return {"available": self.available, "reason": self.reason, "version": self.version,
                "device_capability": self.device_capability, "recipes": dict(self.recipes)}


def recipe_refusal(recipe: str, capability: tuple[int, int] | None) -> str:
    """Reasons we know without asking TE: no GPU, FP8 needs sm_89+, MXFP8/NVFP4 need Blackwell."""
    if capability is None:
        return "no CUDA GPU"
    if recipe in BLACKWELL_RECIPES and capability < BLACKWELL_CAPABILITY:
        return (f"the {recipe} recipe needs Blackwell (compute capability >= 10.0); this GPU is "
                f"sm_{capability[0]}{capability[1]}. Use 'block', 'current' or 'delayed' here")
    if capability < FP8_MIN_CAPABILITY:
        return f"FP8 GEMMs need compute capability >= 8.9; this GPU is sm_{capability[0]}{capability[1]}"
    return ""


def _import_te():
    """Import transformer_engine.pytorch (torch is already imported above, as TE needs)."""
    import transformer_engine.pytorch as te

    return te


_STATUS: TEStatus | None = None
_TE_MODULE = None


def probe(refresh: bool = False) -> TEStatus:
    """Find out (once; `refresh=True` asks again) whether TE runs here, and which recipes."""
    global _STATUS, _TE_MODULE
    if _STATUS is not None and not refresh:
        return _STATUS
    _STATUS, _TE_MODULE = _probe()
    log.info("transformer engine probe: %s", _STATUS.as_dict())
    return _STATUS


def _probe() -> tuple[TEStatus, object]:
    all_recipes = TE_RECIPES + BLACKWELL_RECIPES
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    known = {r: recipe_refusal(r, capability) for r in all_recipes}

    def missing(reason: str) -> tuple[TEStatus, None]:
        return TEStatus(False, reason, None, capability, {r: known[r] or reason for r in all_recipes}), None

    if importlib.util.find_spec("transformer_engine") is None:
        return missing("transformer_engine is not installed (pip install 'trace-rl[te]' on a CUDA machine)")
    try:
        te = _import_te()
    except (ImportError, RuntimeError, OSError) as err:  # RuntimeError/OSError: its CUDA libraries are missing
        return missing(f"transformer_engine is installed but failed to import: {type(err).__name__}: {err}")
    version = _te_version()
    if capability is None:
        return TEStatus(False, "no CUDA GPU: Transformer Engine needs one", version, None, known), te
    if capability < FP8_MIN_CAPABILITY:
        return TEStatus(False, known["current"], version, capability, known), te
    checks = {"delayed": te.is_fp8_available, "current": te.is_fp8_available,
              "block": te.is_fp8_block_scaling_available, "mxfp8": te.is_mxfp8_available,
              "nvfp4": te.is_nvfp4_available}
    recipes = {}
    for name in all_recipes:
        recipes[name] = known[name]
        if not recipes[name]:
            ok, why = checks[name](return_reason=True)
            recipes[name] = "" if ok else f"Transformer Engine says: {why}"
    return TEStatus(True, "", version, capability, recipes), te


def _te_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer_engine", "transformer-engine"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def require(recipe: str):
    """The `transformer_engine.pytorch` module, or TEUnavailableError naming why `recipe` cannot run here."""
    status = probe()
    why = status.why_not(recipe)
    if why:
        raise TEUnavailableError(f"Transformer Engine recipe {recipe!r} cannot run here: {why}")
    return _TE_MODULE


def make_recipe(name: str):
    """TE's recipe object for our recipe name (see the module docstring); checks it runs here first."""
    require(name)
    from transformer_engine.common import recipe as te_recipe

    if name == "delayed":
        return te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID)
    if name == "current":
        return te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID)
    r = te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3)
    # float32 scales (amax / 448) instead of TE's default powers of two: the formats' reference.
    r.fp8_quant_fwd_inp = te_recipe.QParams(power_2_scale=False, amax_epsilon=0.0)
    r.fp8_quant_fwd_weight = te_recipe.QParams(power_2_scale=False, amax_epsilon=0.0)
    return r


class TELinear(nn.Module):
    """`te.Linear` run under `te.autocast(enabled=True, recipe=...)`: trainer (forward and backward) or rollout.

    Rows are zero-padded to a multiple of 8 (TE's FP8 GEMM needs it; decode steps have a few rows): a
    zero row changes neither a per-tensor amax nor another row's block scales. In the rollout (no grad),
    the FP8 weight is cast once after `load_weight` and reused (TE's `is_first_microbatch` cache).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, recipe: str = "block",
                 params_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        te = require(recipe)
        n, k = weight.shape
        if n % TE_DIM_MULTIPLE or k % TE_DIM_MULTIPLE:
            raise ValueError(f"TELinear: weight shape {(n, k)} must be multiples of {TE_DIM_MULTIPLE} for "
                             f"TE's FP8 GEMM; keep this layer in another backend")
        self.recipe_name = recipe
        self.recipe = make_recipe(recipe)
        self.linear = te.Linear(k, n, bias=bias is not None, params_dtype=params_dtype, device=weight.device)
        self._te = te
        self._weight_fresh = True
        self.load_weight(weight, bias)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Copy a trainer weight into the TE parameter in place; the cached FP8 weight is re-cast next call."""
        self.linear.weight.copy_(weight)
        if bias is not None:
            self.linear.bias.copy_(bias)
        self._weight_fresh = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k).to(self.linear.weight.dtype)
        m = x2.shape[0]
        pad = -m % TE_ROW_MULTIPLE
        if pad:
            x2 = torch.cat([x2, x2.new_zeros(pad, k)])
        cache = None
        if not torch.is_grad_enabled():  # rollout: reuse the FP8 weight between weight syncs
            cache, self._weight_fresh = self._weight_fresh, False
        with self._te.autocast(enabled=True, recipe=self.recipe):
            y = self.linear(x2, is_first_microbatch=cache)
        return y[:m].reshape(*lead, y.shape[-1]).to(x.dtype)


@dataclass(frozen=True)
class TEQuantized:
    """TE's quantization of a tensor: `codes` (torch float8, x's shape) and `dequantized` (float32)."""

    codes: torch.Tensor
    dequantized: torch.Tensor


def te_quantize(x: torch.Tensor, recipe: str, role: str = "input") -> TEQuantized:
    """Quantize `x` with the quantizer te.Linear uses for `role` ('input' or 'weight') under `recipe`.

    Used to check that TE and the formats' reference agree on codes, and by the trainer's fake
    quantization when the rollout runs TE (so both sides use the same kernel). A fresh quantizer each
    call: for `delayed` that means scale 1 (no history), which is what a first call does.
    """
    require(recipe)
    from transformer_engine.pytorch.quantization import RecipeState

    slot = {"input": 0, "weight": 1}[role]
    state = RecipeState.create(make_recipe(recipe), mode="forward", num_quantizers=3, device=x.device)
    quantizer = state.make_quantizers()[slot]
    quantizer.set_usage(rowwise=True, columnwise=False)
    q = quantizer(x.contiguous())
    data = getattr(q, "_rowwise_data", None)
    if data is None:
        data = q._data
    fp8_dtype = torch.float8_e4m3fn if "E4M3" in str(q._fp8_dtype) else torch.float8_e5m2
    return TEQuantized(data.view(fp8_dtype).reshape(x.shape), q.dequantize(dtype=torch.float32))
