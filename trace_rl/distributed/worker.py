"""`RolloutWorker`: one `NativeEngine` in its own process. `RayRolloutEngine` runs it as a Ray actor
(`ray.remote(RolloutWorker)`); it is a plain class so that tests and benches can also run it in-process.

It is built from the trainer's full state dict (version 0) and afterwards only receives weight syncs:
`load_weights(payload, version, packed)` with either the trainer's weights (re-quantized here) or the
trainer's packed buffers (copied in place, see `weight_sync`); tensors arrive as `transport.Wire` bytes.
It reports the version it holds, so the driver detects a worker that missed a sync (e.g. restarted by
Ray with its initial weights).
"""

from __future__ import annotations

import logging
import time

import torch
from tensordict import TensorDictBase

from trace_rl.distributed.transport import Wire
from trace_rl.engine.base import SamplingParams

log = logging.getLogger("trace_rl.distributed")


class RolloutWorker:
    def __init__(self, index: int, model_config, plan, weights: Wire, *, device: str,
                 dtype: torch.dtype | None = None, engine_kwargs: dict | None = None, threads: int | None = None):
        from trace_rl.engine.native import NativeEngine
        from trace_rl.models.decoder import build
        from trace_rl.models.loading import load_state_dict_into

        if threads:
            torch.set_num_threads(threads)
        self.index = index
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)   # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU(s)
        from trace_rl.distributed.transport import from_wire

        weights = from_wire(weights)
        first = next(iter(weights.values()))
        trainer = build(model_config, device=device, dtype=first.dtype)
        with torch.no_grad():
            load_state_dict_into(trainer, weights)
        self.engine = NativeEngine(trainer, plan, device=device, dtype=dtype, **(engine_kwargs or {}))
        del trainer
        self.syncs = 0

    def ready(self) -> int:
        """The index, once the engine is built (the driver waits on it to surface construction errors)."""
        return self.index

    @torch.no_grad()
    def generate(self, prompts: TensorDictBase, sampling: SamplingParams) -> TensorDictBase:
        return self.engine.generate(prompts, sampling).cpu()

    def load_weights(self, payload: Wire, version: int, packed: bool) -> dict:
        """Install a weight sync; returns {"worker", "version" (now held), "seconds" (install time)}."""
        from trace_rl.distributed.transport import from_wire
        from trace_rl.distributed.weight_sync import load_packed

        t0 = time.perf_counter()
        payload = from_wire(payload)
        if packed:
            load_packed(self.engine, payload, version)
        else:
            self.engine.load_weights(payload, version)
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        self.syncs += 1
        return {"worker": self.index, "version": self.engine.policy_version, "seconds": time.perf_counter() - t0}

    def guidance_sites(self) -> dict:
        """TRACE: trainer layer -> its record's `Site`, when the plan is guided (see NativeEngine.guidance_sites)."""
        return self.engine.guidance_sites

    def policy_version(self) -> int:
        return self.engine.policy_version

    def report(self) -> dict:
        return {"worker": self.index, "policy_version": self.engine.policy_version, "syncs": self.syncs,
                **self.engine.report()}
