"""The native engine records the rollout's FP4 rounding; the guided trainer reproduces its log-probs."""

import pytest
import torch

from trace_rl.collectors.prompts import prompt_batch
from trace_rl.correction.guided import guided_trainer
from trace_rl.correction.metrics import drift_metrics
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.guidance import select_guided_layers
from trace_rl.engine.native import NativeEngine
from trace_rl.models.presets import tiny_model
from trace_rl.objectives.logprobs import response_log_probs
from trace_rl.plan import PrecisionPlan

PROMPTS = [(12, 7), (305, 44), (9, 9)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rescore(plan, kv: str, guided_layers: str = "all"):
    plan = PrecisionPlan.preset("fp4-guided").model_copy(update={"trainer": plan, "kv_cache": kv,
                                                                 "guided_layers": guided_layers})
    base, tok = tiny_model("tiny", seed=0)
    prompts = prompt_batch([tok.encode(f"{a}+{b}=") for a, b in PROMPTS], pad_token_id=tok.pad_token_id)
    engine = NativeEngine(base, plan, max_batch=8, max_seq_len=48, pad_token_id=tok.pad_token_id,
                          record_guidance=True)
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=3))
    trainer, _ = tiny_model("tiny", seed=0)
    trainer.apply_plan(plan)
    args = [out.get(k) for k in (K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE)]
    with torch.no_grad():
        if plan.trainer == "guided":
            with guided_trainer(trainer, out, engine.guidance_sites):
                lp, _ = response_log_probs(trainer, *args, pad_token_id=tok.pad_token_id)
        else:
            lp, _ = response_log_probs(trainer, *args, pad_token_id=tok.pad_token_id)
    return out, lp, engine


@pytest.mark.parametrize("kv", ["nvfp4", "bf16"])
def test_guided_matches_rollout_where_aligned_does_not(kv):
    out_a, lp_a, _ = rescore("aligned", kv)
    out_g, lp_g, engine = rescore("guided", kv)
    assert torch.equal(out_a.get(K.TOKENS_RESPONSE), out_g.get(K.TOKENS_RESPONSE))  # same seed, same samples
    mask = out_g.get(K.MASK_RESPONSE)
    k3_aligned = drift_metrics(out_a.get(K.LOGP_ROLLOUT), lp_a, mask)["mismatch_k3"]
    k3_guided = drift_metrics(out_g.get(K.LOGP_ROLLOUT), lp_g, mask)["mismatch_k3"]
    assert k3_aligned > 0
    assert k3_guided <= k3_aligned / 10
    torch.testing.assert_close(lp_g, out_g.get(K.LOGP_ROLLOUT), rtol=0, atol=1e-5)
    report = engine.report()
    assert report["guidance_bytes_per_token"] > 0 and report["cuda_graphs"] is False


def test_record_layout_and_valid_positions():
    out, _, engine = rescore("guided", "nvfp4")
    g = out.get(K.GUIDANCE)
    valid = g.get("valid")
    prompt_len = out.get(K.MASK_PROMPT).sum(1)
    ngen = out.get(K.NUM_GENERATED)
    # prompt tokens and every fed response token (all but the last generated one) are recorded
    assert torch.equal(valid.sum(1), prompt_len + ngen - 1)
    width = out.get(K.TOKENS_PROMPT).shape[1] + out.get(K.TOKENS_RESPONSE).shape[1]
    for key in engine.guidance_sites.values():
        assert g.get((key, "bits")).shape[:2] == (out.batch_size[0], width)


def test_guided_layer_selection():
    names = [f"model.layers.{i}.mlp.down_proj" for i in range(4)] + ["lm_head"]
    assert select_guided_layers(names, "deeper_half", 4) == names[2:4]
    assert select_guided_layers(names, "*.layers.0.*", 4) == names[:1]
    assert select_guided_layers(names, "all", 4) == names
