"""Padding helpers for the trajectory schema: pad, unpad, pack prompt+response, densify, trim, move.

Conventions (see `trace_rl.data.schema`): prompts and responses are right-padded; a boolean mask says
which positions are real. Padding values: the pad token id for token ids, False for masks, 0 for
everything else (log-probs, weights) — padded positions are never read without their mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from tensordict import LazyStackedTensorDict, NestedKey, TensorDict, TensorDictBase
from tensordict.base import _is_leaf_nontensor

from trace_rl.data import schema as K


def pad_value_for(key: NestedKey, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT) -> int | float | bool:
    """The value padding positions of `key` hold: pad id for ("tokens", *), False for ("masks", *), else 0."""
    head = key[0] if isinstance(key, tuple) else key
    if head == "tokens":
        return pad_token_id
    if head == "masks" or key == K.CORRECTION_MASK:
        return False
    return 0


def pad_right(
    seqs: Sequence[torch.Tensor], pad_value: int | float | bool = 0, width: int | None = None,
    pin_memory: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D (or [L, ...]) tensors of different lengths into [B, W, ...] right-padded, plus a [B, W] mask.

    `width` defaults to the longest sequence; a sequence longer than `width` is an error. `pin_memory`: the
    stacked tensor in pinned host memory (CPU sequences; e.g. guided records, whose GPU copies stay async).
    Each position is written once (values, then the row's padding), which matters for large stacks.
    """
    if not seqs:
        raise ValueError("pad_right needs at least one sequence")
    lengths = [s.shape[0] for s in seqs]
    width = max(lengths) if width is None else width
    if max(lengths) > width:
        raise ValueError(f"a sequence of length {max(lengths)} does not fit width {width}")
    first = seqs[0]
    out = torch.empty((len(seqs), width, *first.shape[1:]), dtype=first.dtype, device=first.device,
                      pin_memory=pin_memory)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool, device=first.device)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
        out[i, s.shape[0]:] = pad_value
        mask[i, : s.shape[0]] = True
    return out, mask


def unpad(padded: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of `pad_right`: the real positions of each row (the mask may have holes; order is kept)."""
    return [row[m] for row, m in zip(padded, mask.bool())]


def pack_full(
    prompt_tokens: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_tokens: torch.Tensor,
    response_mask: torch.Tensor,
    pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack each row as [its real prompt tokens, its real response tokens, padding].

    Returns (full tokens [B, Lp+Lr], full mask, prompt lengths [B]). Response token t of row b sits at
    position `prompt_len[b] + t` when the response mask is a prefix (as engines write it); a causal model
    run on the packed row sees no padding before any real token, so no attention mask is needed.
    """
    prompt_mask, response_mask = prompt_mask.bool(), response_mask.bool()
    tokens = torch.cat([prompt_tokens, response_tokens], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    # stable sort of "is padding" moves real tokens to the front, keeping their order
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    full_mask = mask.gather(1, order)
    full = torch.where(full_mask, tokens.gather(1, order), pad_token_id)
    return full, full_mask, prompt_mask.sum(1)


def full_sequence(td: TensorDictBase, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT) -> TensorDictBase:
    """Write ("tokens", "full") and ("masks", "full") (see `pack_full`) into `td` and return it."""
    full, mask, _ = pack_full(
        td.get(K.TOKENS_PROMPT), td.get(K.MASK_PROMPT), td.get(K.TOKENS_RESPONSE), td.get(K.MASK_RESPONSE),
        pad_token_id,
    )
    td.set(K.TOKENS_FULL, full)
    td.set(K.MASK_FULL, mask)
    return td


def densify(td: TensorDictBase, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT) -> TensorDict:
    """A dense TensorDict from a (possibly ragged) lazy stack, e.g. a `LazyStackStorage` sample.

    Entries whose rows have different lengths (responses of batches generated with different widths) are
    right-padded to the longest with `pad_value_for(key)`. Non-tensor entries are kept as they are. Entries
    held in pinned host memory (a guided rollout's records) are stacked into pinned memory, so that their
    copies to the GPU stay asynchronous.
    """
    if not isinstance(td, LazyStackedTensorDict):
        return td
    out = TensorDict(batch_size=td.batch_size, device=td.device)
    for key in td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf_nontensor):
        first = td.tensordicts[0].get(key) if td.tensordicts and td.stack_dim == 0 else None
        if isinstance(first, torch.Tensor) and first.device.type == "cpu" and first.is_pinned():
            value = pad_right([row.get(key) for row in td.tensordicts], pad_value_for(key, pad_token_id),
                              pin_memory=True)[0]
        else:
            try:
                value = td.get(key)
            except RuntimeError:  # rows of different shapes cannot be stacked as they are
                value = td.get(key, as_padded_tensor=True, padding_value=pad_value_for(key, pad_token_id))
        out.set(key, value)
    return out


def trim_response(
    td: TensorDictBase, keys: Iterable[NestedKey] = K.RESPONSE_ALIGNED_KEYS
) -> TensorDictBase:
    """Cut response-aligned entries to the longest real response (drops all-padding columns).

    Returns a new TensorDict sharing storage with `td`. Costs one host sync (the new width).
    """
    mask = td.get(K.MASK_RESPONSE).bool()
    real = mask.any(0)
    width = int(real.nonzero().max()) + 1 if bool(real.any()) else 0
    out = td.copy()
    present = set(td.keys(include_nested=True))
    for key in keys:
        if key in present:
            out.set(key, td.get(key)[:, :width], inplace=False)
    return out


def to_device(td: TensorDictBase, device: torch.device | str, non_blocking: bool = True) -> TensorDictBase:
    """Move a batch to `device`. Host -> GPU copies are asynchronous when `non_blocking` (pinned first)."""
    device = torch.device(device)
    if device.type == "cuda" and td.device is not None and td.device.type == "cpu":
        td = td.pin_memory()
    return td.to(device, non_blocking=non_blocking)
