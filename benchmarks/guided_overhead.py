"""Cost of TRACE guided rounding on the trainer and on the rollout (H200; also runs on CPU at tiny shapes).

Sections (each writes into the JSON as soon as it finishes, so a failure loses nothing before it):

- `kernels`: the fused fake-quantize kernel per activation shape of the model (round-to-nearest and
  guided) against the torch reference and the roofline (bytes read + written / measured copy bandwidth).
- `trainer`: one optimizer step (forward, token log-probs, backward, AdamW) of a full-depth model in three
  modes on the same batch: `bf16` (no fake quantization), `aligned` (fake quantization to the rollout's
  formats) and `guided` (the rollout's records; taken here from an aligned forward of the same tokens,
  which is what the rollout records for identical inputs: same shapes, same cost). Median after warm-up.
  Also the records' bytes, and the time to bring one micro-batch of records from pinned host memory.
- `decode`: the rollout's decode step (fp4-guided plan: W4A4 nvfp4 + nvfp4 KV) with and without recording
  guidance, eager and with CUDA graphs, at a given batch and context.

    python benchmarks/guided_overhead.py --presets qwen3-1.7b,qwen3-8b --batch 8,2 --seq 2048 --out-dir OUT
    python benchmarks/guided_overhead.py --presets tiny --batch 2 --seq 64 --device cpu   # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from trace_rl.backends import get_backend
from trace_rl.bench import measure as bm
from trace_rl.correction.guided import GuidanceRecord, record_guidance
from trace_rl.formats import get_format, per_token
from trace_rl.models.decoder import build
from trace_rl.models.presets import preset
from trace_rl.plan import PrecisionPlan

# layers that read the same input share one record (the engine records it once: engine/guidance.py)
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Report:
    """The JSON report, rewritten after every section."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {**meta, "kernels": [], "trainer": [], "decode": [], "errors": []}

    def add(self, section: str, entry) -> None:
        self.data[section].append(entry)
        self.path.write_text(json.dumps(self.data, indent=1))


# -- kernels --

