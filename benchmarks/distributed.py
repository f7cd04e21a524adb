"""Distributed benchmarks: weight-sync time (state dict vs packed), rollout scaling over Ray workers, and a
sharded-trainer + Ray-workers loop. Writes JSON. docs/benchmarks.md ("Distributed") has the results.

    # weight sync both ways + rollout tokens/s with 1..W workers, on a local Ray cluster started here
    python benchmarks/distributed.py sync --models tiny,medium --plan nvfp4 --workers 1,2 --device cpu
    python benchmarks/distributed.py sync --models qwen3-1.7b --workers 1,2,4 --device cuda     # 1 GPU/worker

    # FSDP2 trainer over GPUs 0..T-1 (torchrun) + W Ray workers on GPUs T..T+W-1; per step: rollout,
    # GRPO step on the rollouts, weight sync. `--device cpu` runs the same code with gloo and CPU actors.
    python benchmarks/distributed.py scale --model qwen3-1.7b --trainer-gpus 2 --workers 2 --device cuda

Models: `tiny` (the default policy's shape, 1.6M), `medium` (qwen3 family, 4 layers, hidden 1024, vocab
32000: 84M), or a real preset (`qwen3-1.7b`, `qwen3-8b`); random weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from trace_rl.plan import PrecisionPlan

PLANS = {"bf16": PrecisionPlan(), "fp8": PrecisionPlan.preset("fp8"),
         "nvfp4": PrecisionPlan(rollout_weights="nvfp4", rollout_activations="nvfp4", kv_cache="nvfp4")}


def bench_model(name: str, device: torch.device, dtype: torch.dtype = torch.float32):
    from trace_rl.models.decoder import build
    from trace_rl.models.presets import preset

    if name == "medium":
        config = dataclasses.replace(preset("qwen3-1.7b"), vocab_size=32000, hidden_size=1024,
                                     intermediate_size=3072, num_layers=4, num_heads=16, num_kv_heads=8, head_dim=64)
    else:
        config = preset(name)
    model = build(config, device=device, dtype=dtype)
    return model.init_random(generator=torch.Generator(device=device).manual_seed(0))


def plan_of(name: str) -> PrecisionPlan:
    if name not in PLANS:
        raise SystemExit(f"--plan: {name!r}; choose from {', '.join(PLANS)}")
    return PLANS[name]


def random_prompts(num: int, length: int, vocab: int, seed: int):
    from tensordict import TensorDict

    from trace_rl.data import schema as K

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, min(vocab, 30000), (num, length), generator=g)
    return TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: torch.ones_like(tokens, dtype=torch.bool)},
                      batch_size=[num])


def ray_engine(model, plan, workers: int, device: torch.device, mode: str, max_batch: int, max_seq_len: int,
               ray_address: str | None = None):
    from trace_rl.distributed.ray_engine import RayRolloutEngine

    return RayRolloutEngine(model, plan, workers=workers, gpus_per_worker=float(device.type == "cuda"),
                            engine_kwargs={"max_batch": max_batch, "max_seq_len": max_seq_len}, weight_sync=mode,
                            packer_device=device, ray_address=ray_address)


def median_record(records: list[dict]) -> dict:
    keys = [k for k, v in records[0].items() if isinstance(v, (int, float))]
    return {**records[0], **{k: statistics.median(r[k] for r in records) for k in keys}, "repeats": len(records)}


# -- sync: weight sync both ways, rollout scaling --
def cmd_sync(args) -> dict:
    import ray

    from trace_rl.engine.base import SamplingParams

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    workers = [int(w) for w in args.workers.split(",")]
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             num_cpus=max(workers) + 1 if device.type == "cpu" else None)
    plan, out = plan_of(args.plan), {"device": args.device, "plan": args.plan, "threads": torch.get_num_threads(),
                                     "host_cpus": os.cpu_count(), "sync": {}, "rollout": {}}
    for name in args.models.split(","):
        model = bench_model(name, device)
        params = sum(p.numel() for p in model.parameters())
        for mode in ("state_dict", "packed"):
            engine = ray_engine(model, plan, max(workers), device, mode, max_batch=8, max_seq_len=64)
            records = []
            for r in range(args.repeats + 1):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p), alpha=1e-4)
                engine.load_weights(model.state_dict(), r + 1)
                assert engine.worker_versions() == [r + 1] * max(workers)
                if r:                     # the first sync warms up (allocations, object store)
                    records.append(dict(engine.last_sync))
            engine.shutdown()
            out["sync"][f"{name}/{mode}"] = {"params": params, "workers": max(workers), **median_record(records)}
            print(name, mode, json.dumps(out["sync"][f"{name}/{mode}"]), flush=True)
        if name != args.rollout_model:
            del model
    model = bench_model(args.rollout_model, device)
    prompts = random_prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=1)
    sampling = SamplingParams(n=args.samples, max_new_tokens=args.new_tokens, ignore_stop=True, seed=0)
    for w in workers:
        engine = ray_engine(model, plan, w, device, "packed", max_batch=args.max_batch,
                            max_seq_len=args.prompt_len + args.new_tokens)
        engine.generate(prompts, sampling)                       # warm-up (CUDA graphs on GPU)
        t0 = time.perf_counter()
        batch = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - t0
        tokens = int(batch.get(("masks", "response")).sum())
        engine.shutdown()
        out["rollout"][str(w)] = {"workers": w, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
        print("rollout", json.dumps(out["rollout"][str(w)]), flush=True)
    ray.shutdown()
    return out


# -- scale: launcher (Ray head + torchrun) and the per-rank loop --
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd_scale(args) -> dict:
    """Start a Ray head for the workers' devices (killed by pid at the end), then torchrun the ranks."""
    t, w = args.trainer_gpus, args.workers
    ray_port, out = free_port(), Path(args.out or "distributed_scale.json")
    # a fresh token for this cluster only, passed to the head and the ranks (never written to disk)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    head_env, rank_env = {**os.environ, **auth}, {**os.environ, **auth}
    resources = ["--num-cpus", str(w + 1)]
    if args.device == "cuda":
        if torch.cuda.device_count() < t + w:
            raise SystemExit(f"needs {t + w} GPUs (trainer {t} + workers {w}); {torch.cuda.device_count()} visible")
        head_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(t + i) for i in range(w))
        rank_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(t))
        resources = ["--num-gpus", str(w), "--num-cpus", str(2 * w + 1)]
    ray_bin = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--port", str(ray_port), "--include-dashboard",
                             "false", "--node-ip-address", "127.0.0.1", *resources], env=head_env)
    try:
        time.sleep(args.ray_start_wait)
        rank_env["RAY_ADDRESS"] = f"127.0.0.1:{ray_port}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(t),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__, "scale-rank",
               *sys.argv[2:], "--out", str(out)]
        done = subprocess.run(cmd, env=rank_env)
        if done.returncode:
            raise SystemExit(f"torchrun exited with {done.returncode}")
    finally:
        head.terminate()          # `ray start --block` stops the cluster it started when terminated
        head.wait(timeout=60)
        # it leaves its address behind, and a later ray.init() without an address would try to join it
        marker = Path("/tmp/ray/ray_current_cluster")
        if marker.is_file() and marker.read_text().strip().endswith(f":{ray_port}"):
            marker.unlink()
    return json.loads(out.read_text())


