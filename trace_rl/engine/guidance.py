"""`GuidanceRecorder`: the native engine's side of TRACE guided rounding.

For the plan's guided layers (`PrecisionPlan.guided_layers`: "all", "deeper_half" or a glob over Linear
names) it records, for every token the rollout runs through them — prompt tokens in prefill, each fed
response token in decode — the FP4 quantization of the layer's input (block scales, global scale, one
mantissa bit per element; see `trace_rl.correction.guided`). With an FP4 KV cache it records K and V of
every layer too. `result` lays the records out per output row and position exactly as the trainer packs
[prompt, response] (`trace_rl.data.padding.pack_full`), under ("guidance", <site>, ...), with
("guidance", "valid") marking recorded positions (the last response token is never fed, so it has none;
causality means the trainer never needs it).

Recording runs eagerly (hooks cannot record inside a captured CUDA graph): an engine that records does
not use CUDA graphs. Memory per token: `bytes_per_token`.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
from tensordict import TensorDict

from trace_rl.correction.guided import GUIDED_FORMATS, record_guidance
from trace_rl.formats import per_token


def select_guided_layers(names: list[str], spec: str, num_layers: int) -> list[str]:
    if spec == "all":
        return names
    if spec == "deeper_half":
        return [n for n in names if _layer_index(n) is not None and _layer_index(n) >= num_layers // 2]
    return [n for n in names if fnmatchcase(n, spec)]


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def site_key(name: str) -> str:
    return name.replace(".", "/")


class GuidanceRecorder:
    def __init__(self, model, plan):
        self.model = model
        self.sites: dict[str, tuple[str, object]] = {}      # site key -> (format, module)
        self.trainer_sites: dict[str, str] = {}             # trainer module name (+ .k/.v) -> site key
        linears = {n: m for n, m in model.linears().items() if per_token(m.act_fmt) in GUIDED_FORMATS}
        chosen = select_guided_layers(list(linears), plan.guided_layers, model.config.num_layers)
        for name in chosen:
            lin = linears[name]
            key = site_key(name)
            self.sites[key] = (per_token(lin.act_fmt), lin)
            for trainer_name in (lin.fused_from or (name,)):
                self.trainer_sites[trainer_name] = key
        kv_fmt = per_token(plan.kv_cache)
        if kv_fmt in GUIDED_FORMATS:
            for layer in model.model.layers:
                attn = layer.self_attn
                attn_name = f"model.layers.{attn.layer_idx}.self_attn"
                if plan.guided_layers == "deeper_half" and attn.layer_idx < model.config.num_layers // 2:
                    continue
                for which in "kv":
                    key = site_key(f"{attn_name}.{which}")
                    self.sites[key] = (kv_fmt, attn)
                    self.trainer_sites[f"{attn_name}.{which}"] = key
        self.context = None
        self.prompt_buf: dict[str, dict] = {}
        self.resp_buf: dict[str, dict] = {}
        self.bytes_per_token = 0

    # -- hooks --
    def attach(self) -> None:
        for key, (fmt, module) in self.sites.items():
            if key.endswith("/k") or key.endswith("/v"):
                module.kv_hook = self._kv_hook
            else:
                module.activation_hook = lambda layer, x, key=key, fmt=fmt: self._store(key, fmt, x)

    def _kv_hook(self, attn, k, v) -> None:
        base = site_key(f"model.layers.{attn.layer_idx}.self_attn")
        for which, t in (("k", k), ("v", v)):
            key = f"{base}/{which}"
            if key in self.sites:
                self._store(key, self.sites[key][0], t)

    def begin(self, num_prompts: int, prompt_width: int, rows: int, max_new: int) -> None:
        self.prompt_buf, self.resp_buf, self._shapes = {}, {}, (num_prompts, prompt_width, rows + 1, max_new)
        self.bytes_per_token = 0

    def _alloc(self, key, rec) -> None:
        p, w, r, m = self._shapes
        make = lambda lead, t: None if t is None else torch.zeros(*lead, *t.shape[2:], dtype=t.dtype,  # noqa
                                                                  device=t.device)
        self.prompt_buf[key] = {n: make((p, w), t) for n, t in self._fields(rec)}
        self.resp_buf[key] = {n: make((r, m), t) for n, t in self._fields(rec)}
        self.bytes_per_token += sum(t[0, 0].numel() * t.element_size() for _, t in self._fields(rec)
                                    if t is not None)

    @staticmethod
    def _fields(rec):
        return (("scales", rec.scales), ("global_scale", rec.global_scale), ("bits", rec.bits))

    def _store(self, key: str, fmt: str, x: torch.Tensor) -> None:
        if self.context is None:
            return
        rec = record_guidance(x.detach(), fmt)                  # [B, T, ...] rows as the layer saw them
        if key not in self.prompt_buf:
            self._alloc(key, rec)
        kind, a, b = self.context
        for name, t in self._fields(rec):
            if t is None:
                continue
            if kind == "prefill":                               # a: prompt indices [P]; rows [P, width]
                self.prompt_buf[key][name][a, : t.shape[1]] = t
            else:                                               # a: output rows [n]; b: response index [n]
                self.resp_buf[key][name][a, b] = t[:, 0]

    # -- assembly: [rows, prompt width + response width] as pack_full lays tokens out --
    def result(self, prompt_index, prompt_lens, ngen, prompt_width: int, resp_width: int) -> TensorDict:
        rows = prompt_index.shape[0]
        dev = prompt_index.device
        width = prompt_width + resp_width
        t = torch.arange(width, device=dev)[None, :]
        plen = prompt_lens[prompt_index][:, None]
        in_prompt = t < plen
        resp_pos = t - plen
        in_resp = (~in_prompt) & (resp_pos < (ngen[:, None] - 1))
        valid = in_prompt | in_resp
        prow = prompt_index[:, None].expand(rows, width)
        pcol = t.clamp(max=self._shapes[1] - 1).expand(rows, width)
        rrow = torch.arange(rows, device=dev)[:, None].expand(rows, width)
        rcol = resp_pos.clamp(0, self._shapes[3] - 1)
        out = {}
        for key in self.prompt_buf:
            site = {}
            for name, pbuf in self.prompt_buf[key].items():
                if pbuf is None:
                    continue
                a, b = pbuf[prow, pcol], self.resp_buf[key][name][rrow, rcol]
                shape = (*valid.shape, *([1] * (a.dim() - 2)))
                site[name] = torch.where(in_prompt.view(shape), a, torch.where(in_resp.view(shape), b, 0))
            out[key] = site
        td = TensorDict(out, batch_size=[rows])
        td.set("valid", valid)
        return td
