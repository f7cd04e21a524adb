"""`CharTokenizer`: a character-level tokenizer for the tiny presets, saved as a standard HF tokenizer.

Vocabulary: the special tokens, then printable ASCII (space .. '~'), newline and tab, one id each.
Characters outside it encode to `<unk>`; the literal text of a special token ("<eos>") encodes to its id,
as every HF tokenizer does. `vocab_size` may be padded above the used ids (the model's embedding table
is then larger than the tokenizer; padded ids never appear in encoded text).

On disk it is a `tokenizers` `tokenizer.json` (a WordLevel model over single characters, a pre-tokenizer
that isolates every character, a Fuse decoder) plus `tokenizer_config.json` naming
`PreTrainedTokenizerFast` and the special tokens: `transformers.AutoTokenizer` / `PreTrainedTokenizerFast`
(and so TRL and vLLM) load it and give the same ids (tested). Writing it needs neither transformers nor
tokenizers.

Older folders hold `char_tokenizer.json` (the private JSON earlier versions wrote): `load_tokenizer` still reads
it; `CharTokenizer.load(folder).save(folder)` (or `trace-rl export`) writes the standard files beside it.

`load_tokenizer(folder)` returns a CharTokenizer when the folder holds one (either form), else the folder's
transformers tokenizer (transformers imported lazily: `pip install 'trace-rl[hf]'`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
LEGACY_TOKENIZER_FILE = "char_tokenizer.json"      # trace_rl's private format before tokenizer.json
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "".join(chr(c) for c in range(32, 127)) + "\n\t"
_EVERY_CHAR = r"[\s\S]"                              # the pre-tokenizer's pattern: each character alone
VOCAB_SIZE_KEY = "trace_rl_vocab_size"               # in tokenizer_config.json when vocab_size is padded


class CharTokenizer:
    def __init__(self, chars: str = CHARS, special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
                 vocab_size: int | None = None):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: repeated characters in the vocabulary")
        if any(len(t) < 2 for t in special_tokens) or set(special_tokens) & set(chars):
            raise ValueError("CharTokenizer: special tokens must be strings of 2+ characters, distinct from chars")
        self.special_tokens = tuple(special_tokens)
        self.chars = chars
        used = len(self.special_tokens) + len(chars)
        self.vocab_size = used if vocab_size is None else vocab_size
        if self.vocab_size < used:
            raise ValueError(f"CharTokenizer: vocab_size={vocab_size} < {used} tokens in use")
        self._id = {c: len(self.special_tokens) + i for i, c in enumerate(chars)}
        self._special_id = {t: i for i, t in enumerate(self.special_tokens)}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(special_tokens, key=len,
                                                                              reverse=True)) + ")")

    def _special(self, name: str) -> int | None:
        return self._special_id.get(name)

    pad_token_id = property(lambda self: self._special("<pad>"))
    bos_token_id = property(lambda self: self._special("<bos>"))
    eos_token_id = property(lambda self: self._special("<eos>"))
    unk_token_id = property(lambda self: self._special("<unk>"))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        unk = self.unk_token_id
        ids: list[int] = []
        for piece in self._split.split(text) if self.special_tokens else [text]:
            if piece in self._special_id:
                ids.append(self._special_id[piece])
                continue
            if unk is None and any(c not in self._id for c in piece):
                bad = sorted({c for c in piece if c not in self._id})
                raise ValueError(f"CharTokenizer: characters {bad!r} are not in the vocabulary and there is no <unk>")
            ids.extend(self._id.get(c, unk) for c in piece)
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

    # -- persistence: the HF files --
    def vocab(self) -> dict[str, int]:
        return {**self._special_id, **self._id}

    def to_tokenizer_json(self) -> dict:
        """The `tokenizers` serialisation (what `tokenizers.Tokenizer.from_str` and transformers read)."""
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i, t in enumerate(self.special_tokens)],
            "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": _EVERY_CHAR}, "behavior": "Isolated",
                              "invert": False},
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": self.vocab(),
                      "unk_token": "<unk>" if "<unk>" in self._special_id else None},
        }

    def to_tokenizer_config(self, model_max_length: int | None = None) -> dict:
        names = {"<pad>": "pad_token", "<bos>": "bos_token", "<eos>": "eos_token", "<unk>": "unk_token"}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  **{names[t]: t for t in self.special_tokens if t in names}}
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        if self.vocab_size != len(self.special_tokens) + len(self.chars):
            config[VOCAB_SIZE_KEY] = self.vocab_size   # the padded size (transformers keeps unknown keys)
        return config

    def save(self, folder: str | Path, model_max_length: int | None = None) -> Path:
        """Write tokenizer.json + tokenizer_config.json into `folder`; returns the tokenizer.json path."""
        folder = Path(folder)
        (folder / TOKENIZER_FILE).write_text(json.dumps(self.to_tokenizer_json(), indent=1, ensure_ascii=False))
        (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(self.to_tokenizer_config(model_max_length), indent=1))
        return folder / TOKENIZER_FILE

    save_pretrained = save      # the name transformers users reach for

    @classmethod
    def from_tokenizer_json(cls, data: dict, vocab_size: int | None = None) -> CharTokenizer | None:
        """A CharTokenizer when `data` is one written by `to_tokenizer_json` (specials first, then one
        character per id, contiguous); None for any other tokenizer."""
        model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
        if (model.get("type") != "WordLevel" or pre.get("type") != "Split"
                or (pre.get("pattern") or {}).get("Regex") != _EVERY_CHAR or (data.get("decoder") or {}).get("type")
                != "Fuse" or data.get("normalizer") is not None or not _adds_no_tokens(data.get("post_processor"))):
            return None
        specials = [t["content"] for t in sorted(data.get("added_tokens", []), key=lambda t: t["id"])
                    if t.get("special")]
        by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))) or [t for t, _ in by_id[:len(specials)]] != specials:
            return None
        chars = [t for t, _ in by_id[len(specials):]]
        if any(len(c) != 1 for c in chars):
            return None
        return cls("".join(chars), tuple(specials), vocab_size)

    @classmethod
    def load(cls, folder: str | Path) -> CharTokenizer:
        """From `folder`'s tokenizer.json (or the legacy char_tokenizer.json). The padded vocab_size comes
        from tokenizer_config.json, else from the folder's config.json, else it is the number of tokens."""
        folder = Path(folder)
        vocab_size = None
        for name, key in ((TOKENIZER_CONFIG_FILE, VOCAB_SIZE_KEY), ("config.json", "vocab_size")):
            if vocab_size is None and (folder / name).is_file():
                vocab_size = json.loads((folder / name).read_text()).get(key)
        if (folder / TOKENIZER_FILE).is_file():
            tok = cls.from_tokenizer_json(json.loads((folder / TOKENIZER_FILE).read_text()), vocab_size)
            if tok is None:
                raise ValueError(f"{folder / TOKENIZER_FILE}: not a trace_rl character tokenizer; use "
                                 f"load_tokenizer() for other tokenizers")
            return tok
        path = folder / LEGACY_TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} or {LEGACY_TOKENIZER_FILE} in {folder}")
        d = json.loads(path.read_text())
        if d.get("type") != "char":
            raise ValueError(f"{path}: not a char tokenizer (type={d.get('type')!r})")
        return cls(d["chars"], tuple(d["special_tokens"]), d["vocab_size"])


