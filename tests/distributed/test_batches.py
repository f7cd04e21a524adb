"""Splitting prompts across workers and merging their results (no Ray: the workers' engines run here)."""

import pytest
import torch
from tensordict import TensorDict

from tests.engine.native_helpers import random_prompts
from trace_rl.correction.guided import guided_trainer
from trace_rl.data import schema as K
from trace_rl.distributed.batches import merge_results, split_prompts, worker_seed
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models.presets import tiny_model
from trace_rl.objectives.logprobs import response_log_probs
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("num,workers", [(7, 2), (5, 3), (2, 4), (1, 1)])
def test_split_prompts_into_contiguous_trimmed_chunks(num, workers, rng):
    lengths = torch.randint(1, 9, (num,), generator=rng).tolist()
    prompts = random_prompts(lengths, rng)
    chunks = split_prompts(prompts, workers)
    assert len(chunks) == min(num, workers)
    sizes = [c.batch_size[0] for _, c in chunks]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == num
    assert [first for first, _ in chunks] == [sum(sizes[:i]) for i in range(len(sizes))]
    for first, chunk in chunks:
        rows = slice(first, first + chunk.batch_size[0])
        width = max(lengths[rows])
        assert chunk.get(K.TOKENS_PROMPT).shape[1] == width            # all-padding columns dropped
        assert torch.equal(chunk.get(K.TOKENS_PROMPT), prompts.get(K.TOKENS_PROMPT)[rows, :width])


def test_worker_seeds_are_distinct_and_worker_zero_keeps_the_seed():
    seeds = [worker_seed(123, w) for w in range(8)]
    assert seeds[0] == 123 and len(set(seeds)) == 8
    assert worker_seed(None, 3) is None


def test_merged_guided_chunks_reproduce_rollout_log_probs(rng):
    """Two engines answer two chunks (different response widths); the merged batch keeps rows, prompt
    indices and the TRACE records at the trainer's packed positions: the guided trainer reproduces the
    rollout's log-probs (atol 1e-5, as for one engine in tests/engine/test_guidance.py)."""
    plan = PrecisionPlan.preset("fp4-guided")
    base, tok = tiny_model("tiny", seed=int(torch.randint(0, 1000, (), generator=rng)))
    prompts = random_prompts(torch.randint(2, 9, (5,), generator=rng).tolist(), rng)
    sampling = SamplingParams(n=2, max_new_tokens=int(torch.randint(4, 9, (), generator=rng)),
                              seed=int(torch.randint(0, 2**31, (), generator=rng)), stop_token_ids=(40, 41, 42))
    parts, sites = [], None
    for w, (first, chunk) in enumerate(split_prompts(prompts, 2)):
        engine = NativeEngine(base, plan, max_batch=8, max_seq_len=24, pad_token_id=tok.pad_token_id,
                              record_guidance=True)
        sites = engine.guidance_sites
        seeded = sampling.model_copy(update={"seed": worker_seed(sampling.seed, w)})
        parts.append((first, engine.generate(chunk, seeded)))
    merged = merge_results(parts, prompts, tok.pad_token_id)
    rows = prompts.batch_size[0] * sampling.n
    assert merged.batch_size[0] == rows
    assert torch.equal(merged.get(K.PROMPT_INDEX), torch.arange(prompts.batch_size[0]).repeat_interleave(2))
    width = prompts.get(K.TOKENS_PROMPT).shape[1] + merged.get(K.TOKENS_RESPONSE).shape[1]
    assert merged.get(("guidance", "valid")).shape == (rows, width)
    valid = merged.get(("guidance", "valid"))
    assert torch.equal(valid.sum(1), merged.get(K.MASK_PROMPT).sum(1) + merged.get(K.NUM_GENERATED) - 1)
    trainer, _ = tiny_model("tiny", seed=0)
    trainer.load_state_dict(base.state_dict())
    trainer.apply_plan(plan)
    args = [merged.get(k) for k in (K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE)]
    with torch.no_grad(), guided_trainer(trainer, merged, sites):
        lp, _ = response_log_probs(trainer, *args, pad_token_id=tok.pad_token_id)
    torch.testing.assert_close(lp, merged.get(K.LOGP_ROLLOUT), rtol=0, atol=1e-5)


def test_merge_refuses_a_key_it_cannot_align():
    def part(width):
        return TensorDict({K.TOKENS_RESPONSE: torch.zeros(2, 3, dtype=torch.long),
                           K.MASK_RESPONSE: torch.ones(2, 3, dtype=torch.bool),
                           K.PROMPT_INDEX: torch.tensor([0, 0]), "odd": torch.zeros(2, width)}, batch_size=[2])

    prompts = random_prompts([2, 3], torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="odd"):
        merge_results([(0, part(4)), (1, part(5))], prompts)


def test_merged_moe_chunks_carry_routing_records_to_the_trainer(rng):
    """Two MoE engines (float64, bf16 plan) answer two chunks; the merged routing records sit at the
    trainer's packed positions: they equal the trainer's own top-k wherever they are valid."""
    from trace_rl.objectives import TrainerLogProbs

    base, tok = tiny_model("tiny-moe", seed=2, dtype=torch.float64)
    prompts = random_prompts(torch.randint(2, 9, (5,), generator=rng).tolist(), rng)
    sampling = SamplingParams(n=2, max_new_tokens=int(torch.randint(4, 9, (), generator=rng)),
                              seed=int(torch.randint(0, 2**31, (), generator=rng)), stop_token_ids=(40, 41, 42))
    parts = []
    for w, (first, chunk) in enumerate(split_prompts(prompts, 2)):
        engine = NativeEngine(base, max_batch=8, max_seq_len=24, pad_token_id=tok.pad_token_id)
        parts.append((first, engine.generate(chunk, sampling.model_copy(update={"seed": worker_seed(7, w)}))))
    merged = merge_results(parts, prompts, tok.pad_token_id)
    width = prompts.get(K.TOKENS_PROMPT).shape[1] + merged.get(K.TOKENS_RESPONSE).shape[1]
    valid = merged.get(K.ROUTING_VALID)
    assert merged.get(K.ROUTING_EXPERTS).shape == (10, width, 3, 2) and valid.shape == (10, width)
    assert torch.equal(valid.sum(1), merged.get(K.MASK_PROMPT).sum(1) + merged.get(K.NUM_GENERATED) - 1)
    TrainerLogProbs(base, pad_token_id=tok.pad_token_id, router_replay=True)(merged)
    same = (merged.get(K.ROUTING_EXPERTS).sort(-1).values == merged.get(K.ROUTING_TRAINER).sort(-1).values)
    assert bool(same.all(-1).all(-1)[valid].all())
    torch.testing.assert_close(merged.get(K.LOGP_TRAINER), merged.get(K.LOGP_ROLLOUT), rtol=0, atol=1e-9)
