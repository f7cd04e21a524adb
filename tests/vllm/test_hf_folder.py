"""vLLM loads a trace_rl HF model folder as it is — weights, config and the character tokenizer (no
`skip_tokenizer_init`) — and generates greedily what transformers generates from the same folder."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm")

from trace_rl.engine.base import SamplingParams as OurSampling  # noqa: E402
from trace_rl.models import load, load_tokenizer, save_pretrained  # noqa: E402
from trace_rl.pipelines.assemble import DEFAULT_POLICY_DIR  # noqa: E402

pytestmark = pytest.mark.vllm
PROMPTS = ["12+34=", "7+905=", "310+2="]


def test_vllm_loads_our_folder_with_its_tokenizer(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from vllm import LLM, SamplingParams

    from trace_rl.engine.vllm_engine import _kv_cache_bytes

    tok = load_tokenizer(DEFAULT_POLICY_DIR)
    newline = tok.encode("\n")[0]
    folder = tmp_path / "policy"          # written the way every checkpoint is, in float32
    save_pretrained(load(DEFAULT_POLICY_DIR, dtype=torch.float32), tok, folder,
                    sampling=OurSampling(temperature=0.0, max_new_tokens=6, stop_token_ids=(newline,)))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")      # in this process: ~10 s to start
    config = json.loads((folder / "config.json").read_text())
    llm = LLM(model=str(folder), dtype="float32", max_model_len=64, max_num_seqs=4, enforce_eager=True, seed=0,
              kv_cache_memory_bytes=_kv_cache_bytes(config, "float32", 4, 64, "bf16"))
    assert [llm.get_tokenizer().encode(p) for p in PROMPTS] == [tok.encode(p) for p in PROMPTS]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[newline]))

    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(folder))
    gen = GenerationConfig.from_pretrained(str(folder))
    gen.do_sample = False
    for prompt, out in zip(PROMPTS, outs):
        ids = hf_tok(prompt, return_tensors="pt").input_ids
        want = hf_tok.decode(hf.generate(ids, generation_config=gen)[0, ids.shape[1]:], skip_special_tokens=True)
        assert out.outputs[0].text.rstrip("\n") == want.rstrip("\n"), (prompt, out.outputs[0].text, want)
