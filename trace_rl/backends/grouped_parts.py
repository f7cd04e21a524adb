"""Stacked parts of a `GroupedQuantLinear` (`parts=2`: an MoE layer's gate | up in one grouped GEMM), each part
quantized as its own Linear would be.

Row-local formats (scales within a row: mxfp4, fp8 per row; and bf16) need nothing: quantizing the parts apart is
quantizing them together. nvfp4 has one global scale per tensor: each part keeps its own, stored per row
(`stack_parts`: global [N, 1], row r holding its part's global), which the format's dequantization, the Hopper
layout's per-row factor (`kernels.hopper_fp4`, `kernels.fp4_relayout` GLOBAL_PER_ROW) and the grouped kernel's
epilogue take as they are. Formats whose scales span rows (fp8 per tensor or per 2-D block) cannot keep the parts'
own quantization in one tensor and are refused.
"""

from __future__ import annotations

import torch

from trace_rl.formats import QTensor, get_format

ROW_LOCAL_FORMATS = ("fp8_e4m3:row", "fp8_e5m2:row", "mxfp4")   # scales within a row: stacking rows changes nothing
PART_SCALED_FORMATS = ("nvfp4",)    # a per-tensor global scale: stacked parts keep theirs, stored per row


def check_parts(weight_fmt: str, out_features: int, parts: int) -> int:
    """`parts` row blocks of equal size, each quantized as its own Linear: any count for the row-local formats
    (quantizing the blocks apart is quantizing them together), nvfp4 through per-row global scales."""
    if parts < 1 or out_features % parts:
        raise ValueError(f"GroupedQuantLinear: parts={parts} must be >= 1 and divide the {out_features} output rows")
    if parts > 1 and weight_fmt != "bf16":
        name = get_format(weight_fmt).name
        if name not in ROW_LOCAL_FORMATS + PART_SCALED_FORMATS:
            raise ValueError(f"GroupedQuantLinear: {name} scales span rows, so {parts} stacked parts cannot keep "
                             f"their own quantization; formats that can: "
                             f"{', '.join(ROW_LOCAL_FORMATS + PART_SCALED_FORMATS)} (else build one per part)")
    return parts


def stack_parts(qs: list[QTensor]) -> QTensor:
    """nvfp4 QTensors [N_p, K] (one per part, each with its own global scale) -> one [sum N_p, K] whose global
    scale is per row ([N, 1]: row r carries its part's global), so codes, scales and every row's dequantization
    are the parts' own, bit for bit (the Hopper layout's row factor is per row: `kernels.hopper_fp4`)."""
    first = qs[0]
    glob = torch.cat([q.global_scale.float().reshape(1).expand(q.shape[0]) for q in qs]).view(-1, 1)
    return QTensor(torch.cat([q.codes for q in qs]), torch.cat([q.scales for q in qs]), glob,
                   (sum(q.shape[0] for q in qs), first.shape[1]), first.dtype, first.format)
