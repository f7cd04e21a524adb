"""Tuning sweep of the decode-attention kernel's launch configuration (tokens per tile, warps, pipeline
stages, register cap, split-KV count) at the MoE (Qwen3-30B-A3B: 32 query / 4 KV heads) and dense
(Qwen3-8B: 32 / 8) shapes, for the fp8, nvfp4 and mxfp4 caches.

    python benchmarks/attention_tune.py --compile-check          # CPU: every config compiles for sm_90
    python benchmarks/attention_tune.py --out DIR [--deadline S]  # GPU: check, then time

GPU run, in three phases, all results in DIR/attention_tune.json (rewritten after every row):
1. check (parallel worker processes, `--workers`): every config of `CONFIGS` runs a ragged problem per
   (format, head class) against the torch reference (`decode_attention_reference`), once with the split
   heuristic (several splits here: the merge kernel) and once with one split; tails of 1-88 tokens, empty
   and multi-page sequences. A config that fails is recorded as wrong and never timed. The workers also
   fill Triton's on-disk cache, so the timing phase loads compiled kernels instead of compiling.
2. baselines, in the timing process: the read ceiling (a sum over 4 GiB) and SDPA over a contiguous BF16
   cache [B, Hkv, L, 128] with `enable_gqa` under each backend (the fastest is the baseline).
3. timing: per shape (priority order: the MoE rollout's B = 409 x 8k first) and format, every checked
   config at its heuristic split, then explicit split counts for the two fastest. Each timed call is first
   compared with the reference on two sequences of that shape (a wrong result is recorded, not kept).
   Times: `graph_median_us` (CUDA-graph replays, medians after warm-up); the caches are GBs, far above the
   50 MB L2, so every replay reads HBM. fraction of read bandwidth = cache bytes / ceiling / time.
`--deadline` (seconds from start) stops each phase in time and keeps what was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SMOKE = os.environ.get("ATTN_BENCH_SMOKE") == "1"     # CPU dry run (Triton's interpreter, tiny shapes)
DEV = "cpu" if SMOKE else "cuda"
HQ, D = 32, 128
CLASSES = {"moe": 4, "dense": 8}                                    # kv heads; 32 query heads each
# (class, batch, context) in the order they are measured: what the rollouts run first.
SHAPES = [("moe", 409, 8192), ("moe", 512, 8192), ("moe", 128, 8192), ("moe", 409, 4096), ("moe", 512, 4096),
          ("moe", 128, 4096), ("dense", 32, 8192), ("dense", 256, 8192), ("dense", 32, 32768),
          ("dense", 256, 32768)]
FORMATS = ("nvfp4", "mxfp4", "fp8_e4m3")
# (block_t, num_warps, num_stages, maxnreg). Compiled for sm_90 with Triton 3.6 on a CPU (--compile-check): no
# spills (no stack, no STL/LDL in the loop; 256-token tiles at 8 warps x 128 registers spill, so none here); SASS per
# K/V element nvfp4 3.22 (uncapped) .. 3.31 (168) .. 3.66 (64-token tiles, last tile first; 3.75 before) .. 4.2-4.4
# (8 warps: the softmax's cross-warp reductions double); registers 214 uncapped (2 CTAs/SM), 168 (3), 113-120 at
# 64-token tiles (4), 112-120 at 8 warps (2 CTAs of 8 warps); fp8 179-189 uncapped (2 CTAs), 165-166 capped (3).
FP4_CONFIGS = [(128, 4, 3, 168), (128, 4, 2, 168), (128, 4, 4, 168), (128, 4, 3, None), (64, 4, 3, 128),
               (64, 4, 4, 128), (128, 8, 3, 128)]
FP8_CONFIGS = [(128, 4, 1, None), (128, 4, 2, None), (128, 4, 3, None), (128, 4, 2, 168), (128, 4, 3, 168),
               (64, 4, 3, 128), (128, 8, 3, 128)]
CONFIGS = {"nvfp4": FP4_CONFIGS, "mxfp4": FP4_CONFIGS, "fp8_e4m3": FP8_CONFIGS}
CHECK_LENS = [600, 1, 130, 64, 312, 0, 1999, 88]                    # tails of 88, 1, 2, 64, 56, -, 79, 88 tokens
CHECK_PAGES = 48                                                    # table width: a multiple of 16, as when timed
if SMOKE:
    SHAPES = [("moe", 2, 256), ("dense", 2, 256)]
    FP4_CONFIGS, FP8_CONFIGS = [(128, 4, 3, 168), (64, 4, 3, 128)], [(128, 4, 2, None)]
    CONFIGS = {"nvfp4": FP4_CONFIGS, "mxfp4": FP4_CONFIGS, "fp8_e4m3": FP8_CONFIGS}
    CHECK_LENS, CHECK_PAGES = [200, 1, 130, 0, 88], 16


def bench_us(fn) -> float:
    """Median microseconds per call (`graph_median_us`: 3 calls per CUDA graph, 5 replays after 1 warm-up)."""
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    from trace_rl.bench.measure import graph_median_us

    return graph_median_us([fn] * 3, reps=5, warmup=1)


def sync() -> None:
    if not SMOKE:
        import torch

        torch.cuda.synchronize()


def cfg_kw(cfg) -> dict:
    bt, w, st, mr = cfg
    return dict(block_t=bt, num_warps=w, num_stages=st, maxnreg=mr)


def cfg_name(cfg) -> str:
    bt, w, st, mr = cfg
    return f"t{bt}w{w}s{st}r{mr or 'max'}"


# ---------------------------------------------------------------------------------------------- CPU
def compile_check() -> list[dict]:
    """Compile every (format, class, config, split mode) for sm_90 with the installed Triton; report registers,
    spills and SASS per K/V element of the main loop."""
    from trace_rl.kernels.attention_sass import attention_loop

    rows = []
    for fmt in FORMATS:
        for cls, hkv in CLASSES.items():
            for cfg in CONFIGS[fmt]:
                for split in (True, False):
                    bt, w, st, mr = cfg
                    try:
                        r = attention_loop(fmt, block_t=bt, stages=st, num_warps=w, kv_heads=hkv, group=HQ // hkv,
                                           maxnreg=mr, split=split)
                        regs = int(r.registers.split("REG:")[1].split()[0])
                        stack = int(r.registers.split("STACK:")[1].split()[0])      # spill slots
                        spills = sum(c for op, c in r.opcodes.items() if op.startswith(("STL", "LDL")))  # loop
                        row = dict(format=fmt, cls=cls, config=cfg_name(cfg), split=split, registers=regs,
                                   stack_bytes=stack, loop_spill_instructions=spills,
                                   sass_per_element=round(r.per_element, 3), hgmma_register_a=r.hgmma_register_a,
                                   ok=stack == 0 and spills == 0)
                    except Exception as e:
                        row = dict(format=fmt, cls=cls, config=cfg_name(cfg), split=split, ok=False,
                                   error=repr(e)[:300])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------- GPU
def random_cache(fmt: str, role: str, blocks: int, hkv: int, gen):
    """Valid random contents (timing on zeros can flatter a kernel): codes uniform, scales in a normal range."""
    from trace_rl.formats.paged_kv import PagedKV, default_block_size

    c = PagedKV.allocate(fmt, blocks, default_block_size(fmt), hkv, D, device=DEV, role=role)
    c.codes.random_(0, 256, generator=gen)
    if fmt == "fp8_e4m3":
        c.codes.bitwise_and_(0x77)
        c.scales.uniform_(0.001, 0.01, generator=gen)
        return c
    lo, hi = (64, 100) if fmt == "nvfp4" else (120, 130)
    c.scales.random_(lo, hi, generator=gen)
    if c.global_scale is not None:
        c.global_scale.uniform_(0.001, 0.01, generator=gen)
    return c


def ragged_problem(fmt: str, hkv: int, seed: int):
    """Sequences of CHECK_LENS tokens written through `kv_write` (the real write path) over scattered pages, stale
    garbage in the unwritten slots."""
    import torch

    from trace_rl.formats.paged_kv import PagedKV, default_block_size, slots_for
    from trace_rl.kernels import kv_write

    gen = torch.Generator().manual_seed(seed)
    page = default_block_size(fmt)
    pages = [math.ceil(n / page) for n in CHECK_LENS]
    blocks = sum(pages) + 4
    perm = torch.randperm(blocks, generator=gen)
    table = torch.zeros(len(CHECK_LENS), CHECK_PAGES, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k = PagedKV.allocate(fmt, blocks, page, hkv, D, device=DEV, role="k")
    v = PagedKV.allocate(fmt, blocks, page, hkv, D, device=DEV, role="v")
    v.codes.fill_(0x77)
    if fmt == "fp8_e4m3":
        k.scales.fill_(-1.0)                                        # NaN flags in stale slots must not leak in
        v.scales.fill_(-1.0)
    else:
        v.scales.fill_(255 if fmt == "mxfp4" else 127)              # NaN block scales
    for b, n in enumerate(CHECK_LENS):
        if n == 0:
            continue
        slots = slots_for(table[b : b + 1].long(), torch.arange(n)[None], page)[0].to(DEV)
        kv_write(k, slots, (torch.randn(n, hkv, D, generator=gen) * 2).to(torch.bfloat16).to(DEV))
        kv_write(v, slots, torch.randn(n, hkv, D, generator=gen).to(torch.bfloat16).to(DEV))
    q = torch.randn(len(CHECK_LENS), HQ, D, generator=gen).to(torch.bfloat16).to(DEV)
    return q, k, v, table.to(DEV), torch.tensor(CHECK_LENS, dtype=torch.int32).to(DEV)


def rel_errs(out, ref, lens) -> list[float]:
    return [((out[b].float() - ref[b].float()).norm() / ref[b].float().norm()).item() if int(lens[b]) else
            float(out[b].abs().max()) for b in range(out.shape[0])]


def check_worker(tasks: list, out_path: str, deadline: float) -> None:
    """Run the ragged check for (format, class, config) tasks; one JSON line per task."""

    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention

    problems = {}
    with open(out_path, "a") as f:
        for fmt, cls, cfg in tasks:
            if time.time() > deadline:
                break
            row = dict(format=fmt, cls=cls, config=cfg_name(cfg))
            t = time.time()
            try:
                if (fmt, cls) not in problems:
                    q, k, v, bt, lens = ragged_problem(fmt, CLASSES[cls], 1234)
                    ref = decode_attention_reference(q, k, v, bt, lens, D ** -0.5)
                    problems[fmt, cls] = (q, k, v, bt, lens, ref)
                q, k, v, bt, lens, ref = problems[fmt, cls]
                if SMOKE and os.environ.get("ATTN_TUNE_SMOKE_FAULT") == cfg_name(cfg):   # tests the respawn
                    raise RuntimeError("CUDA error: an illegal memory access was encountered (injected, smoke)")
                for mode, splits in (("split", None), ("one", 1)):
                    out = decode_attention(q, k, v, bt, lens, D ** -0.5, splits=splits, **cfg_kw(cfg))
                    sync()
                    errs = rel_errs(out, ref, lens)
                    row[f"errs_{mode}"] = [round(e, 5) for e in errs]
                row["ok"] = all(e < 1e-2 for m in ("split", "one") for e in row[f"errs_{m}"])
            except Exception:
                row["ok"] = False
                row["error"] = traceback.format_exc()[-800:]
            row["seconds"] = round(time.time() - t, 2)
            f.write(json.dumps(row) + "\n")
            f.flush()
            if "CUDA" in row.get("error", ""):     # a fault poisons the context: the main process respawns us
                sys.exit(3)


def sdpa_best(hkv: int, batch: int, ctx: int) -> dict:
    import torch
    from kernel_baselines import sdpa_backends_us

    q = torch.randn(batch, HQ, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, ctx, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    res = {"kv_bytes": 2 * k.numel() * 2, **sdpa_backends_us(q, k, v, bench_us)}
    return res                                        # the caller frees the tensors (empty_cache after return)


def split_candidates(programs: int, sms: int, capacity: int, block_t: int) -> list[int]:
    """Explicit split counts worth timing: 1..4 when B x Hkv programs fill the GPU (wave quantization), else the
    counts that give ~1, 2, 4 and 8 programs per SM."""
    most = max(1, capacity // (4 * block_t))
    if programs >= 2 * sms:
        cands = {1, 2, 3, 4}
    else:
        cands = {1} | {max(1, -(-k * sms // programs)) for k in (1, 2, 4, 8)}
    return sorted(c for c in cands if c <= most)


def time_shape(cls: str, batch: int, ctx: int, fmt: str, configs: list, read_bw: float, sdpa_us: float | None,
               deadline: float, log) -> dict:
    import torch

    from trace_rl.formats.paged_kv import default_block_size
    from trace_rl.kernels.attention_config import choose_splits
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention

    hkv = CLASSES[cls]
    page = default_block_size(fmt)
    pages = ctx // page
    gen = torch.Generator(device=DEV)
    gen.manual_seed(batch * 7 + ctx)
    table = torch.randperm(batch * pages, device=DEV).to(torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    lens[1] = ctx - 37                                              # one ragged row: the masked tail is timed too
    q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
    k, v = random_cache(fmt, "k", batch * pages, hkv, gen), random_cache(fmt, "v", batch * pages, hkv, gen)
    nbytes = k.nbytes + v.nbytes
    row = {"cls": cls, "batch": batch, "context": ctx, "format": fmt, "page": page, "cache_bytes": nbytes,
           "roofline_us": nbytes / read_bw * 1e6, "sdpa_us": sdpa_us, "runs": []}
    sub = slice(0, 2)
    ref = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], D ** -0.5).float()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def run(cfg, splits):
        """Check, then time one launch; cfg None: the shipped defaults (`decode_attention` without keywords)."""
        if time.time() > deadline:
            return None
        kw = {} if cfg is None else dict(cfg_kw(cfg), splits=splits)
        r = {"config": "shipped" if cfg is None else cfg_name(cfg), "splits": splits}
        try:
            out = decode_attention(q, k, v, table, lens, D ** -0.5, **kw)[sub].float()
            r["rel_err"] = max(((out[i] - ref[i]).norm() / ref[i].norm()).item() for i in range(2))
            if not r["rel_err"] < 1e-2:
                r["wrong"] = True
            else:
                r["us"] = bench_us(lambda: decode_attention(q, k, v, table, lens, D ** -0.5, **kw))
                r["bw_frac"] = row["roofline_us"] / r["us"]
                if sdpa_us:
                    r["x_sdpa"] = sdpa_us / r["us"]
        except Exception as e:
            r["error"] = repr(e)[:300]
        row["runs"].append(r)
        return r

    row["default"] = run(None, None)
    timed = []
    for cfg in configs:
        s = choose_splits(batch, hkv, pages * page, cfg[0], sms, 2.0)
        r = run(cfg, s)
        if r and "us" in r:
            timed.append((r["us"], cfg))
    for _, cfg in sorted(timed)[:2]:
        for s in split_candidates(batch * hkv, sms, pages * page, cfg[0]):
            if not any(x["config"] == cfg_name(cfg) and x["splits"] == s for x in row["runs"]):
                run(cfg, s)
    good = [r for r in row["runs"] if "us" in r]
    if good:
        row["best"] = min(good, key=lambda r: r["us"])
    log({k: v for k, v in row.items() if k != "runs"})
    return row


def gpu_main(args) -> None:
    import torch
    import triton

    if SMOKE:
        torch.cuda.get_device_name = lambda *a: "cpu (smoke)"
        torch.cuda.get_device_properties = lambda *a: type("P", (), {"multi_processor_count": 4})()
        torch.cuda.empty_cache = lambda: None
    t0 = time.time()
    deadline = t0 + args.deadline
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "attention_tune.json")
    props = torch.cuda.get_device_properties(0)
    res = {"env": {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
                   "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   "command": " ".join(sys.argv)}, "checks": [], "sdpa": {}, "rows": []}

    def save():
        with open(out_json + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(out_json + ".tmp", out_json)

    def log(obj):
        print(json.dumps(obj), flush=True)

    formats = [f for f in args.formats.split(",") if f]
    if args.only_defaults:                    # check (and compile) what the launch policy picks at the shapes
        from trace_rl.kernels.attention_config import launch_config

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        tasks = []
        for cls_, batch, ctx in SHAPES:
            for fmt in formats:
                c = launch_config(fmt, batch, CLASSES[cls_], ctx, sms)[0]
                task = (fmt, cls_, (c.block_t, c.num_warps, c.num_stages, c.maxnreg))
                if task not in tasks:
                    tasks.append(task)
    else:
        tasks = [(fmt, cls, cfg) for cls in CLASSES for fmt in formats for cfg in CONFIGS[fmt]]
    check_deadline = t0 + args.check_seconds

    def spawn(i: int, mine: list) -> tuple:
        path = os.path.join(args.out, f"check_{i}.jsonl")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(mine), "--worker-out", path,
               "--worker-deadline", str(check_deadline)]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(path + ".err", "w")), path, mine

    workers = [spawn(i, tasks[i :: args.workers]) for i in range(min(args.workers, len(tasks)))]
    # baselines while the workers compile (they use the GPU lightly: small problems)
    n = 1 << (16 if SMOKE else 30)                                  # 1 Gi floats = 4 GiB
    a = torch.randn(n, device=DEV)
    o = torch.empty((), device=DEV)
    res["read_TBps"] = 4 * n / bench_us(lambda a=a, o=o: torch.sum(a, 0, out=o)) / 1e6
    del a
    torch.cuda.empty_cache()
    log({"read_TBps": res["read_TBps"]})
    save()
    done_paths, spawned = [], len(workers)
    while workers:                   # a worker exits after a CUDA fault (sticky); its remaining tasks get a new one
        time.sleep(0.2)
        for item in list(workers):
            w, path, mine = item
            if w.poll() is None:
                if time.time() < check_deadline + 5:
                    continue
                w.kill()                                            # its unfinished configs stay unchecked
                w.wait()
            workers.remove(item)
            done_paths.append(path)
            rows = list(map(json.loads, open(path))) if os.path.exists(path) else []
            ran = {(c["format"], c["cls"], c["config"]) for c in rows}
            rest = [t for t in mine if (t[0], t[1], cfg_name(t[2])) not in ran]
            if w.returncode == 3 and rest and time.time() < check_deadline:
                workers.append(spawn(spawned, rest))
                spawned += 1
    ok = set()
    for path in done_paths:
        if os.path.exists(path):
            for line in open(path):
                c = json.loads(line)
                res["checks"].append(c)
                if c.get("ok"):
                    ok.add((c["format"], c["cls"], c["config"]))
    res["check_summary"] = f"{len(ok)} of {len(tasks)} (format, class, config) passed; {len(res['checks'])} ran"
    log(res["check_summary"])
    save()
    read_bw = res["read_TBps"] * 1e12
    for cls, batch, ctx in SHAPES:
        if time.time() > deadline:
            break
        key = f"{cls}_{batch}x{ctx}"
        try:
            res["sdpa"][key] = sdpa_best(CLASSES[cls], batch, ctx)
        except Exception:
            res["sdpa"][key] = {"error": traceback.format_exc()[-600:]}
        torch.cuda.empty_cache()
        sdpa_us = res["sdpa"][key].get("best_us")
        log({key: res["sdpa"][key]})
        for fmt in formats:
            if time.time() > deadline:
                break
            configs = [] if args.only_defaults else [c for c in CONFIGS[fmt] if (fmt, cls, cfg_name(c)) in ok]
            try:
                res["rows"].append(time_shape(cls, batch, ctx, fmt, configs, read_bw, sdpa_us, deadline, log))
            except Exception:
                res["rows"].append({"cls": cls, "batch": batch, "context": ctx, "format": fmt,
                                    "error": traceback.format_exc()[-1200:]})
            torch.cuda.empty_cache()
            save()
    res["seconds"] = round(time.time() - t0, 1)
    save()


def print_tables(path: str) -> None:
    """Markdown rows of a results file: per shape and format the shipped launch and the best checked one."""
    res = json.load(open(path))
    print(f"read ceiling {res.get('read_TBps', float('nan')):.2f} TB/s; {res.get('check_summary', '')}")
    print("| shape | B x L | SDPA (us, backend) | format | shipped: us (x SDPA; of read BW) | best: config, splits, us "
          "(x SDPA; of read BW) |")
    print("|---|---|---|---|---|---|")
    for r in res["rows"]:
        sd = res["sdpa"].get(f"{r['cls']}_{r['batch']}x{r['context']}", {})

        def cell(x):
            if not x or "us" not in x:
                return "wrong" if x and x.get("wrong") else "-"
            return f"{x['us']:.0f} ({x.get('x_sdpa', float('nan')):.2f}x; {x['bw_frac']:.2f})"
        best = r.get("best")
        print(f"| {r['cls']} | {r['batch']} x {r['context']} | {sd.get('best_us', float('nan')):.0f} "
              f"({sd.get('best')}) | {r['format']} | {cell(r.get('default'))} | "
              + (f"{best['config']}, {best['splits']}, {cell(best)}" if best else "-") + " |")
    wrong = [(r["format"], r["batch"], r["context"], x["config"], x["splits"]) for r in res["rows"]
             for x in r.get("runs", []) if x.get("wrong") or "error" in x]
    bad = [(c["format"], c["cls"], c["config"]) for c in res.get("checks", []) if not c.get("ok")]
    print(f"wrong or failed at the timed shapes: {wrong or 'none'}; failed ragged checks: {bad or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-check", action="store_true", help="compile every config for sm_90 (no GPU needed)")
    ap.add_argument("--out", default="attention_tune")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 4) - 2)))
    ap.add_argument("--check-seconds", type=float, default=50.0, help="the check phase ends by then")
    ap.add_argument("--only-defaults", action="store_true", help="time the shipped defaults only (a confirming run)")
    ap.add_argument("--deadline", type=float, default=105.0, help="seconds from start: timing stops by then")
    ap.add_argument("--table", help="print the markdown summary of a results JSON and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.table:
        print_tables(args.table)
    elif args.worker:
        check_worker([(f, c, tuple(cfg)) for f, c, cfg in json.loads(args.worker)], args.worker_out,
                     args.worker_deadline)
    elif args.compile_check:
        rows = compile_check()
        bad = [r for r in rows if not r["ok"]]
        print(f"{len(rows) - len(bad)} of {len(rows)} compile without spills" + (f"; failing: {bad}" if bad else ""))
        sys.exit(1 if bad else 0)
    else:
        gpu_main(args)


if __name__ == "__main__":
    main()
