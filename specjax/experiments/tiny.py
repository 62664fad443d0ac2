"""A random tiny model and a byte tokenizer, so tests can run a whole experiment.

Only `config.model = 'tiny-random'` reaches this: it measures nothing and its
text is noise. Real checkpoints always use their own tokenizer.
"""

from __future__ import annotations

import jax

from specjax.models import config as config_lib
from specjax.models import gemma


class ByteTokenizer:
  """UTF-8 bytes shifted past four special ids; the chat template is Gemma's, spelled in bytes."""

  pad_id, eos_id, bos_id, end_of_turn_id = 0, 1, 2, 3
  _OFFSET = 4
  vocab_size = 256 + _OFFSET

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    ids = [b + self._OFFSET for b in text.encode('utf-8')]
    return [self.bos_id] + ids if add_bos else ids

  def decode(self, ids) -> str:
    data = bytes(i - self._OFFSET for i in ids if i >= self._OFFSET)
    return data.decode('utf-8', errors='replace')

  def apply_chat_template(self, user_text: str) -> str:
    return f'<start_of_turn>user\n{user_text.strip()}<end_of_turn>\n<start_of_turn>model\n'


def load(seed: int):
  """(GemmaConfig, params, tokenizer) of the random tiny model."""
  config = config_lib.tiny_config(vocab_size=ByteTokenizer.vocab_size, max_position=4096)
  params = gemma.init_params(config, jax.random.key(seed))
  return config, params, ByteTokenizer()