def cmd_scale_rank(args) -> None:
    import torch.distributed as dist

    from trace_rl.data import schema as K
    from trace_rl.distributed import fsdp
    from trace_rl.engine.base import SamplingParams
    from trace_rl.objectives import GRPOLoss

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    rank, world, device = fsdp.init_trainer_group(args.trainer_gpus, device)
    model = bench_model(args.model, device)
    plan = plan_of(args.plan)
    engine = None
    if rank == 0:
        engine = ray_engine(model, plan, args.workers, device, args.weight_sync, max_batch=args.max_batch,
                            max_seq_len=args.prompt_len + args.new_tokens, ray_address=os.environ["RAY_ADDRESS"])
    fsdp.shard_model(model, device, "bf16" if device.type == "cuda" else "off")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss_fn = GRPOLoss(model)
    sampling = SamplingParams(n=args.samples, max_new_tokens=args.new_tokens, ignore_stop=True, seed=0)
    steps = []
    for step in range(args.steps):
        record, t0 = {"step": step + 1}, time.perf_counter()
        batch = None
        if rank == 0:
            prompts = random_prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=step)
            batch = engine.generate(prompts, sampling)
            batch.set(K.ADVANTAGE, torch.randn(batch.batch_size[0]))
            batch.set(K.LOGP_OLD, batch.get(K.LOGP_ROLLOUT))
            record["rollout_seconds"] = time.perf_counter() - t0
            record["rollout_tokens_per_s"] = int(batch.get(K.MASK_RESPONSE).sum()) / record["rollout_seconds"]
        batch = fsdp.broadcast_object(batch).to(device)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for rows, weight in fsdp.rank_micro_batches(batch.batch_size[0], args.micro_batch, rank, world):
            (loss_fn(batch[rows])["loss_objective"] * weight).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        full = fsdp.full_state_dict(model)                 # collective: every rank gathers
        t3 = time.perf_counter()
        if rank == 0:
            engine.load_weights(full, step + 1)
            record.update(train_seconds=t2 - t1, gather_seconds=t3 - t2, **engine.last_sync,
                          step_seconds=time.perf_counter() - t0)
            steps.append(record)
            print(json.dumps(record), flush=True)
        dist.barrier()
    if rank == 0:
        engine.shutdown()
        result = {"model": args.model, "plan": args.plan, "device": args.device, "trainer_ranks": world,
                  "workers": args.workers, "weight_sync": args.weight_sync, "steps": steps,
                  "median": median_record(steps[1:] or steps)}
        Path(args.out).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["sync", "scale", "scale-rank"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--plan", default="nvfp4")
    ap.add_argument("--models", default="tiny,medium", help="sync: models whose weight sync is timed")
    ap.add_argument("--model", default="tiny", help="scale: the policy")
    ap.add_argument("--rollout-model", default="tiny", help="sync: the model of the rollout-scaling runs")
    ap.add_argument("--workers", default="2", help="sync: comma list (rollout scaling); scale: one number")
    ap.add_argument("--trainer-gpus", type=int, default=2)
    ap.add_argument("--weight-sync", default="packed", choices=["state_dict", "packed"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of this process (CPU actors run 1 each: one CPU per actor)")
    ap.add_argument("--ray-start-wait", type=float, default=10.0, help="scale: seconds to let the Ray head start")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.command == "scale-rank":
        args.workers = int(args.workers)
        return cmd_scale_rank(args)
    if args.command == "scale":
        args.workers = int(args.workers)
        result = cmd_scale(args)
    else:
        result = cmd_sync(args)
    result["date"] = time.strftime("%Y-%m-%d")
    text = json.dumps(result, indent=2)
    if args.out and args.command == "sync":
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
