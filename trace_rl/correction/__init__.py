"""Drift corrections (importance weights and masks from rollout vs trainer log-probs) and drift metrics."""

from trace_rl.correction.base import (
    CORRECTION_REGISTRY,
    Correction,
    CorrectionResult,
    Corrections,
    log_ratio,
    register_correction,
)
from trace_rl.correction.masks import SequenceMask, TokenMask
from trace_rl.correction.metrics import (
    METRIC_NAMES,
    DriftMetrics,
    DriftReport,
    PositionMismatch,
    correction_fractions,
    drift_metrics,
    mismatch_by_position,
)
from trace_rl.correction.registry import (
    CorrectionConfig,
    CorrectionsConfig,
    available_corrections,
    build_correction,
    build_corrections,
)
from trace_rl.correction.rejection import GeometricRejection, K3Rejection
from trace_rl.correction.tis import SequenceTIS, TokenTIS

__all__ = [
    "CORRECTION_REGISTRY",
    "METRIC_NAMES",
    "Correction",
    "CorrectionConfig",
    "CorrectionResult",
    "Corrections",
    "CorrectionsConfig",
    "DriftMetrics",
    "DriftReport",
    "GeometricRejection",
    "K3Rejection",
    "PositionMismatch",
    "SequenceMask",
    "SequenceTIS",
    "TokenMask",
    "TokenTIS",
    "available_corrections",
    "build_correction",
    "build_corrections",
    "correction_fractions",
    "drift_metrics",
    "log_ratio",
    "mismatch_by_position",
    "register_correction",
]
