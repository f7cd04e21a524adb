"""Padding helpers: pad/unpad round trip, packing prompt+response, densify ragged stacks, trim, devices."""

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from trace_rl.data import schema as K
from trace_rl.data.padding import (
    densify,
    full_sequence,
    pack_full,
    pad_right,
    pad_value_for,
    to_device,
    trim_response,
    unpad,
)


def test_pad_right_and_unpad_round_trip():
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([], dtype=torch.long)]
    padded, mask = pad_right(seqs, pad_value=9)
    assert padded.tolist() == [[1, 2, 3], [4, 9, 9], [9, 9, 9]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    back = unpad(padded, mask)
    assert [b.tolist() for b in back] == [[1, 2, 3], [4], []]
    padded, _ = pad_right(seqs, width=5)
    assert padded.shape == (3, 5)


def test_pad_values_by_key():
    assert pad_value_for(K.TOKENS_RESPONSE, 7) == 7
    assert pad_value_for(K.MASK_PROMPT) is False
    assert pad_value_for(K.CORRECTION_MASK) is False
    assert pad_value_for(K.LOGP_ROLLOUT) == 0


def test_pack_full_puts_response_right_after_each_prompt():
    pt = torch.tensor([[5, 6, 0], [7, 0, 0]])
    pm = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    rt = torch.tensor([[1, 2], [3, 0]])
    rm = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    full, mask, plen = pack_full(pt, pm, rt, rm, pad_token_id=0)
    assert full.tolist() == [[5, 6, 1, 2, 0], [7, 3, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert plen.tolist() == [2, 1]
    td = TensorDict({K.TOKENS_PROMPT: pt, K.MASK_PROMPT: pm, K.TOKENS_RESPONSE: rt, K.MASK_RESPONSE: rm}, [2])
    full_sequence(td)
    assert torch.equal(td[K.TOKENS_FULL], full) and torch.equal(td[K.MASK_FULL], mask)


def _batch(width: int, rows: int, start: float) -> TensorDict:
    mask = torch.ones(rows, width, dtype=torch.bool)
    mask[0, width - 1] = False
    return TensorDict(
        {K.TOKENS_RESPONSE: torch.arange(rows * width).view(rows, width) + 1, K.MASK_RESPONSE: mask,
         K.LOGP_ROLLOUT: torch.full((rows, width), start), K.REWARD: torch.arange(rows).float()},
        batch_size=[rows],
    )


def test_densify_pads_ragged_rows_with_key_specific_values():
    a, b = _batch(2, 2, -1.0), _batch(4, 1, -2.0)
    stacked = LazyStackedTensorDict.lazy_stack([*a.unbind(0), *b.unbind(0)])
    dense = densify(stacked, pad_token_id=0)
    assert dense[K.TOKENS_RESPONSE].tolist() == [[1, 2, 0, 0], [3, 4, 0, 0], [1, 2, 3, 4]]
    expected_mask = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert dense[K.MASK_RESPONSE].tolist() == [[bool(v) for v in r] for r in expected_mask]
    assert dense[K.LOGP_ROLLOUT][0].tolist() == [-1.0, -1.0, 0.0, 0.0]
    assert dense[K.REWARD].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.gpu
def test_densify_keeps_pinned_entries_pinned():
    """A guided rollout's records sit in pinned host memory beside GPU tensors: densify stacks them into
    pinned memory (ragged rows padded as the other keys are), so the trainer's copies stay asynchronous."""
    a, b = _batch(2, 2, -1.0).to("cuda"), _batch(4, 1, -2.0).to("cuda")
    for td in (a, b):
        td.clear_device_()
        width = td.get(K.TOKENS_RESPONSE).shape[1]
        td.set(K.GUIDANCE_BYTES, torch.arange(td.batch_size[0] * width * 3, dtype=torch.uint8)
               .view(-1, width, 3).pin_memory())
    stacked = LazyStackedTensorDict.lazy_stack([*a.unbind(0), *b.unbind(0)])
    dense = densify(stacked, pad_token_id=0)
    records = dense[K.GUIDANCE_BYTES]
    assert records.is_pinned() and records.shape == (3, 4, 3)
    assert torch.equal(records, stacked.get(K.GUIDANCE_BYTES, as_padded_tensor=True, padding_value=0))
    assert dense[K.TOKENS_RESPONSE].is_cuda


def test_trim_response_drops_all_padding_columns():
    td = _batch(5, 2, -1.0)
    td[K.MASK_RESPONSE][:, 3:] = False
    trimmed = trim_response(td)
    assert trimmed[K.TOKENS_RESPONSE].shape == (2, 3)
    assert trimmed[K.LOGP_ROLLOUT].shape == (2, 3)
    assert td[K.TOKENS_RESPONSE].shape == (2, 5)  # the input is left alone


def test_to_device_cpu_round_trip():
    td = _batch(3, 2, 0.5)
    moved = to_device(td, "cpu")
    assert moved.device == torch.device("cpu")
    assert (moved == td).all()
