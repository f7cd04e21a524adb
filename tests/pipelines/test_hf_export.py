"""HF round trip: a trained checkpoint is an HF model folder transformers loads with the same logits and
token ids; `trace-rl export` writes one for a chosen step; old checkpoints still export."""

import json

import pytest
import torch

from trace_rl.cli import main
from trace_rl.models import load, load_tokenizer
from trace_rl.pipelines import build
from trace_rl.pipelines.export import find_checkpoints

from .test_run import small

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step run of the default policy (FP4 rollout, token TIS) with a checkpoint after each step, the
    model folders of both kept (loop.keep_models)."""
    run_dir = tmp_path_factory.mktemp("hf") / "run"
    pipeline = build(small(2, **{"loop.checkpoint_every": 1, "loop.keep_models": 2}), run_dir=run_dir)
    pipeline.run()                                  # writes config.yaml too
    return run_dir, pipeline


def test_checkpoint_is_an_hf_folder_with_the_trained_logits(trained):
    run_dir, pipeline = trained
    ckpt = run_dir / "checkpoint"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (ckpt / name).is_file(), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    tok = pipeline.tokenizer
    prompts = ["12+34=", "7+905=", "Q: 1+1=?\n\tA: 2 ~{}"]
    for text in prompts:
        assert hf_tok(text)["input_ids"] == tok.encode(text)
    tokens = torch.tensor([tok.encode(prompts[0]) + tok.encode("46")])
    with torch.no_grad():
        trained_logits = pipeline.model(tokens)
        assert torch.allclose(hf(tokens).logits, trained_logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(load(ckpt)(tokens), trained_logits)           # our loader: bit for bit
    gen = transformers.GenerationConfig.from_pretrained(str(ckpt))
    assert set(gen.eos_token_id) == set(pipeline.sampling.stop_token_ids)
    assert gen.max_new_tokens == pipeline.sampling.max_new_tokens


def test_export_a_chosen_step(trained, tmp_path, capsys):
    run_dir, pipeline = trained
    found = find_checkpoints(run_dir)
    assert sorted(found) == [1, 2] and found[2].name == "checkpoint" and found[1].name == "step-000001"
    assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    assert "exported step 2" in capsys.readouterr().out
    out = tmp_path / "out"
    assert not (out / "optimizer.safetensors").exists() and not (out / "state.json").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    tokens = torch.tensor([[5, 20, 33, 40]])
    with torch.no_grad():
        assert torch.allclose(hf(tokens).logits, pipeline.model(tokens), rtol=1e-5, atol=1e-5)
    assert main(["export", str(run_dir), str(tmp_path / "first"), "--step", "1"]) == 0
    with torch.no_grad():                     # step 1's weights: another model than the final one
        assert not torch.allclose(load(tmp_path / "first")(tokens), pipeline.model(tokens))
    assert main(["export", str(run_dir), str(tmp_path / "b16"), "--step", "2", "--dtype", "bfloat16"]) == 0
    assert json.loads((tmp_path / "b16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert load(tmp_path / "b16").model.embed_tokens.weight.dtype == torch.bfloat16


def test_export_refuses_bad_input(trained, tmp_path, capsys):
    run_dir, _ = trained
    assert main(["export", str(run_dir), str(tmp_path / "x"), "--step", "7"]) == 2
    assert "--step 7: no checkpoint of that step in" in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as exc:
        main(["export", str(run_dir), str(tmp_path / "x"), "--dtype", "int3"])
    assert exc.value.code == 2 and not (tmp_path / "x").exists()


def test_export_refuses_a_non_empty_out_and_a_run_without_checkpoint(trained, tmp_path, capsys):
    run_dir, _ = trained
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err and (tmp_path / "full" / "keep.txt").exists()
    assert main(["export", str(tmp_path / "full"), str(tmp_path / "y")]) == 2
    assert "no checkpoint in" in capsys.readouterr().err


def test_old_checkpoints_without_hf_files_still_export(trained, tmp_path):
    """A checkpoint written before they were HF folders (full state dict + state.json) is rebuilt from
    the run's config.yaml."""
    import shutil

    from safetensors.torch import save_file

    run_dir, pipeline = trained
    old = tmp_path / "old"
    (old / "checkpoint").mkdir(parents=True)
    shutil.copy(run_dir / "config.yaml", old / "config.yaml")
    shutil.copy(run_dir / "checkpoint" / "state.json", old / "checkpoint" / "state.json")
    save_file({k: v.detach().clone() for k, v in pipeline.model.state_dict().items()},
              str(old / "checkpoint" / "model.safetensors"))         # the old layout kept the tied lm_head
    assert main(["export", str(old), str(tmp_path / "out")]) == 0
    tokens = torch.tensor([[5, 20, 33, 40]])
    with torch.no_grad():
        assert torch.equal(load(tmp_path / "out")(tokens), pipeline.model(tokens))
    assert load_tokenizer(tmp_path / "out").encode("12+3=") == pipeline.tokenizer.encode("12+3=")


def test_keep_models_keeps_the_newest_snapshots(tmp_path):
    build(small(3, **{"loop.checkpoint_every": 1, "loop.keep_models": 2}), run_dir=tmp_path / "run").run()
    snapshots = sorted(p.name for p in (tmp_path / "run" / "models").iterdir())
    assert snapshots == ["step-000002", "step-000003"]
    assert not (tmp_path / "run" / "models" / "step-000003" / "optimizer.safetensors").exists()
    ckpt, snap = tmp_path / "run" / "checkpoint" / "model.safetensors", tmp_path / "run" / "models" / "step-000003"
    assert (snap / "model.safetensors").stat().st_ino == ckpt.stat().st_ino        # a hard link, no copy
