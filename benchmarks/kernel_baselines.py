"""Baselines and helpers for benchmarks/kernels.py: CUDA-graph timing, gemlite's 4-bit GEMM, BF16 grouped
GEMMs for mixture-of-experts (a per-expert cuBLAS loop captured in a graph, `torch._grouped_mm`), and
compiling our kernel variants in parallel processes before timing (Triton compiles one kernel at a time per
process; the disk cache is shared), and the run record both scripts write (environment, JSON saver, background
pytest)."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F

from trace_rl.bench.measure import graph_median_us

DEV = "cuda"


def graph_us(calls: list, reps: int = 15) -> float:
    """Median microseconds per call: all `calls` captured once in a CUDA graph, replayed `reps` times."""
    return graph_median_us(calls, reps)


def capture_graph(fn):
    """(graph, output): `fn` run once on a side stream (its compiles and allocations happen outside the capture,
    as in the engine's DecodeGraphs), then captured in a CUDA graph, not replayed. The benches' bit checks
    (w4a4_pdl, oproj_prefetch) and tests/kernels' `capture` fixture all capture through it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def interleaved_rounds(names, time_one, rounds: int, errors: list, where: str) -> dict:
    """{name: what time_one(name) returned, one per round}: `rounds` rounds over `names`, in their order in even rounds
    and reversed in odd ones (no variant always runs first, on a GPU that is cooler or less warmed up). A failing
    timing is noted in `errors` ("{where} {name} timing: ...") and loses that one point, not the others."""
    out = {n: [] for n in names}
    for r in range(rounds):
        for n in (list(names) if r % 2 == 0 else list(reversed(names))):
            try:
                out[n].append(time_one(n))
            except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the point
                errors.append(f"{where} {n} timing: {e!r}"[:400])
    return out


def round_stats(rounds: dict) -> dict:
    """A point's `us` (the mean of each name's round medians) and `rounds_us` (them), for names timed at least once."""
    return {"us": {n: round(sum(t) / len(t), 3) for n, t in rounds.items() if t},
            "rounds_us": {n: [round(u, 3) for u in t] for n, t in rounds.items() if t}}


def fp4_weights(fmt: str, N: int, K: int, n: int, device=DEV) -> list:
    """n random FP4 PackedWeights [N, K] (bf16 N(0, 0.02) from torch's global generator; on CUDA quantized by the
    kernel, elsewhere by the backend), their Hopper layouts derived now: never inside a capture."""
    from trace_rl.backends import PackedWeight, get_backend
    from trace_rl.kernels.linear import hopper_weight

    out = []
    for _ in range(n):
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * 0.02
        if w.is_cuda:
            from trace_rl.kernels import quantize

            p = PackedWeight(fmt, N, K, q=quantize(w, fmt))
        else:
            p = get_backend("fp4").prepare_weight(w, fmt)
        hopper_weight(p)
        out.append(p)
    return out


def weight_copies(nbytes: int, target: int = 200 << 20, cap: int = 64) -> int:
    """How many copies of an `nbytes` weight one timed graph cycles through: > `target` (200 MiB) in all, so that
    replays read HBM, not the 50 MB L2; at least 2, at most `cap`."""
    return max(2, min(cap, math.ceil(target / nbytes)))


def ceilings() -> dict:
    """Measured device-to-device copy (read + write) and read-only (a reduction) bandwidth, TB/s."""
    n = 1 << 30                                                  # 1 Gi floats = 4 GiB
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    copy = graph_us([lambda a=a, b=b: b.copy_(a)], reps=10)
    read = graph_us([lambda a=a: torch.amax(a)], reps=10)
    del a, b
    return {"copy_rw_TBps": 2 * 4 * n / copy / 1e6, "read_TBps": 4 * n / read / 1e6}


# -- gemlite ---------------------------------------------------------------------------------------------------

def gemlite_available() -> tuple[bool, str]:
    """gemlite is carried as source (GEMLITE_SRC or .gpu/gemlite_src), never installed or committed."""
    src = os.environ.get("GEMLITE_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                         "gemlite_src")
    if os.path.isdir(src) and src not in sys.path:
        sys.path.insert(0, src)
    try:
        import tqdm  # noqa: F401
    except ImportError:   # gemlite.helper imports tqdm for a progress bar only
        import types

        sys.modules["tqdm"] = types.SimpleNamespace(tqdm=lambda x, *a, **k: x)
    try:
        import gemlite
    except Exception as e:   # noqa: BLE001
        return False, f"gemlite not importable: {e!r}"[:200]
    cfg = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
    if "h100" not in torch.cuda.get_device_name(0).lower() and os.path.exists(cfg):
        gemlite.load_config(cfg)   # the H200 has no config of its own: H100's tuned configs, not autotune
    return True, gemlite.__version__


def gemlite_int4_linear(w: torch.Tensor, group: int = 64):
    """gemlite A16W4 (INT4, asymmetric, groups of `group` along K) of bf16 weight w [N, K]: its fastest 4-bit
    path on sm_90 (its NVFP4 path does not compile there). Returns the layer (callable on x [M, K])."""
    from gemlite.helper import A16Wn

    N, K = w.shape
    wf = w.float().reshape(N, K // group, group)
    lo, hi = wf.amin(-1, keepdim=True), wf.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = -lo / scale
    q = torch.clamp(torch.round(wf / scale + zero), 0, 15).to(torch.uint8).reshape(N, K)
    return A16Wn(device=w.device, dtype=torch.bfloat16).from_weights(
        q, scale.reshape(N, K // group).to(torch.bfloat16), zero.reshape(N, K // group).to(torch.bfloat16),
        W_nbits=4, group_size=group)


# -- BF16 grouped GEMM baselines (mixture of experts) ----------------------------------------------------------

def cublas_expert_loop(x: torch.Tensor, w: torch.Tensor, offsets: list[int], out: torch.Tensor):
    """One cuBLAS matmul per non-empty expert over its rows (offsets from the host: fixed in the graph)."""
    def run():
        for e in range(w.shape[0]):
            lo, hi = offsets[e], offsets[e + 1]
            if hi > lo:
                torch.mm(x[lo:hi], w[e].T, out=out[lo:hi])
    return run


def grouped_mm_call(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor):
    """`torch._grouped_mm(x [R, K], w_t [E, K, N], offs=cumulative row ends int32 [E])`, if this torch and GPU
    run it (returns None and the reason otherwise)."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None, "torch._grouped_mm is not in this torch"
    try:
        fn(x, w_t, offs=offs)
        torch.cuda.synchronize()
    except Exception as e:   # noqa: BLE001
        return None, f"torch._grouped_mm failed: {e!r}"[:300]
    return (lambda: fn(x, w_t, offs=offs)), ""


# -- parallel compilation -----------------------------------------------------------------------------------------

def _compile_one(job: tuple) -> str:
    kind, fmt, act, cfg = job
    try:
        from trace_rl.backends.fp4 import prepare_expert_weights
        from trace_rl.kernels import quantize
        from trace_rl.kernels.fp4_gemm import GemmConfig
        from trace_rl.kernels.linear import fp4_grouped_linear, fp4_linear

        c = GemmConfig(**dict(cfg))
        g = torch.Generator(device=DEV).manual_seed(0)
        if kind == "dense":   # same stride classes as the benchmark shapes (all multiples of 16)
            from trace_rl.backends import PackedWeight

            w = torch.randn(512, 2048, device=DEV, generator=g).to(torch.bfloat16)
            p = PackedWeight(fmt, 512, 2048, q=quantize(w, fmt))
            x = torch.randn(16, 2048, device=DEV, generator=g).to(torch.bfloat16)
            fp4_linear(x, p, act, None, config=c)
        else:
            ex = prepare_expert_weights(torch.randn(4, 512, 2048, device=DEV, generator=g), fmt)
            x = torch.randn(32, 2048, device=DEV, generator=g).to(torch.bfloat16)
            off = torch.tensor([0, 8, 16, 24, 32], device=DEV, dtype=torch.int32)
            fp4_grouped_linear(x, off, ex, act, config=c)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(jobs: list[tuple], workers: int = 12) -> list[str]:
    """Compile (kind, fmt, act, config items) variants in `workers` processes; returns the errors."""
    jobs = list(dict.fromkeys(jobs))
    if not jobs:
        return []
    ctx = __import__("multiprocessing").get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        return [e for e in pool.map(_compile_one, jobs) if e]


def linear_bf16(x, w):
    return F.linear(x, w)


def run_env(device: str, **extra) -> dict:
    """The "env" entry of a results JSON: device (then `extra`), torch and triton versions, UTC date, command."""
    import triton

    return {"device": device, **extra, "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "command": " ".join(sys.argv)}


def json_saver(res: dict, path: str):
    """A function that (re)writes `res` to `path`: called after every row, so a timeout keeps what was measured."""
    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    return save


def start_pytest(files: list[str], *extra: str) -> subprocess.Popen:
    """`pytest files` in the background (run while kernel variants compile); `finish_pytest` collects it."""
    return subprocess.Popen([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_pytest(proc: subprocess.Popen, timeout: float, keep: int = 80) -> dict:
    """Wait up to `timeout` s for `start_pytest`'s run (killed past it: "TIMEOUT"); its return code, summary line
    and last `keep` lines."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out += "\nTIMEOUT"
    tail = out.strip().splitlines()
    return {"returncode": proc.returncode, "summary": tail[-1] if tail else "", "tail": tail[-keep:]}


def sdpa_backends_us(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, time_us) -> dict:
    """BF16 decode attention baseline: `F.scaled_dot_product_attention` (GQA) timed by `time_us(fn)` under each SDPA
    backend (default, cuDNN, efficient, flash); a backend that refuses the shape is recorded ("<name>_error"), not
    fatal. Returns "<name>_us" per backend, "best" and "best_us"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {}
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION}
    for name, be in backends.items():
        def call(be=be):
            if be is None:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            res[f"{name}_us"] = time_us(call)
        except Exception as e:   # noqa: BLE001
            res[f"{name}_error"] = repr(e)[:200]
    times = {n: res[f"{n}_us"] for n in backends if f"{n}_us" in res}
    res["best"] = min(times, key=times.get)
    res["best_us"] = times[res["best"]]
    return res
