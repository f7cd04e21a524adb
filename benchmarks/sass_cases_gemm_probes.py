"""`benchmarks/sass_diff.py --cases` file: the Gluon GEMM benchmark probes' kernels (gemm_bound_gluon.py's load-only
and compute-only, gemm_compute_kernels.py's variant and compute-only kernels) at the shipped config, M = 16, both
formats: the check that a change to their host-side launch setup (or to fp4_gemm_gluon.py's shared device code)
leaves what they compile to, and so what they measure, unchanged."""

import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))

import gemm_bound_gluon as gbg  # noqa: E402
import gemm_compute_kernels as gc  # noqa: E402

from trace_rl.kernels.fp4_gemm_gluon import GluonConfig  # noqa: E402


def cases():
    out = [gbg.gate_case(GluonConfig(), 16, fmt, mode) for fmt in ("nvfp4", "mxfp4")
           for mode in ("load_only", "compute_only")]
    imad = next(v for v in gc.VARIANTS if v.imad)
    out += [gc.gate_case(v, fmt, 16, mode) for v, fmt, mode in ((gc.SHIPPED, "nvfp4", "compute"),
                                                                (gc.SHIPPED, "mxfp4", "compute"),
                                                                (imad, "nvfp4", "full"))]
    return out
