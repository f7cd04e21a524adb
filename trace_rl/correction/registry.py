"""Build corrections by name, from Python or from a pipeline config.

    corrections:
      - {kind: token_tis, params: {C: 2.0}}
      - {kind: geo_reject, params: {lo: 0.999, hi: 1.001}}

Built-in kinds: token_tis, seq_tis, token_mask, seq_mask, geo_reject, k3_reject. Each kind's parameters
are validated against its documented `Params` config (unknown names are errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from trace_rl.config import TraceConfig

# Importing the modules registers the built-in kinds.
from trace_rl.correction import masks as _masks  # noqa: F401
from trace_rl.correction import rejection as _rejection  # noqa: F401
from trace_rl.correction import tis as _tis  # noqa: F401
from trace_rl.correction.base import CORRECTION_REGISTRY, Correction, Corrections


def available_corrections() -> list[str]:
    return sorted(CORRECTION_REGISTRY)


def build_correction(kind: str, **params: Any) -> Correction:
    """The correction registered as `kind`, built with `params` (validated by its `Params` config)."""
    try:
        cls = CORRECTION_REGISTRY[kind]
    except KeyError:
        raise ValueError(f"unknown correction kind {kind!r}; available: {', '.join(available_corrections())}") from None
    return cls(**params)


class CorrectionConfig(TraceConfig):
    """One correction: its registered kind and its parameters."""

    kind: str = Field(description="Registered correction kind, e.g. token_tis, seq_mask, k3_reject.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of that kind (see its Params).")

    @field_validator("kind")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in CORRECTION_REGISTRY:
            raise ValueError(f"unknown correction kind {kind!r}; available: {', '.join(available_corrections())}")
        return kind

    @field_validator("params")
    @classmethod
    def _valid_params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        kind = info.data.get("kind")
        if kind is None:  # the kind itself was invalid; that error is reported
            return params
        try:
            CORRECTION_REGISTRY[kind].Params(**params)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or kind}: "
                f"{'unknown parameter' if e['type'] == 'extra_forbidden' else e['msg']}"
                for e in err.errors()
            )
            raise ValueError(f"bad parameters for {kind}: {problems}") from None
        return params

    def build(self) -> Correction:
        return build_correction(self.kind, **self.params)


class CorrectionsConfig(TraceConfig):
    """The drift corrections of a pipeline, applied together (weights multiply, masks AND)."""

    corrections: list[CorrectionConfig] = Field(default_factory=list, description="Corrections to apply, any order.")
    max_weight: float = Field(100.0, gt=0.0, description="The combined weight is clamped to [0, max_weight].")

    def build(self) -> Corrections:
        return build_corrections(self.corrections, self.max_weight)


def build_corrections(
    configs: Sequence[CorrectionConfig | dict[str, Any] | Correction], max_weight: float = 100.0
) -> Corrections:
    """`Corrections` from configs, plain dicts ({kind, params}) or already-built corrections."""
    built = []
    for item in configs:
        if isinstance(item, Correction):
            built.append(item)
        else:
            cfg = item if isinstance(item, CorrectionConfig) else CorrectionConfig.parse(dict(item))
            built.append(cfg.build())
    return Corrections(built, max_weight)
