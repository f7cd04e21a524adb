"""`RayRolloutEngine`: a `RolloutEngine` whose generation runs in Ray actors, one `NativeEngine` each.

The driver (the trainer's rank 0) owns it. `generate` splits the prompts into contiguous chunks, one per
worker, and merges the results (`batches`), so the rest of the pipeline sees one engine. `load_weights`
ships one payload to every worker through Ray's object store (put once as raw bytes, `transport`; read by
all) and checks that each
worker now reports the new version; `generate` checks the version stamped on every worker's rows.

Asynchronous mode: `prefetch(prompts, sampling)` launches a generation and returns at once; the next
`generate` with the same prompts and sampling collects it. Ray runs an actor's calls in order, so the
weight sync sent while a prefetched rollout is running is installed after it: that rollout carries the
previous version (one version stale), which `max_lag` allows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase

from trace_rl.data import schema as K
from trace_rl.distributed.batches import merge_results, split_prompts, worker_seed
from trace_rl.distributed.transport import to_wire
from trace_rl.distributed.weight_sync import TrainerSidePacker, payload_bytes
from trace_rl.engine.base import RolloutEngine, SamplingParams

log = logging.getLogger("trace_rl.distributed")


class StaleWorkerError(RuntimeError):
    """A rollout worker holds (or sampled with) an older policy version than the bound allows."""


def import_ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError("distributed.rollout_workers > 0 needs Ray: pip install 'trace-rl[distributed]' "
                          "(or pip install ray)") from err
    return ray


class RayRolloutEngine(RolloutEngine):
    """Args:
        model: the trainer's (unsharded) Decoder; its weights become every worker's version 0.
        plan: the precision plan (the workers' rollout formats).
        workers: number of actors. gpus_per_worker: GPUs Ray reserves per actor (0: CPU actors).
        engine_kwargs: NativeEngine arguments (max_batch, max_seq_len, pad_token_id, ...).
        dtype: the workers' rollout dtype (None: bf16 on GPU, the trainer's on CPU).
        max_lag: oldest accepted version = current - max_lag (0 in synchronous runs).
        weight_sync: 'state_dict' (workers re-quantize) or 'packed' (quantized here once).
        packer_device: where 'packed' mode quantizes (the trainer's device).
        ray_address: cluster to join; None starts a local one (unless ray.init already ran).
        threads: torch threads per CPU actor (None: Ray's default for one CPU).
    """

    def __init__(self, model, plan, *, workers: int, gpus_per_worker: float = 0.0, engine_kwargs: dict | None = None,
                 dtype: torch.dtype | None = None, max_lag: int = 0, weight_sync: str = "packed",
                 packer_device: torch.device | str = "cpu", ray_address: str | None = None,
                 threads: int | None = None):
        ray = import_ray()
        from trace_rl.distributed.worker import RolloutWorker

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if weight_sync not in ("state_dict", "packed"):
            raise ValueError(f"weight_sync must be 'state_dict' or 'packed', got {weight_sync!r}")
        if not ray.is_initialized():
            # None: a new cluster on this host (loopback), never one another process left running
            local = {"address": "local", "_node_ip_address": "127.0.0.1"} if ray_address is None else {}
            ray.init(**({"address": ray_address} | local), include_dashboard=False, log_to_driver=True)
        device = "cuda" if gpus_per_worker > 0 else "cpu"
        if dtype is None:
            dtype = torch.bfloat16 if device == "cuda" else next(model.parameters()).dtype
        self.pad_token_id = (engine_kwargs or {}).get("pad_token_id", K.PAD_TOKEN_ID_DEFAULT)
        self.max_lag, self.weight_sync, self.plan = max_lag, weight_sync, plan
        self.tied = bool(model.config.tie_word_embeddings)
        initial = ray.put(to_wire(model.state_dict()))
        actor = ray.remote(RolloutWorker)
        self.workers = [actor.options(num_cpus=1, num_gpus=gpus_per_worker).remote(
            i, model.config, plan, initial, device=device, dtype=dtype, engine_kwargs=engine_kwargs,
            threads=threads) for i in range(workers)]
        ray.get([w.ready.remote() for w in self.workers])     # construction errors surface here
        # guided plans: which trainer layer reads which record (the same on every worker)
        self.guidance_sites: dict = ray.get(self.workers[0].guidance_sites.remote())
        self.packer = TrainerSidePacker(model, plan, packer_device, dtype) if weight_sync == "packed" else None
        self.policy_version = 0
        self.worker_versions_at_sync = [0] * workers
        self.last_sync: dict = {}
        self._prefetched: tuple[TensorDictBase, SamplingParams, list] | None = None
        log.info("RayRolloutEngine: %d %s workers, weight sync %s", workers, device, weight_sync)

    # -- generation --
    def _launch(self, prompts: TensorDictBase, sampling: SamplingParams) -> list:
        parts = split_prompts(prompts, len(self.workers))
        return [(first, self.workers[i].generate.remote(
                    chunk, sampling.model_copy(update={"seed": worker_seed(sampling.seed, i)})))
                for i, (first, chunk) in enumerate(parts)]

    def prefetch(self, prompts: TensorDictBase, sampling: SamplingParams) -> None:
        """Launch a generation now; the next `generate(prompts, sampling)` returns its result."""
        if self._prefetched is not None:
            raise RuntimeError("a prefetched rollout was never collected: call generate() with its prompts "
                               "and sampling before prefetching the next one")
        self._prefetched = (prompts, sampling, self._launch(prompts, sampling))

    def _take_prefetched(self, prompts: TensorDictBase, sampling: SamplingParams) -> list | None:
        if self._prefetched is None:
            return None
        p, s, refs = self._prefetched
        same = (s == sampling and p.get(K.TOKENS_PROMPT).shape == prompts.get(K.TOKENS_PROMPT).shape
                and torch.equal(p.get(K.TOKENS_PROMPT), prompts.get(K.TOKENS_PROMPT)))
        if not same:
            return None          # another request (e.g. evaluation): the prefetch stays pending
        self._prefetched = None
        return refs

    def generate(self, prompts: TensorDictBase, sampling: SamplingParams) -> TensorDict:
        ray = import_ray()
        refs = self._take_prefetched(prompts, sampling) or self._launch(prompts, sampling)
        parts = list(zip([first for first, _ in refs], ray.get([r for _, r in refs])))
        oldest = self.policy_version - self.max_lag
        for i, (_, td) in enumerate(parts):
            version = int(td.get(K.POLICY_VERSION).min())
            if version < oldest:
                raise StaleWorkerError(
                    f"rollout worker {i} sampled with policy version {version}; the trainer is at "
                    f"{self.policy_version} and at most {self.max_lag} versions of lag are allowed (the worker "
                    f"missed a weight sync, e.g. Ray restarted it; rebuild the engine)")
        return merge_results(parts, prompts.select(K.TOKENS_PROMPT, K.MASK_PROMPT), self.pad_token_id)

    # -- weights --
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Ship `state_dict` (or its packed form) to every worker; raises if a worker does not report `version`."""
        ray = import_ray()
        t0 = time.perf_counter()
        packed = self.packer is not None
        if packed:
            payload = self.packer.pack(state_dict, version)
        else:    # a tied lm_head is the embedding table: the engines read it from there
            payload = {k: v for k, v in state_dict.items() if not (self.tied and k == "lm_head.weight")}
        wire = to_wire(payload)
        t_pack = time.perf_counter()
        ref = ray.put(wire)
        t_put = time.perf_counter()
        reports = ray.get([w.load_weights.remote(ref, version, packed) for w in self.workers])
        t_done = time.perf_counter()
        self.worker_versions_at_sync = [r["version"] for r in reports]
        bad = [r["worker"] for r in reports if r["version"] != version]
        if bad:
            raise StaleWorkerError(f"workers {bad} report versions {self.worker_versions_at_sync} after a sync to "
                                   f"{version}")
        self.policy_version = int(version)
        self.last_sync = {"sync_mode": self.weight_sync, "sync_bytes": payload_bytes(payload),
                          "sync_prepare_seconds": t_pack - t0, "sync_put_seconds": t_put - t_pack,
                          "sync_install_seconds": max(r["seconds"] for r in reports),
                          "sync_seconds": t_done - t0}

    def worker_versions(self) -> list[int]:
        """The version each worker holds now (asks them; in async mode it waits for a running rollout)."""
        ray = import_ray()
        return ray.get([w.policy_version.remote() for w in self.workers])

    def report(self) -> dict:
        ray = import_ray()
        return {"workers": ray.get([w.report.remote() for w in self.workers]), **self.last_sync}

    def shutdown(self) -> None:
        """Stop the actors (the Ray cluster itself is left running)."""
        ray = import_ray()
        for w in self.workers:
            ray.kill(w)
        self.workers = []
