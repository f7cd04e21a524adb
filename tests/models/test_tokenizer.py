from __future__ import annotations

import pytest

from trace_rl.models import CharTokenizer, load_tokenizer


def test_round_trip_and_specials(tmp_path):
    tok = CharTokenizer(vocab_size=128)
    text = "Q: 12+30=?\n\tA: 42 ~{}"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert max(ids) < tok.vocab_size and len(set(ids[1:-1])) == len(set(text))
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False).startswith("<bos>")
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.encode(text) == tok.encode(text) and again.vocab_size == 128


def test_unknown_characters():
    tok = CharTokenizer()
    assert tok.encode("é") == [tok.unk_token_id]
    strict = CharTokenizer(special_tokens=("<pad>", "<eos>"))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        strict.encode("é")


def test_vocab_size_too_small_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        CharTokenizer(vocab_size=10)
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path)


TEXTS = ["12+34=", "Q: 12+30=?\n\tA: 42 ~{}", "é<eos>x", "<pad><bos>", "  ", "", "a<eos", "\\x\"'"]


def test_saved_as_standard_hf_files_with_the_same_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = CharTokenizer(vocab_size=128)
    tok.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    for hf in (transformers.AutoTokenizer.from_pretrained(str(tmp_path)),
               transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))):
        for text in TEXTS:
            assert hf(text)["input_ids"] == tok.encode(text), text
            ids = tok.encode(text)
            assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2, 3)
    hf.save_pretrained(str(tmp_path / "again"))                 # transformers' re-save is still ours to read
    again = load_tokenizer(tmp_path / "again")
    assert isinstance(again, CharTokenizer) and again.vocab_size == 128
    assert again.encode(TEXTS[1]) == tok.encode(TEXTS[1])


def test_special_token_text_encodes_to_its_id():
    tok = CharTokenizer()
    assert tok.encode("1<eos>") == [tok.encode("1")[0], tok.eos_token_id]
    assert tok.encode("<eos") == [tok.encode(c)[0] for c in "<eos"]


def test_shipped_default_policy_tokenizer_loads_in_transformers():
    transformers = pytest.importorskip("transformers")
    from trace_rl.pipelines.assemble import DEFAULT_POLICY_DIR

    ours = load_tokenizer(DEFAULT_POLICY_DIR)
    hf = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_POLICY_DIR), local_files_only=True)
    assert isinstance(ours, CharTokenizer) and ours.vocab_size == 128 and len(hf) == 101
    for text in TEXTS:
        assert hf(text)["input_ids"] == ours.encode(text), text


def test_legacy_char_tokenizer_json_still_loads_and_converts(tmp_path):
    import json

    legacy = {"type": "char", "special_tokens": ["<pad>", "<bos>", "<eos>", "<unk>"],
              "chars": CharTokenizer().chars, "vocab_size": 128}
    (tmp_path / "char_tokenizer.json").write_text(json.dumps(legacy))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, CharTokenizer) and tok.vocab_size == 128
    CharTokenizer.load(tmp_path).save(tmp_path)                  # the documented conversion
    assert (tmp_path / "tokenizer.json").is_file()
    (tmp_path / "char_tokenizer.json").unlink()
    assert load_tokenizer(tmp_path).encode(TEXTS[1]) == tok.encode(TEXTS[1])
    assert load_tokenizer(tmp_path).vocab_size == 128


def test_other_tokenizer_json_is_not_taken_for_ours(tmp_path):
    import json

    data = CharTokenizer().to_tokenizer_json()
    data["model"]["type"] = "BPE"
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert CharTokenizer.from_tokenizer_json(data) is None
    with pytest.raises(ValueError, match="not a trace_rl character tokenizer"):
        CharTokenizer.load(tmp_path)


def test_missing_transformers_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    from trace_rl.models.hf import MissingDependency

    (tmp_path / "vocab.json").write_text("{}")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(MissingDependency, match=r"pip install 'trace-rl\[hf\]'"):
        load_tokenizer(tmp_path)
