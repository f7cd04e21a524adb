"""Our decoder for the Llama / Qwen2 / Qwen3 families, HF-folder loading, tiny presets and a char tokenizer.

`load(path, plan=...)` -> a `Decoder` whose forward maps token ids [B, T] to logits [B, T, vocab].
"""

from trace_rl.models.config import ModelConfig
from trace_rl.models.decoder import Decoder, build
from trace_rl.models.linear import Linear
from trace_rl.models.loading import load, load_state_dict_into, read_state_dict, save_pretrained
from trace_rl.models.presets import PRESETS, char_tokenizer_for, preset, tiny_model
from trace_rl.models.tokenizer import CharTokenizer, load_tokenizer

__all__ = ["CharTokenizer", "Decoder", "Linear", "ModelConfig", "PRESETS", "build", "char_tokenizer_for",
           "load", "load_state_dict_into", "load_tokenizer", "preset", "read_state_dict", "save_pretrained",
           "tiny_model"]
