"""`CharTokenizer`: a character-level tokenizer for the tiny presets, saved as JSON in the model folder.

Vocabulary: the special tokens, then printable ASCII (space .. '~'), newline and tab, one id each.
Characters outside it encode to `<unk>`. `vocab_size` may be padded above the used ids (the model's
embedding table is then larger than the tokenizer; padded ids never appear in encoded text).

`load_tokenizer(folder)` returns a CharTokenizer when the folder has `char_tokenizer.json`, else the
folder's transformers tokenizer (imported lazily; transformers is only needed for real checkpoints).
"""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_FILE = "char_tokenizer.json"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "".join(chr(c) for c in range(32, 127)) + "\n\t"


class CharTokenizer:
    def __init__(self, chars: str = CHARS, special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
                 vocab_size: int | None = None):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: repeated characters in the vocabulary")
        self.special_tokens = tuple(special_tokens)
        self.chars = chars
        used = len(self.special_tokens) + len(chars)
        self.vocab_size = used if vocab_size is None else vocab_size
        if self.vocab_size < used:
            raise ValueError(f"CharTokenizer: vocab_size={vocab_size} < {used} tokens in use")
        self._id = {c: len(self.special_tokens) + i for i, c in enumerate(chars)}
        self._special_id = {t: i for i, t in enumerate(self.special_tokens)}

    def _special(self, name: str) -> int | None:
        return self._special_id.get(name)

    pad_token_id = property(lambda self: self._special("<pad>"))
    bos_token_id = property(lambda self: self._special("<bos>"))
    eos_token_id = property(lambda self: self._special("<eos>"))
    unk_token_id = property(lambda self: self._special("<unk>"))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        unk = self.unk_token_id
        if unk is None and any(c not in self._id for c in text):
            bad = sorted({c for c in text if c not in self._id})
            raise ValueError(f"CharTokenizer: characters {bad!r} are not in the vocabulary and there is no <unk>")
        ids = [self._id.get(c, unk) for c in text]
        return ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        n_special = len(self.special_tokens)
        for i in (int(i) for i in ids):
            if i < n_special:
                if not skip_special_tokens:
                    out.append(self.special_tokens[i])
            elif i < n_special + len(self.chars):
                out.append(self.chars[i - n_special])
            elif not skip_special_tokens:
                out.append(f"<id{i}>")
        return "".join(out)

    def __len__(self) -> int:
        return self.vocab_size

    # -- persistence --
    def to_dict(self) -> dict:
        return {"type": "char", "special_tokens": list(self.special_tokens), "chars": self.chars,
                "vocab_size": self.vocab_size}

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / TOKENIZER_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> CharTokenizer:
        path = Path(folder) / TOKENIZER_FILE
        d = json.loads(path.read_text())
        if d.get("type") != "char":
            raise ValueError(f"{path}: not a char tokenizer (type={d.get('type')!r})")
        return cls(d["chars"], tuple(d["special_tokens"]), d["vocab_size"])


def load_tokenizer(folder: str | Path):
    """CharTokenizer if the folder has one, else transformers' AutoTokenizer for the folder."""
    folder = Path(folder)
    if (folder / TOKENIZER_FILE).is_file():
        return CharTokenizer.load(folder)
    if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    raise FileNotFoundError(f"no tokenizer in {folder}: expected {TOKENIZER_FILE} (trace_rl char tokenizer) "
                            f"or HF tokenizer files (tokenizer.json, tokenizer.model, vocab.json)")
