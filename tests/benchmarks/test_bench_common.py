"""What the GEMM benches share, on CPU: kernel_baselines.interleaved_rounds / round_stats (the m64, smallm and midm
sweeps' timing rounds: the order alternates round by round, a failing timing loses only its own point, noted in
errors; the stats are the mean of the round medians; the sweeps' own bookkeeping: test_smallm_sweep.py),
gemm_compute.precompile_exit (how --precompile-only ends in gemm_ship, the m64 / midm / smallm sweeps and the W4A4
benches: the exit code, and the arguments each script's precompile gets) and kernel_baselines.fp4_weights."""

import sys

import gemm_compute
import gemm_ship
import kernel_baselines as kb
import m64_sweep
import midm_sweep
import pytest
import smallm_sweep


def test_rounds_alternate_and_keep_going_past_a_failure():
    order, errors = [], []

    def time_one(n):
        order.append(n)
        if n == "b" and len(order) > 3:
            raise RuntimeError("launch failed")
        return {"a": 1.0, "b": 2.0, "c": 3.0}[n] + len(order) / 1000

    rounds = kb.interleaved_rounds({"a": 0, "b": 0, "c": 0}, time_one, 3, errors, "nvfp4 4096x4096 M 64")
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert rounds == {"a": [1.001, 1.006, 1.007], "b": [2.002], "c": [3.003, 3.004, 3.009]}
    assert errors == ["nvfp4 4096x4096 M 64 b timing: RuntimeError('launch failed')"] * 2
    assert kb.round_stats({**rounds, "d": []}) == {
        "us": {"a": 1.005, "b": 2.002, "c": 3.005},
        "rounds_us": {"a": [1.001, 1.006, 1.007], "b": [2.002], "c": [3.003, 3.004, 3.009]}}


def test_precompile_exit(capsys):
    assert gemm_compute.precompile_exit(lambda: ([], [])) == 0
    assert "'errors': [], 'hung': []" in capsys.readouterr().out
    assert gemm_compute.precompile_exit(lambda: (["job: boom"], [])) == 1
    assert gemm_compute.precompile_exit(lambda: ([], [("wide", "nvfp4")])) == 1


@pytest.mark.parametrize("mod,argv,expect", [
    (m64_sweep, ["--precompile-timeout-s", "5"], (5.0, )),
    (midm_sweep, [], (40.0, )),
    (smallm_sweep, ["--shapes", "4096x1024"], ([(4096, 1024)], 40.0)),
    (gemm_ship, ["--shapes", "12288x4096"], (40.0, [(12288, 4096)]))])
def test_precompile_only_mains(mod, argv, expect, monkeypatch):
    seen = []
    monkeypatch.setattr(mod, "precompile", lambda *a: seen.append(a) or ([], ["hung"] if len(seen) > 1 else []))
    monkeypatch.setattr(mod, "measure", lambda args: pytest.fail("--precompile-only measured"))
    monkeypatch.setattr(sys, "argv", [mod.__name__, "--precompile-only", *argv])
    assert mod.main() == 0 and seen == [expect]
    assert mod.main() == 1


def test_fp4_weights_on_cpu():
    """kernel_baselines.fp4_weights (gemm_ship, midm_sweep, the W4A4 benches): n distinct weights, layouts derived."""
    import torch

    from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY

    torch.manual_seed(0)
    ps = kb.fp4_weights("mxfp4", 24, 64, 2, device="cpu")
    assert [(p.fmt, p.out_features, p.in_features) for p in ps] == [("mxfp4", 24, 64)] * 2
    assert all(LAYOUT_KEY in p.layout for p in ps) and not torch.equal(ps[0].q.codes, ps[1].q.codes)
