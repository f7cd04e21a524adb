"""CUDA MPS for the study's runs that share one GPU (`stability_study.py call --jobs 2 --mps`).

Without MPS, two processes on one GPU are time-sliced: their kernels never overlap, so on the study's 17.4M
model, whose decode kernels fill a small part of the H200, two runs measured 5.9 s per fp4 step each against
3.19 s alone (H200, 2026-12-01/02: 1.08x the throughput at 89-92% "utilisation", which counts time with any
kernel running). MPS lets the kernels of both processes run on the SMs at once. It is a user-space daemon
(`nvidia-cuda-mps-control -d`): it changes no GPU setting (compute mode, clocks, MIG) and stops with the call.

If the daemon cannot start or a CUDA client cannot attach to it, the call says so in its log and the runs
share the GPU by time-slicing as before (the call's journal records which)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
PROBE = "import torch; x = torch.ones(1024, device='cuda'); assert float(x.sum()) == 1024.0"


class MPS:
    """Context manager: starts the MPS control daemon (pipe and log folders under `root`), checks that a CUDA
    client attaches, and quits the daemon on exit. `active` says whether the runs go through MPS."""

    def __init__(self, log, root: Path = Path("/tmp/trace_rl_mps")):
        self.log, self.root, self.active = log, Path(root), False
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.root / "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": str(self.root / "log")}
        self._saved = {k: os.environ.get(k) for k in self.env}

    def __enter__(self) -> MPS:
        control = shutil.which(CONTROL)
        if control is None:
            self.log(f"MPS: {CONTROL} not found on PATH; the runs share the GPU by time-slicing")
            return self
        for folder in self.env.values():
            Path(folder).mkdir(parents=True, exist_ok=True)
        os.environ.update(self.env)                  # the daemon and every run (subprocesses) find the pipe here
        started = subprocess.run([control, "-d"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=30)
        if started.returncode != 0:
            self.log(f"MPS: {CONTROL} -d failed (rc {started.returncode}: {started.stderr.strip()[-300:]}); "
                     f"the runs share the GPU by time-slicing")
            self._restore_env()
            return self
        probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            self.log(f"MPS: a CUDA client could not attach (rc {probe.returncode}: "
                     f"{probe.stderr.strip()[-300:]}); daemon stopped, the runs share the GPU by time-slicing")
            self._quit()
            self._restore_env()
            return self
        self.active = True
        self.log(f"MPS: on (pipe {self.env['CUDA_MPS_PIPE_DIRECTORY']}): the runs' kernels can overlap")
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self._quit()
            self._restore_env()
            self.active = False

    def _quit(self) -> None:
        try:
            subprocess.run([CONTROL], input="quit\n", capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            self.log(f"MPS: quitting the daemon failed: {err}")

    def _restore_env(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