def _adds_no_tokens(post_processor: dict | None) -> bool:
    """None, or the no-op template transformers writes when it re-saves a tokenizer."""
    if post_processor is None:
        return True
    return (post_processor.get("type") == "TemplateProcessing" and not post_processor.get("special_tokens")
            and all("Sequence" in piece for piece in post_processor.get("single", [])))


def is_char_tokenizer_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    if (folder / TOKENIZER_FILE).is_file():
        try:
            return CharTokenizer.from_tokenizer_json(json.loads((folder / TOKENIZER_FILE).read_text())) is not None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return False
    return (folder / LEGACY_TOKENIZER_FILE).is_file()


def load_tokenizer(folder: str | Path):
    """CharTokenizer if the folder holds one (tokenizer.json or the legacy char_tokenizer.json), else
    transformers' AutoTokenizer for the folder."""
    folder = Path(folder)
    if is_char_tokenizer_folder(folder):
        return CharTokenizer.load(folder)
    if any((folder / f).is_file() for f in (TOKENIZER_FILE, "tokenizer.model", "vocab.json")):
        from trace_rl.models.hf import require_transformers

        require_transformers(f"loading the tokenizer in {folder}")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    raise FileNotFoundError(f"no tokenizer in {folder}: expected {TOKENIZER_FILE} (HF, or trace_rl's character "
                            f"tokenizer), tokenizer.model, vocab.json, or the legacy {LEGACY_TOKENIZER_FILE}")
