"""The plain PyTorch decode step every engine is judged against (DESIGN.md, "Performance model").

What a careful user writes without an engine (gpt-fast style, bf16): fused QKV and gate/up weights for
cuBLAS, RMSNorm, QK-norm (Qwen3), RoPE, a static contiguous KV cache [B, Hkv, L_max, D] per layer written
at the new position, `scaled_dot_product_attention(enable_gqa=True)` over the first L positions, the
lm_head. One CUDA graph per (context L, SDPA backend, variant). No sampling: the forward of a decode step.

SDPA backends: `default` (PyTorch's own choice), `cudnn`, `efficient`, `flash`; `sweep` times every one
that runs at a shape and keeps the fastest (reported with all timings), so the baseline is the best the
plain step can get, not the first backend that happens to run.

Memory: the baseline can run on the engine's own tensors (`from_rollout_model`: the same bf16 weights,
and its KV caches viewed over the engine cache's memory), so a shape that fills the GPU for one fills it
for the other and both fit in turn.

Variants (`run(length, backend, variant)`):
- `eager`: the layer's torch ops as written (RMSNorm, q/k-norm, RoPE and the cache append are dozens of
  small kernels per layer), under the CUDA graph;
- `compiled`: the same two per-layer functions (`attention_in`: residual add + RMSNorm, QKV matmul,
  q/k-norm, RoPE, cache append; `attention_out_mlp`: o_proj, residual add + RMSNorm, gate/up matmul,
  SiLU*mul, down matmul) through `torch.compile` (Inductor's default mode: the matmuls stay cuBLAS calls,
  the elementwise ops between them fuse into a few Triton kernels), SDPA between them in eager so the
  backend sweep still applies, the whole step then captured in our own CUDA graph. What a careful user
  writes. One compile serves every layer, context and B > 1 (the batch and cache-length axes are marked
  dynamic; B = 1 is specialised by torch): at most two compiles per function in a bench, timed
  (`compile_s`). Compiling the whole step instead (fullgraph over 36 layers,
  or `max-autotune` GEMM templates per shape) costs minutes of compile per shape for the same fusion.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from trace_rl.models.config import ModelConfig
from trace_rl.models.rope import apply_rope, inverse_frequencies, rope_cos_sin

BACKENDS = ("default", "cudnn", "efficient", "flash")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def attention_in(x, delta, n1, wqkv, qn, kn, cos, sin, k_cache, v_cache, pos, hq: int, hkv: int, d: int,
                 eps: float):
    """x + delta (the previous layer's MLP output) -> (x, q [B, Hq, 1, D]); K/V of the new token, normed
    and rotated, written into the caches [B, Hkv, L_max, D] at `pos` (a [1] long tensor)."""
    b = x.shape[0]
    x = x + delta
    q, k, v = (_rms(x, n1, eps) @ wqkv.T).split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = q.view(b, 1, hq, d), k.view(b, 1, hkv, d), v.view(b, 1, hkv, d)
    if qn is not None:
        q, k = _rms(q, qn, eps), _rms(k, kn, eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache.index_copy_(2, pos, k.transpose(1, 2))
    v_cache.index_copy_(2, pos, v.transpose(1, 2))
    return x, q.transpose(1, 2)


def attention_out_mlp(x, o, wo, n2, w13, w2, eps: float):
    """(x, attention output [B, Hq, 1, D]) -> (x + o_proj, the MLP's output); the caller adds the latter."""
    b = x.shape[0]
    x = x + o.transpose(1, 2).reshape(b, 1, -1) @ wo.T
    gate, up = (_rms(x, n2, eps) @ w13.T).chunk(2, -1)
    return x, (F.silu(gate) * up) @ w2.T


VARIANTS = ("eager", "compiled")
_COMPILED: dict[str, object] = {}


def layer_functions(variant: str):
    """(attention_in, attention_out_mlp) as written (`eager`) or through `torch.compile` (`compiled`, built
    once per process and shared by every PlainDecode, so a bench compiles each function at most twice)."""
    if variant == "eager":
        return attention_in, attention_out_mlp
    if variant != "compiled":
        raise ValueError(f"unknown plain-step variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if not _COMPILED:
        _COMPILED["in"] = torch.compile(attention_in)
        _COMPILED["out"] = torch.compile(attention_out_mlp)
    return _COMPILED["in"], _COMPILED["out"]


def _mark_batch(t: torch.Tensor) -> None:
    torch._dynamo.mark_dynamic(t, 0)


def _sdpa_context(backend: str):
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "default":
        return nullcontext()
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION}[backend])


class PlainDecode:
    def __init__(self, config: ModelConfig, batch: int, max_len: int, layers: list[dict], embed: torch.Tensor,
                 lm_head: torch.Tensor, norm: torch.Tensor, device="cuda"):
        """`layers`: per layer dict(wqkv, wo, w13, w2, n1, n2, qn, kn, k, v) with k/v [B, Hkv, max_len, D]."""
        self.c, self.batch, self.max_len = config, batch, max_len
        self.layers, self.embed, self.lm_head, self.norm = layers, embed, lm_head, norm
        self.device = torch.device(device)
        self.inv_freq = inverse_frequencies(config, self.device)
        g = torch.Generator(device=self.device).manual_seed(batch)
        self.tokens = torch.randint(4, min(1000, config.vocab_size), (batch, 1), device=self.device, generator=g)
        self.graphs: dict[tuple[int, str, str], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.compile_s: float | None = None          # first call of the compiled variant (compile included)
        self._marked = False

    @classmethod
    def random(cls, config: ModelConfig, batch: int, max_len: int, device="cuda", dtype=torch.bfloat16, seed=0):
        g = torch.Generator(device=device).manual_seed(seed)
        rnd = lambda *shape: (torch.randn(*shape, device=device, dtype=dtype, generator=g) * 0.02)  # noqa: E731
        ones = lambda n: torch.ones(n, device=device, dtype=dtype)  # noqa: E731
        c = config
        hq, hkv, d, h = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
        layers = [dict(wqkv=rnd((hq + 2 * hkv) * d, h), wo=rnd(h, hq * d), w13=rnd(2 * c.intermediate_size, h),
                       w2=rnd(h, c.intermediate_size), n1=ones(h), n2=ones(h), qn=ones(d), kn=ones(d),
                       k=rnd(batch, hkv, max_len, d) * 50, v=rnd(batch, hkv, max_len, d) * 50)
                  for _ in range(c.num_layers)]
        embed = rnd(c.vocab_size, h)
        return cls(c, batch, max_len, layers, embed, embed if c.tie_word_embeddings else rnd(c.vocab_size, h),
                   ones(h), device)

    @classmethod
    def from_rollout_model(cls, model, cache, batch: int, max_len: int):
        """The same bf16 weights as a (fused, bf16) rollout model, and K/V caches [B, Hkv, max_len, D] viewed
        over the memory of the engine's `PagedKVCache` (its random contents; no copy)."""
        c = model.config
        layers = []
        for i, layer in enumerate(model.model.layers):
            a, m = layer.self_attn, layer.mlp
            if a.qkv_proj is None or m.gate_up_proj is None or a.qkv_proj.quant.weight_fmt != "bf16":
                raise ValueError("the plain step needs a bf16 rollout model with fused qkv and gate/up")
            kv = []
            for t in (cache.k[i].codes, cache.v[i].codes):
                need = batch * c.num_kv_heads * max_len * c.head_dim
                if t.numel() < need:
                    raise ValueError(f"the engine cache ({t.numel()} values per layer) is smaller than "
                                     f"B={batch} x L={max_len}")
                kv.append(t.view(-1)[:need].view(batch, c.num_kv_heads, max_len, c.head_dim))
            qn = a.q_norm.weight if a.q_norm is not None else None
            kn = a.k_norm.weight if a.k_norm is not None else None
            layers.append(dict(wqkv=a.qkv_proj.quant.weight, wo=a.o_proj.quant.weight, w13=m.gate_up_proj.quant.weight,
                               w2=m.down_proj.quant.weight, n1=layer.input_layernorm.weight,
                               n2=layer.post_attention_layernorm.weight, qn=qn, kn=kn, k=kv[0], v=kv[1]))
        return cls(c, batch, max_len, layers, model.model.embed_tokens.weight, model.lm_head.quant.weight,
                   model.model.norm.weight, model.model.embed_tokens.weight.device)

    @property
    def weight_bytes(self) -> int:
        per = sum(self.layers[0][n].nbytes for n in ("wqkv", "wo", "w13", "w2"))
        return per * len(self.layers) + self.lm_head.nbytes

    def kv_bytes_read(self, length: int) -> int:
        c = self.c
        return 2 * c.num_layers * self.batch * c.num_kv_heads * length * c.head_dim * self.embed.element_size()

    def step(self, length: int, variant: str = "eager") -> torch.Tensor:
        """Logits [B, V] of the token at position length-1 (attends over positions 0..length-1)."""
        c = self.c
        fn_in, fn_out = layer_functions(variant)
        b = self.batch
        # compiled: one compile for every B > 1 and every cache length (batches of a bench differ in both);
        # marking is free and only matters at the call that compiles (B = 1 is always specialised by torch)
        dynamic = (lambda *ts: [_mark_batch(t) for t in ts]) if variant == "compiled" and b > 1 else None
        if variant == "compiled" and not self._marked:
            for lw in self.layers:
                for t in (lw["k"], lw["v"]):
                    torch._dynamo.mark_dynamic(t, 2)
                    if b > 1:
                        torch._dynamo.mark_dynamic(t, 0)
            self._marked = True
        pos = torch.full((1,), length - 1, device=self.device, dtype=torch.long)
        x = F.embedding(self.tokens, self.embed)
        delta = torch.zeros_like(x)
        cos, sin = rope_cos_sin(pos.expand(b, 1), self.inv_freq, x.dtype)
        for lw in self.layers:
            if dynamic:
                dynamic(x, delta, cos, sin)
            x, q = fn_in(x, delta, lw["n1"], lw["wqkv"], lw["qn"] if c.qk_norm else None,
                         lw["kn"] if c.qk_norm else None, cos, sin, lw["k"], lw["v"], pos, c.num_heads,
                         c.num_kv_heads, c.head_dim, c.rms_norm_eps)
            o = F.scaled_dot_product_attention(q, lw["k"][:, :, :length], lw["v"][:, :, :length], enable_gqa=True)
            if dynamic:
                dynamic(x, o)
            x, delta = fn_out(x, o, lw["wo"], lw["n2"], lw["w13"], lw["w2"], c.rms_norm_eps)
        return (_rms(x + delta, self.norm, c.rms_norm_eps) @ self.lm_head.T)[:, 0]

    def run(self, length: int, backend: str = "default", variant: str = "eager") -> torch.Tensor:
        """One decode forward with the given SDPA backend and variant (a captured graph on GPU, the plain
        call on CPU). The first call of the `compiled` variant compiles (timed into `compile_s`)."""
        if self.device.type != "cuda":
            with _sdpa_context(backend):
                return self._first(variant, lambda: self.step(length, variant))
        key = (length, backend, variant)
        if key not in self.graphs:
            with _sdpa_context(backend):
                self._first(variant, lambda: self.step(length, variant))   # raises here if the backend refuses
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.step(length, variant)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    out = self.step(length, variant)
            self.pool = graph.pool()
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _first(self, variant: str, fn):
        """Call fn; the compiled variant's first call per batch is timed (it compiles or loads the compile)."""
        if variant != "compiled" or self.compile_s is not None:
            return fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t
        return out

    def sweep(self, length: int, time_ms, backends=BACKENDS, variant: str = "eager") -> dict:
        """Time every SDPA backend at this context (`time_ms(fn) -> ms`); the fastest is the baseline."""
        times, errors = {}, {}
        for backend in backends:
            try:
                times[backend] = time_ms(lambda b=backend: self.run(length, b, variant))
            except Exception as err:           # this backend does not run at this shape: recorded, skipped
                errors[backend] = f"{type(err).__name__}: {str(err)[:200]}"
        if not times:
            raise RuntimeError(f"no SDPA backend ran at L={length} ({variant}): {errors}")
        best = min(times, key=times.get)
        return {"ms": times[best], "backend": best, "backend_ms": times, "backend_errors": errors}

    def release_graphs(self) -> None:
        self.graphs.clear()
        self.pool = None
