"""torchrl composition: our RL components chain in TensorDictSequential, and torchrl's own GRPOLoss
(through TransformersWrapper on an exported checkpoint) gives our GRPOLoss's value on our batches."""

import pytest
import torch
from tensordict.nn import TensorDictModuleBase, TensorDictSequential

from trace_rl.collectors.prompts import prompt_batch
from trace_rl.correction import Corrections, TokenMask
from trace_rl.data import GroupAdvantage
from trace_rl.data import schema as K
from trace_rl.data.torchrl_llm import TorchRLLLMLayout, left_pad, to_torchrl_llm
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine
from trace_rl.models import save_pretrained, tiny_model
from trace_rl.objectives import GRPOLoss, TrainerLogProbs


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    model, tok = tiny_model("tiny", seed=1)
    return model.eval(), tok


@pytest.fixture(scope="module")
def sampled(policy):
    return _rollout(*policy)


def _rollout(model, tok):
    engine = RecomputeEngine(model, tok.pad_token_id)
    prompts = prompt_batch([tok.encode(s) for s in ["12+3=", "7+905=", "1+1="]], pad_token_id=tok.pad_token_id)
    batch = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=5, seed=0))
    batch[K.REWARD] = torch.rand(batch.batch_size, generator=torch.Generator().manual_seed(1))
    batch[K.GROUP_ID] = batch[K.PROMPT_INDEX]
    # a rollout that disagrees with the trainer, so the correction masks some tokens
    noise = 0.2 * torch.randn(batch[K.LOGP_ROLLOUT].shape, generator=torch.Generator().manual_seed(2))
    batch[K.LOGP_ROLLOUT] = batch[K.LOGP_ROLLOUT] + noise * batch[K.MASK_RESPONSE]
    return batch


def test_components_are_tensordict_modules_and_compose(policy, sampled):
    model, tok = policy
    steps = [TrainerLogProbs(model, pad_token_id=tok.pad_token_id), Corrections([TokenMask(lo=0.85, hi=1.15)]),
             GroupAdvantage()]
    assert all(isinstance(m, TensorDictModuleBase) for m in steps)
    chain = TensorDictSequential(*steps)
    assert {K.LOGP_TRAINER, K.CORRECTION_MASK, K.ADVANTAGE} <= set(chain.out_keys)
    assert K.REWARD in chain.in_keys and K.LOGP_TRAINER not in chain.in_keys      # produced inside the chain
    one_by_one = sampled.clone()
    for step in steps:
        step(one_by_one)
    chained = chain(sampled.clone())
    for key in (K.LOGP_TRAINER, K.LOGP_OLD, K.CORRECTION_WEIGHT, K.CORRECTION_MASK, K.ADVANTAGE):
        assert torch.equal(chained[key], one_by_one[key]), key
    assert 0 < (~chained[K.CORRECTION_MASK] & chained[K.MASK_RESPONSE]).sum() < chained[K.MASK_RESPONSE].sum()


def test_left_pad():
    tokens = torch.tensor([[5, 6, 0], [7, 8, 9]])
    padded, mask = left_pad(tokens, torch.tensor([[1, 1, 0], [1, 1, 1]]), -1)
    assert padded.tolist() == [[-1, 5, 6], [7, 8, 9]] and mask.tolist() == [[False, True, True], [True] * 3]


@pytest.mark.parametrize("strategy", ["sft", "rlhf"])
def test_torchrl_grpo_loss_runs_on_our_batches(policy, sampled, tmp_path, strategy):
    transformers = pytest.importorskip("transformers")
    from torchrl.modules.llm import TransformersWrapper
    from torchrl.objectives.llm import GRPOLoss as TorchRLGRPOLoss

    model, tok = policy
    corrections = [TokenMask(lo=0.85, hi=1.15)] if strategy == "rlhf" else []   # rlhf reads the assistant mask
    batch = TensorDictSequential(TrainerLogProbs(model, pad_token_id=tok.pad_token_id), Corrections(corrections),
                                 GroupAdvantage())(sampled.clone())
    # an older policy, so ratios differ from 1 and the clip acts
    noise = 0.3 * torch.randn(batch[K.LOGP_OLD].shape, generator=torch.Generator().manual_seed(3))
    batch[K.LOGP_OLD] = batch[K.LOGP_OLD] + noise * batch[K.MASK_RESPONSE]
    ours = GRPOLoss(model, clip_epsilon=(0.2, 0.28), pad_token_id=tok.pad_token_id)(batch)
    assert ours["clip_fraction"] > 0

    save_pretrained(model, tok, tmp_path)            # the HF round trip: torchrl runs transformers' model
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    actor = TransformersWrapper(hf, tokenizer=hf_tok, input_mode="tokens", generate=False, pad_output=True,
                                pad_model_input=True)
    theirs = TorchRLGRPOLoss(actor, clip_epsilon=(0.2, 0.28), entropy_bonus=False, masking_strategy=strategy)
    torchrl_batch = TorchRLLLMLayout(pad_token_id=tok.pad_token_id)(batch)
    out = theirs(torchrl_batch)
    torch.testing.assert_close(out.loss_objective, ours["loss_objective"], rtol=1e-5, atol=1e-6)
    assert torch.equal(to_torchrl_llm(batch)[("tokens", "full")], torchrl_batch[("tokens", "full")])


def test_layout_needs_the_old_log_probs(sampled):
    with pytest.raises(KeyError, match="TrainerLogProbs"):
        to_torchrl_llm(sampled)
    assert ("log_probs", "full") in to_torchrl_llm(sampled, old_log_prob_key=K.LOGP_ROLLOUT).keys(True)
