"""kernel_baselines.capture_graph on CPU, through a recording stand-in for torch.cuda (no GPU here): the calls in the
order the three copies it replaced made them (w4a4_pdl.check_bits, oproj_prefetch.graph_once, tests/kernels'
`capture` fixture), and that those callers go through it."""

from contextlib import contextmanager
from types import SimpleNamespace

import kernel_baselines as kb
import torch


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name}.wait_stream({other.name})")


class _FakeCuda:
    """Records Stream / wait_stream / stream / CUDAGraph / graph calls (a stand-in, not an emulation of CUDA)."""

    def __init__(self, log):
        self.log, self.main = log, _Stream("main", log)

    def Stream(self):   # noqa: N802 (torch.cuda's name)
        self.log.append("Stream()")
        return _Stream("side", self.log)

    def current_stream(self):
        return self.main

    @contextmanager
    def stream(self, s):
        self.log.append(f"enter stream({s.name})")
        yield
        self.log.append("exit stream")

    def CUDAGraph(self):   # noqa: N802
        self.log.append("CUDAGraph()")
        return "graph"

    @contextmanager
    def graph(self, g):
        self.log.append(f"enter graph({g})")
        yield
        self.log.append("exit graph")


def test_capture_graph_warms_on_a_side_stream_then_captures(monkeypatch):
    log = []
    monkeypatch.setattr(kb, "torch", SimpleNamespace(cuda=_FakeCuda(log)))
    n = iter(range(2))

    def fn():
        i = next(n)
        log.append(f"fn {i}")
        return i

    assert kb.capture_graph(fn) == ("graph", 1)            # the captured call's output, not the warm-up's
    assert log == ["Stream()", "side.wait_stream(main)", "enter stream(side)", "fn 0", "exit stream",
                   "main.wait_stream(side)", "CUDAGraph()", "enter graph(graph)", "fn 1", "exit graph"]


class _Graph:
    def __init__(self, log):
        self.log = log

    def replay(self):
        self.log.append("replay")


def test_bench_bit_checks_capture_through_it(monkeypatch):
    """w4a4_pdl.check_bits: one capture per QUANTIZE_PDL setting (set while capturing, restored), each replayed
    then synchronized; oproj_prefetch.graph_once: replayed, synchronized, a copy of the output."""
    import oproj_prefetch
    import w4a4_pdl

    from trace_rl.kernels import linear

    log = []

    def fake_capture(fn):
        log.append(("capture", linear.QUANTIZE_PDL))
        return _Graph(log), fn()

    monkeypatch.setattr(kb, "capture_graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    before = linear.QUANTIZE_PDL
    x = torch.arange(4.0)
    assert w4a4_pdl.check_bits(lambda: x) == {"graph_old_eq_eager": True, "graph_pdl_eq_eager": True,
                                               "finite": True}
    assert log == [("capture", False), "replay", "sync", ("capture", True), "replay", "sync"]
    assert linear.QUANTIZE_PDL == before
    log.clear()
    out = oproj_prefetch.graph_once(lambda: x)
    assert log == [("capture", before), "replay", "sync"]
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
