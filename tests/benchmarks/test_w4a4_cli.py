"""The command line benchmarks/w4a4_pdl.py, w4a4_producers.py and oproj_prefetch.py share (w4a4_producers.run_cli): each
script's flags and defaults, and --precompile-only's rows and exit code, with the measurement and the precompile
stubbed (CPU; what they run is tested in test_w4a4_pdl.py / test_w4a4_producers.py)."""

import sys

import pytest
import w4a4_pdl
import w4a4_producers

DEFAULTS = {"budget_s": 60.0, "fmts": None, "pairs": None, "precompile_only": False, "precompile_timeout_s": 40.0,
            "workers": 12}


def _run(mod, argv, monkeypatch, precompile_result=([], [])):
    """main() under argv: (exit code, the args measure got or None, the precompile call's arguments or None)."""
    seen = {}
    monkeypatch.setattr(mod, "measure", lambda args: seen.setdefault("measure", vars(args)))
    monkeypatch.setattr(mod, "precompile", lambda *a: seen.setdefault("precompile", a) and precompile_result)
    monkeypatch.setattr(sys, "argv", [mod.__name__ + ".py", *argv])
    return mod.main(), seen.get("measure"), seen.get("precompile")


@pytest.mark.parametrize("mod,out,ms", [(w4a4_pdl, "w4a4_pdl.json", "1,4,16,64"),
                                        (w4a4_producers, "w4a4_producers.json", "1,4,16,64,256,512")])
def test_defaults_and_flags(mod, out, ms, monkeypatch):
    rc, args, pre = _run(mod, [], monkeypatch)
    assert rc == 0 and pre is None and args == {**DEFAULTS, "out": out, "ms": ms}
    rc, args, _ = _run(mod, ["--out", "x.json", "--budget-s", "7", "--ms", "2", "--fmts", "mxfp4"], monkeypatch)
    assert rc == 0 and args == {**DEFAULTS, "out": "x.json", "budget_s": 7.0, "ms": "2", "fmts": "mxfp4"}


def test_precompile_only_rows(monkeypatch):
    argv = ["--precompile-only", "--pairs", "mlp_down", "--ms", "1,4", "--fmts", "mxfp4", "--precompile-timeout-s",
            "5", "--workers", "3"]
    rc, args, pre = _run(w4a4_pdl, argv, monkeypatch)
    assert rc == 0 and args is None and pre == ([("mlp_down", "mxfp4", 1), ("mlp_down", "mxfp4", 4)], 5.0, 3)
    rc, args, pre = _run(w4a4_producers, argv, monkeypatch)
    assert rc == 0 and args is None and pre == (["mlp_down"], [1, 4], ["mxfp4"], 5.0, 3)
    rc, _, pre = _run(w4a4_producers, ["--precompile-only"], monkeypatch, (["a job: failed"], []))
    assert rc == 1 and pre == (["layer_input", "mlp_down", "o_proj"], [1, 4, 16, 64, 256, 512], ["nvfp4", "mxfp4"],
                               40.0, 12)
    assert _run(w4a4_pdl, ["--precompile-only", "--ms", "16"], monkeypatch, ([], ["hung"]))[0] == 1
    with pytest.raises(SystemExit, match="not among"):
        _run(w4a4_pdl, ["--precompile-only", "--pairs", "layer_input"], monkeypatch)


def test_oproj_prefetch_cli(monkeypatch):
    """benchmarks/oproj_prefetch.py's command line: the same flags and defaults without --pairs; --precompile-only
    hands gemm_compute.precompile its compile jobs, timeout and workers (stubbed), exit 1 on an error or hung job."""
    import gemm_compute
    import oproj_prefetch

    seen = {}
    monkeypatch.setattr(oproj_prefetch, "measure", lambda args: seen.setdefault("measure", vars(args)))

    def precompile(**kw):
        seen["precompile"] = kw
        return seen.get("result", ([], []))

    monkeypatch.setattr(gemm_compute, "precompile", precompile)

    def run(argv):
        seen.clear()
        monkeypatch.setattr(sys, "argv", ["oproj_prefetch.py", *argv])
        return oproj_prefetch.main()

    assert run([]) == 0 and "precompile" not in seen
    assert seen["measure"] == {k: v for k, v in DEFAULTS.items() if k != "pairs"} | {"out": "oprojpf.json",
                                                                                      "ms": "1,4,8,16"}
    assert run(["--precompile-only", "--ms", "4,16", "--fmts", "mxfp4", "--precompile-timeout-s", "5",
                "--workers", "3"]) == 0 and "measure" not in seen
    assert seen["precompile"] == {"workers": 3, "jobs": oproj_prefetch.compile_jobs(["mxfp4"], [4, 16]),
                                  "job_fn": oproj_prefetch._compile_job, "timeout_s": 5.0}
    seen["result"] = ([], ["hung"])
    monkeypatch.setattr(sys, "argv", ["oproj_prefetch.py", "--precompile-only"])
    assert oproj_prefetch.main() == 1
    assert seen["precompile"]["jobs"] == oproj_prefetch.compile_jobs(["nvfp4", "mxfp4"], [1, 4, 8, 16])
    with pytest.raises(SystemExit):
        run(["--pairs", "o_proj"])                       # no --pairs: one fixed shape
    with pytest.raises(SystemExit, match="not among"):
        run(["--precompile-only", "--fmts", "fp8"])