def bench_kernels(model_name: str, tokens: int, device, report: Report, iters: int) -> None:
    from trace_rl.kernels.fake_quant import fake_quantize

    c = preset(model_name)
    bw = bm.bandwidth_ceilings(device, gbytes=1.0)["copy"]
    for k in sorted({c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim}):
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        for fmt in ("nvfp4:row", "mxfp4"):
            record = _with_valid(record_guidance(x, fmt), x.shape[:1])
            ref = get_format(fmt)
            entry = {"model": model_name, "rows": tokens, "K": k, "fmt": fmt,
                     "roofline_ms": 4 * x.numel() / bw * 1e3,
                     "roofline_guided_ms": (4 + 0.1875 + 4 / k) * x.numel() / bw * 1e3,
                     "nearest_ms": bm.median_ms(partial(fake_quantize, x, fmt), device, iters),
                     "guided_ms": bm.median_ms(partial(fake_quantize, x, fmt, record), device, iters),
                     "torch_reference_ms": bm.median_ms(partial(ref.fake_quantize, x), device, max(3, iters // 4))}
            entry["nearest_of_roofline"] = entry["roofline_ms"] / entry["nearest_ms"]
            entry["guided_of_roofline"] = entry["roofline_guided_ms"] / entry["guided_ms"]
            report.add("kernels", entry)
            print(f"kernel {fmt:10s} {tokens}x{k}: nearest {entry['nearest_ms']:.3f} ms, guided "
                  f"{entry['guided_ms']:.3f} ms, roofline {entry['roofline_ms']:.3f} ms, torch "
                  f"{entry['torch_reference_ms']:.3f} ms", flush=True)


def _with_valid(record: GuidanceRecord, rows_shape) -> GuidanceRecord:
    """Records as the trainer sees them: every position valid but the last (never fed to the rollout)."""
    valid = torch.ones(rows_shape, dtype=torch.bool, device=record.bits.device)
    valid[..., -1] = False
    return GuidanceRecord(record.scales, record.global_scale, record.bits, valid)


# -- trainer step --

def capture_records(model, tokens) -> tuple[dict, dict]:
    """One no-grad forward in the current (aligned) mode recording every quantized Linear input, once per
    distinct input, and each layer's K/V, as the rollout would; returns (linear records, kv records)."""
    records, kv_records = {}, {}
    for name, lin in model.linears().items():
        if lin.act_fmt != "bf16" and name.rsplit(".", 1)[-1] not in SHARED_INPUT:
            lin.activation_hook = lambda layer, x, n=name: records.__setitem__(
                n, _with_valid(record_guidance(x.detach(), per_token(layer.act_fmt)), x.shape[:2])) or None
    for layer in model.model.layers:
        layer.self_attn.kv_hook = lambda a, k, v: kv_records.__setitem__(a.layer_idx, tuple(
            _with_valid(record_guidance(t.detach(), per_token(a.kv_fake_fmt)), t.shape[:2]) for t in (k, v))) or None
    with torch.no_grad():
        model(tokens)
    for lin in model.linears().values():
        lin.activation_hook = None
    for layer in model.model.layers:
        layer.self_attn.kv_hook = None
    return records, kv_records


def serve_records(model, records, kv_records) -> None:
    for name, lin in model.linears().items():
        parent, _, leaf = name.rpartition(".")
        key = f"{parent}.{SHARED_INPUT[leaf]}" if leaf in SHARED_INPUT else name
        if key in records:
            lin.activation_hook = lambda layer, x, r=records[key]: r
    for layer in model.model.layers:
        layer.self_attn.kv_hook = lambda a, k, v, r=kv_records[layer.self_attn.layer_idx]: r


def record_bytes(records, kv_records) -> int:
    """Bytes of all records (every token of the batch, every recorded site)."""
    tensors = [t for r in [*records.values(), *(x for pair in kv_records.values() for x in pair)]
               for t in (r.scales, r.global_scale, r.bits) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def train_step(model, tokens, opt) -> None:
    logits = model(tokens[:, :-1])
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    (-logp.mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def time_steps(fn, device, reps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def bench_trainer(model_name: str, batch: int, seq: int, device, report: Report, reps: int, warmup: int) -> None:
    config = preset(model_name)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), device=device, generator=gen)
    plan = PrecisionPlan.preset("fp4-guided")
    entry = {"model": model_name, "layers": config.num_layers, "batch": batch, "seq": seq, "ms": {},
             "ms_all": {}, "optimizer": "AdamW (bf16 states)", "loss": "token log-probs (float32 log_softmax)"}
    for mode in ("bf16", "aligned", "guided"):
        model = build(config, device=device, dtype=torch.bfloat16).init_random(generator=gen)
        backend = get_backend("fp4")
        quantized_before = backend.weight_cache.quantizations
        if mode == "guided":
            model.apply_plan(plan.model_copy(update={"trainer": "aligned"}))
            records, kv = capture_records(model, tokens[:, :-1])
            total = record_bytes(records, kv)
            entry["record_bytes_per_token"] = total / (batch * seq)
            entry["record_bytes_per_token_per_layer"] = total / (batch * seq * config.num_layers)
            entry["record_bytes_per_micro_batch"] = total
            entry["h2d_ms_per_micro_batch"] = _h2d_ms(records, kv, device)
            model.apply_plan(plan)
            serve_records(model, records, kv)
        else:
            model.apply_plan(None if mode == "bf16" else plan.model_copy(update={"trainer": mode}))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
        times = time_steps(partial(train_step, model, tokens, opt), device, reps, warmup)
        entry["ms"][mode] = statistics.median(times)
        entry["ms_all"][mode] = times
        steps = warmup + reps
        entry.setdefault("weight_quantizations_per_step", {})[mode] = \
            (backend.weight_cache.quantizations - quantized_before) / steps
        if device.type == "cuda":
            entry.setdefault("peak_GB", {})[mode] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        print(f"trainer {model_name} {batch}x{seq} {mode}: {entry['ms'][mode]:.1f} ms/step", flush=True)
        model = opt = records = kv = None
        free()
    ms = entry["ms"]
    entry["aligned_over_bf16"] = ms["aligned"] / ms["bf16"]
    entry["guided_over_bf16"] = ms["guided"] / ms["bf16"]
    entry["targets"] = {"aligned_over_bf16": 1.15, "guided_over_bf16": 1.12}
    report.add("trainer", entry)


def _h2d_ms(records, kv, device) -> float | None:
    """Time to copy one micro-batch of records from pinned host memory to the GPU (what item 5's trainer
    does per micro-batch; overlappable with the previous micro-batch's compute)."""
    if device.type != "cuda":
        return None
    tensors = [t for r in [*records.values(), *(x for pair in kv.values() for x in pair)]
               for t in (r.scales, r.global_scale, r.bits) if t is not None]
    host = [t.cpu().pin_memory() for t in tensors]
    dev = [torch.empty_like(t) for t in tensors]

    def copy():
        for d, h in zip(dev, host):
            d.copy_(h, non_blocking=True)

    return bm.median_ms(copy, device, 3, 1)


# -- rollout decode --

def bench_decode(model_name: str, batch: int, context: int, device, report: Report, iters: int) -> None:
    from trace_rl.bench.decode_grid import time_step
    from trace_rl.engine.native import NativeEngine

    plan = PrecisionPlan.preset("fp4-guided")
    model = build(preset(model_name), device=device, dtype=torch.bfloat16, plan=plan)
    model.init_random(generator=torch.Generator(device=device).manual_seed(0))
    model.to_rollout()
    entry = {"model": model_name, "plan": "fp4-guided (W4A4 nvfp4, nvfp4 KV)", "batch": batch,
             "context": context, "step_ms": {}}
    variants = [("graphs", True, False), ("eager", False, False), ("eager+record", False, True),
                ("graphs+record", True, True)]
    for label, graphs, record in variants:
        if graphs and device.type != "cuda":
            continue
        engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=context + 64, device=device,
                              graph_buckets=[batch], cuda_graphs=graphs, record_guidance=record)
        if not record:       # the model's hooks belong to the last recording engine built on it
            for m in model.modules():
                for hook in ("activation_hook", "kv_hook"):
                    if hasattr(m, hook):
                        setattr(m, hook, None)
        entry["step_ms"][label] = time_step(engine, batch, context, iters)
        if record:   # + the flush of a full window to pinned host memory, amortized over its steps
            rec = engine.recorder
            window = rec.window
            rec.begin(batch, 1, window + 1)
            flush_ms = bm.median_ms(partial(_flush, rec, batch, window), engine.device, 5, 1)
            entry["flush_ms_per_window"] = flush_ms
            entry["step_ms"][label + "+flush"] = entry["step_ms"][label] + flush_ms / window
            entry["flush_GBps"] = batch * window * rec.bytes_per_token / (flush_ms * 1e-3) / 1e9
            entry["record_bytes_per_token"] = rec.bytes_per_token
            entry["record_gpu_ring_bytes"] = rec.gpu_bytes
            entry["window"] = window
        print(f"decode {model_name} B={batch} L={context} {label}: {entry['step_ms'][label]:.2f} ms", flush=True)
        engine = None
        free()
    s = entry["step_ms"]
    if s.get("graphs") and s.get("graphs+record+flush"):
        entry["record_over_plain_graphs"] = s["graphs+record+flush"] / s["graphs"]
    if s.get("graphs") and s.get("eager+record"):
        entry["eager_record_over_graphs"] = s["eager+record"] / s["graphs"]
    entry["target"] = {"record_over_plain_graphs": 1.10}
    report.add("decode", entry)
    del model
    free()


def _flush(rec, batch: int, window: int) -> None:
    rec.flushed = dict.fromkeys(range(batch), 0)
    rec.flush([(s, s, 1) for s in range(batch)], window, window + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="qwen3-1.7b,qwen3-8b")
    ap.add_argument("--batch", default="8,2", help="micro-batch rows per preset (comma-separated)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sections", default="kernels,trainer,decode")
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--deadline-s", type=float, default=0, help="start no new section after this many seconds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    device = torch.device(args.device)
    t0 = time.perf_counter()
    names = args.presets.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    batches += batches[-1:] * (len(names) - len(batches))
    out = Path(args.out_dir) / "guided_overhead.json"
    report = Report(out, {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                          "torch": torch.__version__, "args": vars(args)})
    sections = args.sections.split(",")
    jobs = []   # the first model's trainer step first (the headline), then decode, the larger model, kernels
    trainer_jobs = [("trainer", name, lambda n=name, b=b: bench_trainer(n, b, args.seq, device, report, args.reps,
                                                                        args.warmup))
                    for name, b in zip(names, batches)] if "trainer" in sections else []
    jobs += trainer_jobs[:1]
    if "decode" in sections:
        jobs.append(("decode", names[0], lambda: bench_decode(names[0], args.decode_batch, args.decode_context,
                                                              device, report, 10)))
    jobs += trainer_jobs[1:]
    if "kernels" in sections and device.type == "cuda":
        jobs.append(("kernels", names[0], lambda: bench_kernels(names[0], batches[0] * args.seq, device, report, 20)))
    for section, name, job in jobs:
        if args.deadline_s and time.perf_counter() - t0 > args.deadline_s:
            report.data["errors"].append(f"{section} {name}: skipped, past the deadline")
            continue
        try:
            job()
        except Exception as e:  # noqa: BLE001  (one failing section must not lose the others)
            report.add("errors", f"{section} {name}: {type(e).__name__}: {e}")
            print(f"FAILED {section} {name}: {type(e).__name__}: {e}", flush=True)
            free()
    report.data["wall_s"] = time.perf_counter() - t0
    report.path.write_text(json.dumps(report.data, indent=1))
    print_table(report.data)


def print_table(d: dict) -> None:
    print("\n== guided overhead ==")
    for e in d["trainer"]:
        ms = e["ms"]
        print(f"trainer {e['model']} {e['batch']}x{e['seq']}: bf16 {ms['bf16']:.1f} ms | aligned "
              f"{ms['aligned']:.1f} ({e['aligned_over_bf16']:.3f}x, target 1.15) | guided {ms['guided']:.1f} "
              f"({e['guided_over_bf16']:.3f}x, target 1.12) | records "
              f"{e['record_bytes_per_token_per_layer']:.0f} B/token/layer, "
              f"H2D {e.get('h2d_ms_per_micro_batch')} ms/micro-batch")
    for e in d["decode"]:
        print(f"decode {e['model']} B={e['batch']} L={e['context']}: "
              + " | ".join(f"{k} {v:.2f} ms" for k, v in e["step_ms"].items() if v)
              + f" | record/graphs {e.get('record_over_plain_graphs')} (target 1.10)")
    for e in d["kernels"]:
        print(f"kernel {e['fmt']} {e['rows']}x{e['K']}: nearest {e['nearest_ms']:.3f} ms "
              f"({e['nearest_of_roofline']:.2f} of roofline), guided {e['guided_ms']:.3f} ms "
              f"({e['guided_of_roofline']:.2f}), torch {e['torch_reference_ms']:.2f} ms")
    for err in d["errors"]:
        print("ERROR", err)


if __name__ == "__main__":
    main()
