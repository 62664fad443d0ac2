"""GemmaConfig to and from the plain values checkpoint files store.

Checkpoint formats state only part of an architecture: GGUF has no
query_pre_attn_scalar and no sliding-window pattern, for instance. A named
config in `MODEL_CONFIGS` with the same structure fills in what the file leaves
unsaid, so a known model loads as exactly its named config; an unknown one
gets the format's documented convention instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import MODEL_CONFIGS, GemmaConfig

# The fields that identify an architecture; the rest are settings of it.
STRUCTURE_FIELDS = ('family', 'num_layers', 'embed_dim', 'num_heads', 'num_kv_heads',
                    'head_dim', 'hidden_dim', 'vocab_size')

_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(GemmaConfig))


def config_to_dict(config: GemmaConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


def config_from_dict(values: dict[str, Any], source: object) -> GemmaConfig:
  """Rebuilds a config that `config_to_dict` wrote; `source` names the file."""
  unknown = sorted(set(values) - _FIELD_NAMES)
  if unknown:
    raise CheckpointError(f'{source}: unknown GemmaConfig fields {unknown}')
  try:
    return GemmaConfig(**values)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f'{source}: invalid model config: {e}') from e


def matching_named_config(stated: dict[str, Any]) -> tuple[str, GemmaConfig] | None:
  """The named config whose structure equals what a file states, if any."""
  for name, config in MODEL_CONFIGS.items():
    if all(stated.get(f) == getattr(config, f) for f in STRUCTURE_FIELDS):
      return name, config
  return None


def complete_config(stated: dict[str, Any], convention: dict[str, Any],
                    source: object) -> GemmaConfig:
  """A config from the fields a file states, completed by a named config or a convention.

  `stated` wins over both: a fine-tune that changed, say, its context length
  keeps its own value.
  """
  named = matching_named_config(stated)
  base = config_to_dict(named[1]) if named else dict(convention)
  return config_from_dict({**base, **stated}, source)
