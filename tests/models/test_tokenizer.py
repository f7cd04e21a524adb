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
