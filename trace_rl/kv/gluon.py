"""The Gluon FP4-KV decode attention as an engine path (`attention="gluon"` -> `GLUON_PATH`).

`trace_rl.kernels.paged_attention_gluon` (issue 15) is a warp-specialised Gluon kernel: Triton 3.6's
experimental Gluon API, sm_90 only (wgmma, TMA, setmaxnreg), no interpreter. It reads the same pages the shipped
kernel (`kernels.decode_attention`) reads, but only one shape of them: nvfp4 or mxfp4 K/V, head_dim 128, pages of
64 tokens (its 128-token tiles are two pages) and a GQA group of 1..16 query heads per KV head. Here, without importing
Triton: what the path needs (`refusal`: the cache's shape, `runtime_refusal`: the machine), so that forcing it
where it cannot run is an error that says why and what to change, never a silent fallback to another path.

Under `attention="auto"` the engine times it beside the other candidates where it can run (`GLUON_IN_AUTO`, set) and
keeps it only where it is the fastest; where it cannot (`why_not`: the cache's shape, a CPU, another GPU or Triton)
"auto" leaves it out, without an error.

CUDA graphs: the launcher builds host-side `TensorDescriptor`s over the cache's tensors on every call and Triton's
launcher encodes each into a CUtensorMap on the host (cuTensorMapEncodeTiled, no device allocation) passed by value
as a kernel parameter, so a captured launch keeps the maps of the capture; the engine's cache tensors are
allocated once (their addresses are static across replays), so replays read the live pages. The per-call `out`
(and int32 casts the engine does not need) come from the graph's memory pool, as the shipped kernel's do.
"""

from __future__ import annotations

import importlib.util

import torch

GLUON_PATH = "kernels.decode_attention_gluon"
# attention="auto" times the Gluon kernel beside the others (where `why_not` is ""). Set once its GPU tests passed on
# the H200 (benchmarks/results/*_1202b_pytest.log: tests/kernels/test_paged_attention_gluon.py and
# tests/engine/test_native_gpu.py -k gluon, `benchmarks/engine_fp4_gluon_h200.sh`), where the engine's step ran
# 1.04x faster with it (Qwen3-8B w4a4-kv4, B=100, L=8447). False: "auto" never times it; "gluon" still forces it.
GLUON_IN_AUTO = True

# The kernel's scope (paged_attention_gluon: FORMATS, PAGE, HEAD_DIM, N_PAD); tests/kv check they agree. mxfp4 since
# the kernel's MX switch (GPU tests passed on the H200, 2026-12-02: the kernel's 4 mxfp4 cases and the engine's
# forced-Gluon mxfp4 graph test).
KV_FORMATS, PAGE, HEAD_DIM, MAX_GROUP = ("nvfp4", "mxfp4"), 64, 128, 16
TRITON_SERIES = "3.6"


def refusal(kv_format: str, block_size: int, head_dim: int, kv_heads: int, query_heads: int | None) -> str:
    """Why the Gluon kernel cannot read this cache ("" when it can): format, page size, head_dim, GQA group
    (`query_heads` None: not known here, the launcher checks it per call)."""
    if kv_format not in KV_FORMATS:
        return (f"the Gluon decode attention reads nvfp4 or mxfp4 KV caches only, this one is {kv_format!r}: set the "
                f"plan's kv_cache to 'nvfp4' or 'mxfp4' (e.g. preset w4a4-kv4) or use attention='kernels'/'auto'")
    if block_size != PAGE:
        return (f"the Gluon decode attention reads pages of {PAGE} tokens (two per 128-token tile), this cache's "
                f"are {block_size}: leave block_size at the {kv_format} default ({PAGE}) or use attention='kernels'")
    if head_dim != HEAD_DIM:
        return (f"the Gluon decode attention is built for head_dim {HEAD_DIM}, this model's is {head_dim}: use "
                f"attention='kernels'")
    if query_heads is not None and (query_heads % kv_heads or not 1 <= query_heads // kv_heads <= MAX_GROUP):
        return (f"the Gluon decode attention takes 1..{MAX_GROUP} query heads per KV head, this model has "
                f"{query_heads} over {kv_heads}: use attention='kernels'")
    return ""


def dtype_refusal(dtype: torch.dtype) -> str:
    if dtype != torch.bfloat16:
        return f"the Gluon decode attention takes bf16 queries, this engine runs in {dtype}: use attention='kernels'"
    return ""


def runtime_refusal(device: torch.device) -> str:
    """Why the Gluon kernel cannot run on `device` here ("" when it can): an sm_90 GPU, Triton 3.6, Gluon."""
    if device.type != "cuda":
        return f"the Gluon decode attention runs on an sm_90 GPU (no interpreter), this cache is on {device}"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return (f"the Gluon decode attention needs an sm_90 GPU (wgmma, TMA, setmaxnreg), {device} is "
                f"sm_{cap[0]}{cap[1]}")
    try:
        import triton
    except ImportError as err:
        return f"the Gluon decode attention needs Triton {TRITON_SERIES} ({err})"
    if not triton.__version__.startswith(TRITON_SERIES):
        return (f"the Gluon decode attention is written against Triton {TRITON_SERIES}'s experimental Gluon API, "
                f"found Triton {triton.__version__}: install triton=={TRITON_SERIES}.* or use attention='kernels'")
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return f"triton {triton.__version__} has no triton.experimental.gluon"
    try:
        import trace_rl.kernels.paged_attention_gluon  # noqa: F401
    except Exception as err:  # noqa: BLE001 - whatever breaks the import is the reason
        return f"trace_rl.kernels.paged_attention_gluon does not import: {type(err).__name__}: {err}"
    return ""


def why_not(kv_format: str, block_size: int, head_dim: int, kv_heads: int, query_heads: int | None,
            device: torch.device, dtype: torch.dtype = torch.bfloat16) -> str:
    """Why attention='gluon' cannot run on this cache here ("" when it can): `refusal`, then `runtime_refusal`,
    then `dtype_refusal`, the first that says why (what `check` raises)."""
    return (refusal(kv_format, block_size, head_dim, kv_heads, query_heads)
            or runtime_refusal(torch.device(device)) or dtype_refusal(dtype))


def check(kv_format: str, block_size: int, head_dim: int, kv_heads: int, query_heads: int | None,
          device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
    """Raise (ValueError: the cache's shape; RuntimeError: the machine) where attention='gluon' cannot run."""
    why = refusal(kv_format, block_size, head_dim, kv_heads, query_heads)
    if why:
        raise ValueError(f"attention='gluon': {why}")
    why = runtime_refusal(torch.device(device))
    if why:
        raise RuntimeError(f"attention='gluon': {why}")
    why = dtype_refusal(dtype)
    if why:
        raise ValueError(f"attention='gluon': {why}")
