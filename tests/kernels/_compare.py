"""The relative error the FP4 GEMM tests measure a kernel by (one definition, so a tolerance such as `< 1e-2` means
the same in every test file)."""


def rel_err(y, ref) -> float:
    """||y - ref|| / ||ref|| (Frobenius norms), both in float64 on their own device (y and ref share one)."""
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def rel_err_dequant(y, packed, x) -> float:
    """`rel_err` against float64 x @ the packed weight's dequantized values^T (W4A16), computed on y's device."""
    return rel_err(y, x.double() @ packed.q.to(y.device).dequantize().double().T)
