"""The `gemm256` check's wiring on CPU (benchmarks/gemm_wide256_h200.sh): the script smokes exactly the smoke's
FAMILIES, each in its own process, and the benchmark maps every variant it times to one of them (a variant whose
family failed its smoke is never launched)."""

import os
import re

import gemm_wide256 as bench  # noqa: E402
import gemm_wide256_smoke as smoke  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_script_smokes_every_family_and_is_registered():
    script = open(os.path.join(ROOT, "benchmarks", "gemm_wide256_h200.sh")).read()
    families = re.search(r'^FAMILIES="([^"]+)"', script, re.M).group(1).split()
    assert tuple(families) == smoke.FAMILIES
    assert "gemm_wide256_smoke.py \"$f\" \"$fmt\"" in script
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "gemm256) bash benchmarks/gemm_wide256_h200.sh" in checks


def test_every_timed_variant_has_a_smoke_family():
    for name in list(bench.VARIANTS) + ["w64_2cta"]:
        assert bench.family("w256", name) in smoke.FAMILIES, name
    for name in bench.SK_VARIANTS:
        assert bench.family("sk", name) in smoke.FAMILIES, name
    assert bench.family("w256", "w256_nooverlap") == "w256no" and bench.family("sk", "sk_nooverlap") == "skno"
    assert bench.family("w256", "w256") == "w256" and bench.family("sk", "sk_2cta") == "sk2cta"
