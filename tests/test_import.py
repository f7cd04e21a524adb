"""Importing trace_rl must not import Triton, Transformer Engine or vLLM, nor initialise CUDA.

tensordict imports torch._dynamo, which imports Triton when it is installed; that is torch's doing, not
ours. So the check is on who imports: an import hook records any import of triton / transformer_engine /
vllm whose importing frame is trace_rl code. The light core (formats, backends, plan, config) must not
pull Triton in at all.
"""

import subprocess
import sys

CODE = r"""
import importlib, pkgutil, sys, traceback
import torch

WATCHED = ("triton", "transformer_engine", "vllm")
violations = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in WATCHED:
            for frame, _ in traceback.walk_stack(None):
                fn = frame.f_code.co_filename
                if "importlib" in fn or fn.startswith("<frozen"):
                    continue
                if "/trace_rl/" in fn and "/tests/" not in fn:
                    violations.append((name, fn))
                break
        return None

sys.meta_path.insert(0, Watch())
import trace_rl, trace_rl.formats, trace_rl.backends, trace_rl.plan, trace_rl.config
from trace_rl.backends import get_backend
for name in ("bf16", "fp8", "fp4"):
    get_backend(name)
core = [m for m in WATCHED if m in sys.modules]
assert not core, f"the core imports {core}"
import trace_rl.kernels  # the package itself stays lazy; its kernel modules are Triton by definition
for mod in pkgutil.walk_packages(trace_rl.__path__, "trace_rl."):
    if mod.name.startswith(("trace_rl.kernels.", "trace_rl.vllm_plugin.")) or mod.name == "trace_rl.__main__":
        continue  # __main__ runs the CLI; the vLLM plugin's modules subclass vLLM's (loaded by vLLM only)
    importlib.import_module(mod.name)
assert not violations, violations
assert "transformer_engine" not in sys.modules and "vllm" not in sys.modules
assert not torch.cuda.is_initialized()
print("ok")
"""


def test_import_is_light():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
