"""`sft_batch`: prompt + target (+ EOS), right-padded, loss mask exactly over the target."""

import pytest
import torch

from trace_rl.models.presets import char_tokenizer_for, preset
from trace_rl.tasks import ArithmeticTask
from trace_rl.tasks.sft import sft_batch, sft_loss, sft_step


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


def test_sft_loss_is_the_mean_over_masked_next_tokens():
    torch.manual_seed(0)
    tokens = torch.randint(0, 11, (3, 7))
    mask = torch.rand(3, 7) < 0.6
    mask[0, 3] = True                                        # at least one counted token
    logits = torch.randn(3, 6, 11, dtype=torch.bfloat16)
    terms = [-torch.log_softmax(logits[b, t].float(), -1)[tokens[b, t + 1]]
             for b in range(3) for t in range(6) if mask[b, t + 1]]
    expect = torch.stack(terms).mean()
    got = sft_loss(logits, tokens, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expect)


def test_sft_step_updates_with_clipped_gradients():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Embedding(13, 8), torch.nn.Linear(8, 13))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tokens, mask = torch.randint(0, 13, (4, 9)), torch.ones(4, 9, dtype=torch.bool)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        expect = sft_loss(model(tokens[:, :-1]), tokens, mask)          # the loss of the weights before the step
    loss, grad_norm = sft_step(model, opt, tokens, mask, clip=1e-3)
    torch.testing.assert_close(loss.detach(), expect)
    assert grad_norm > 1e-3                                  # the reported norm is the one before clipping
    moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    torch.testing.assert_close(moved, torch.tensor(0.5 * 1e-3), rtol=1e-3, atol=0)  # lr x clipped norm
