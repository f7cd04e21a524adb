"""The plain PyTorch decode step every engine is judged against (DESIGN.md, "Performance model").

gpt-fast style, bf16, random weights of a model's shape: fused QKV and gate/up matmuls (cuBLAS), RMSNorm,
QK-norm (Qwen3), RoPE, a static KV cache [B, Hkv, L_max, D] per layer written at the new position, and
`scaled_dot_product_attention(enable_gqa=True)` over the first L positions; the lm_head gives logits. One
CUDA graph per context length L. No sampling: it is the forward of a decode step, nothing else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trace_rl.models.config import ModelConfig
from trace_rl.models.rope import apply_rope, inverse_frequencies, rope_cos_sin


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class PlainDecode:
    def __init__(self, config: ModelConfig, batch: int, max_len: int, device="cuda", dtype=torch.bfloat16,
                 seed: int = 0):
        c, self.c, self.batch, self.max_len = config, config, batch, max_len
        g = torch.Generator(device=device).manual_seed(seed)
        rnd = lambda *shape: (torch.randn(*shape, device=device, dtype=dtype, generator=g) * 0.02)  # noqa: E731
        hq, hkv, d, h = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
        self.layers = [dict(wqkv=rnd((hq + 2 * hkv) * d, h), wo=rnd(h, hq * d), w13=rnd(2 * c.intermediate_size, h),
                            w2=rnd(h, c.intermediate_size), n1=torch.ones(h, device=device, dtype=dtype),
                            n2=torch.ones(h, device=device, dtype=dtype),
                            qn=torch.ones(d, device=device, dtype=dtype), kn=torch.ones(d, device=device, dtype=dtype),
                            k=rnd(batch, hkv, max_len, d) * 50, v=rnd(batch, hkv, max_len, d) * 50)
                       for _ in range(c.num_layers)]
        self.embed = rnd(c.vocab_size, h)
        self.lm_head = self.embed if c.tie_word_embeddings else rnd(c.vocab_size, h)
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.inv_freq = inverse_frequencies(c, device)
        self.tokens = torch.randint(0, c.vocab_size, (batch, 1), device=device, generator=g)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sdpa_backend = "flash"   # forced, so a silent fallback to a slow SDPA kernel cannot flatter us

    @property
    def weight_bytes(self) -> int:
        per = sum(self.layers[0][n].nbytes for n in ("wqkv", "wo", "w13", "w2"))
        return per * len(self.layers) + self.lm_head.nbytes

    def kv_bytes_read(self, length: int) -> int:
        c = self.c
        return 2 * c.num_layers * self.batch * c.num_kv_heads * length * c.head_dim * self.embed.element_size()

    def step(self, length: int) -> torch.Tensor:
        """Logits [B, V] of the token at position length-1 (attends over positions 0..length-1)."""
        c = self.c
        hq, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
        b = self.batch
        pos = torch.full((b, 1), length - 1, device=self.tokens.device)
        x = F.embedding(self.tokens, self.embed)
        cos, sin = rope_cos_sin(pos, self.inv_freq, x.dtype)
        for lw in self.layers:
            q, k, v = (_rms(x, lw["n1"], c.rms_norm_eps) @ lw["wqkv"].T).split([hq * d, hkv * d, hkv * d], -1)
            q, k, v = q.view(b, 1, hq, d), k.view(b, 1, hkv, d), v.view(b, 1, hkv, d)
            if c.qk_norm:
                q, k = _rms(q, lw["qn"], c.rms_norm_eps), _rms(k, lw["kn"], c.rms_norm_eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            lw["k"][:, :, length - 1] = k[:, 0]
            lw["v"][:, :, length - 1] = v[:, 0]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), lw["k"][:, :, :length], lw["v"][:, :, :length],
                                               enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(b, 1, hq * d) @ lw["wo"].T
            gate, up = (_rms(x, lw["n2"], c.rms_norm_eps) @ lw["w13"].T).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ lw["w2"].T
        return (_rms(x, self.norm, c.rms_norm_eps) @ self.lm_head.T)[:, 0]

    def _step(self, length: int) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if self.sdpa_backend == "default":
            return self.step(length)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return self.step(length)

    def capture(self, length: int) -> None:
        try:
            self._step(length)
        except RuntimeError:                       # flash refused these shapes: let SDPA choose, and say so
            self.sdpa_backend = "default"
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(length)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        pool = next(iter(self.graphs.values()))[0].pool() if self.graphs else None
        with torch.cuda.graph(graph, pool=pool):
            out = self._step(length)
        self.graphs[length] = (graph, out)

    def replay(self, length: int) -> torch.Tensor:
        if length not in self.graphs:
            self.capture(length)
        graph, out = self.graphs[length]
        graph.replay()
        return out
