"""`benchmarks/sass_diff.py --cases` file: every kernel the Gluon GEMM benchmark probes compile, not only the shipped
config at M = 16 (sass_cases_gemm_probes.py): gemm_bound_gluon's load-only and compute-only probes and
gemm_compute_kernels' variants (`all_cases`: full and compute-only) at token tiles 8 and 16, both formats, and
gemm_fixed_kernels' fin / PDL probes at splits 1, 2 and 6. The check that a change to device code they share
(fp4_gemm_gluon.py, fp4_gemm_gluon_ring.py) leaves what they compile to, and so what they measure, unchanged
(116 kernels: about 70 s on 2 cores)."""

import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))

import gemm_bound_gluon as gbg  # noqa: E402
import gemm_compute_kernels as gc  # noqa: E402
import gemm_fixed_kernels as gf  # noqa: E402

from trace_rl.kernels.fp4_gemm_gluon import GluonConfig  # noqa: E402


def cases():
    out = [gbg.gate_case(GluonConfig(), bm, fmt, mode) for bm in (8, 16) for fmt in ("nvfp4", "mxfp4")
           for mode in ("load_only", "compute_only")]
    out += [gc.gate_case(v, fmt, bm, mode) for v, fmt, bm, mode in gc.all_cases()]
    out += [gf.gate_case(v, fmt, bm, mode, split) for v in gf.VARIANTS if v.name in gf.FAST
            for fmt in ("nvfp4", "mxfp4") for bm in (8, 16) for mode in ("full", "compute") for split in (1, 2, 6)]
    return out
