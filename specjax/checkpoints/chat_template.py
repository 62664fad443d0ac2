"""The chat template a checkpoint carries, if any: the mark of an instruction-tuned model.

Instruction-tuned checkpoints ship the template their turns were trained with
(GGUF metadata `tokenizer.chat_template`; in a Hugging Face directory
`chat_template` in tokenizer_config.json, or a chat_template.jinja/.json file);
base checkpoints usually do not. The experiment wraps prompts in chat turns
only when one is there, since a base model given chat markup tends to echo it.

A GGUF is read by walking its header (`gguf_header`) rather than through
gguf.GGUFReader, which parses every field (~10 s for Gemma 3's 262k-token
vocabulary).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specjax.checkpoints import gguf_header
from specjax.checkpoints.errors import CheckpointError

GGUF_KEY = 'tokenizer.chat_template'


def find(path: str | os.PathLike) -> str | None:
  """The chat template of a GGUF file or a Hugging Face directory; None when it has none."""
  path = Path(path).expanduser()
  if path.is_dir():
    return hf_chat_template(path)
  if path.is_file():
    if path.suffix == '.safetensors' or path.name == 'config.json':
      return hf_chat_template(path.parent)
    return gguf_chat_template(path)
  raise CheckpointError(f'{path}: no such file or directory')


def hf_chat_template(directory: Path) -> str | None:
  jinja = directory / 'chat_template.jinja'
  if jinja.is_file():
    return jinja.read_text(encoding='utf-8') or None
  for name in ('tokenizer_config.json', 'chat_template.json'):
    try:
      template = json.loads((directory / name).read_text(encoding='utf-8')).get('chat_template')
    except FileNotFoundError:
      continue
    except (OSError, ValueError, AttributeError) as e:
      raise CheckpointError(f'{directory / name}: unreadable: {e}') from e
    if template:  # a string, or a list of named templates
      return template if isinstance(template, str) else json.dumps(template)
  return None


def gguf_chat_template(path: Path) -> str | None:
  """`tokenizer.chat_template` from a GGUF's header, or None (also for a non-GGUF file)."""
  fields = gguf_header.read_scalars(path)
  return (fields or {}).get(GGUF_KEY) or None
