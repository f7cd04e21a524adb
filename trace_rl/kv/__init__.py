"""The rollout's KV cache, below models/ and engine/: `PagedKVCache` (every layer's K/V pages in the plan's
KV format), `KVStep` (what one forward writes and reads; the object the model's attention calls), and the
torch decode-attention paths over paged caches (`trace_rl.kv.decode_attention`), and `causal_attention`
(the trainer's attention and prefill's, `trace_rl.kv.causal`).

Arrows point down: engine/ builds caches and steps, models/ calls `kv.attend(...)`, kernels/ and formats/
provide the kernels and the page layout. Nothing here imports models/ or engine/."""

from trace_rl.kv.cache import KVStep, PagedKVCache
from trace_rl.kv.causal import causal_attention

__all__ = ["KVStep", "PagedKVCache", "causal_attention"]
