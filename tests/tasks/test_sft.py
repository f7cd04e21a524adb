"""`sft_batch`: prompt + target (+ EOS), right-padded, loss mask exactly over the target."""

import pytest
import torch

from trace_rl.models.presets import char_tokenizer_for, preset
from trace_rl.tasks import ArithmeticTask
from trace_rl.tasks.sft import sft_batch


@pytest.mark.parametrize("eos", [False, True])
def test_rows_padding_and_mask(eos):
    task = ArithmeticTask()
    tok = char_tokenizer_for(preset("tiny"))
    problems = task.problems(5, 3, "train")
    tokens, mask = sft_batch(task, tok, problems, eos=eos)
    assert tokens.dtype == torch.long and mask.dtype == torch.bool and tokens.shape == mask.shape
    for i, p in enumerate(problems):
        prompt, target = tok.encode(p.prompt), tok.encode(task.sft_target(p)) + ([tok.eos_token_id] if eos else [])
        row = prompt + target
        assert tokens[i, :len(row)].tolist() == row
        assert (tokens[i, len(row):] == tok.pad_token_id).all()
        assert mask[i].nonzero().flatten().tolist() == list(range(len(prompt), len(row)))
