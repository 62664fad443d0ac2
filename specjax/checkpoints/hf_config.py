"""GemmaConfig from a Hugging Face `config.json` (Gemma 2, Gemma 3 text or multimodal).

Hugging Face omits fields that equal the `transformers` class defaults (the
Gemma 3 4B `text_config` lists little more than its sizes), so the defaults of
`Gemma2Config` and `Gemma3TextConfig` are spelled out here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


from specjax.checkpoints.config_io import complete_config
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

# transformers' Gemma2Config / Gemma3TextConfig constructor defaults.
_HF_DEFAULTS = {
    'gemma2': dict(
        vocab_size=256_000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
        rope_theta=10_000.0, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        sliding_window_pattern=2, max_position_embeddings=8192),
    'gemma3': dict(
        vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, query_pre_attn_scalar=256,
        sliding_window=4096, sliding_window_pattern=6, attn_logit_softcapping=None,
        final_logit_softcapping=None, max_position_embeddings=131_072),
}
_FAMILY_OF_MODEL_TYPE = {'gemma2': 'gemma2', 'gemma3_text': 'gemma3', 'gemma3': 'gemma3'}


def text_config(hf: dict[str, Any], source: object) -> tuple[str, dict[str, Any]]:
  """(family, the text tower's config dict); multimodal Gemma 3 nests it in `text_config`."""
  model_type = hf.get('model_type')
  if model_type not in _FAMILY_OF_MODEL_TYPE:
    raise CheckpointError(f'{source}: unsupported model_type {model_type!r}; '
                          f'supported: {", ".join(_FAMILY_OF_MODEL_TYPE)}')
  if model_type == 'gemma3':
    hf = hf.get('text_config') or {}
  return _FAMILY_OF_MODEL_TYPE[model_type], hf


def _global_every(text: dict[str, Any], num_layers: int, source: object) -> int:
  layer_types = text.get('layer_types')
  if not layer_types:
    return int(text['sliding_window_pattern'])
  is_global = [kind == 'full_attention' for kind in layer_types]
  if len(is_global) == num_layers and any(is_global):
    period = is_global.index(True) + 1
    if all(g == ((i + 1) % period == 0) for i, g in enumerate(is_global)):
      return period
  raise CheckpointError(f'{source}: layer_types {layer_types} is not a periodic '
                        'local/global pattern; GemmaConfig cannot express it')


def config_from_hf(hf: dict[str, Any], source: object) -> GemmaConfig:
  try:
    return _config_from_hf(hf, source)
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise CheckpointError(f'{source}: malformed Gemma config: {type(e).__name__}: {e}') from e


def _optional_float(x: Any) -> float | None:
  return None if x is None else float(x)


def _rope(text: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(global, local) RoPE settings, each with 'rope_theta' and, if scaled, 'rope_type'/'factor'.

  transformers < 5 writes rope_theta, rope_local_base_freq and rope_scaling;
  transformers 5 writes rope_parameters, per layer kind for Gemma 3.
  """
  params = text.get('rope_parameters')
  if params:
    if 'full_attention' in params:
      return params['full_attention'], params.get('sliding_attention', params['full_attention'])
    return params, params
  global_rope = {'rope_theta': text['rope_theta'], **(text.get('rope_scaling') or {})}
  # Gemma 2 uses rope_theta in local and global layers alike.
  local_rope = {'rope_theta': text.get('rope_local_base_freq', text['rope_theta'])}
  return global_rope, local_rope


def _config_from_hf(hf: dict[str, Any], source: object) -> GemmaConfig:
  family, text = text_config(hf, source)
  text = {**_HF_DEFAULTS[family], **{k: v for k, v in text.items() if v is not None
                                      or k.endswith('softcapping')}}
  num_layers = int(text['num_hidden_layers'])
  stated = dict(
      family=family,
      num_layers=num_layers,
      embed_dim=int(text['hidden_size']),
      num_heads=int(text['num_attention_heads']),
      num_kv_heads=int(text['num_key_value_heads']),
      head_dim=int(text['head_dim']),
      hidden_dim=int(text['intermediate_size']),
      vocab_size=int(text['vocab_size']),
      sliding_window=int(text['sliding_window']),
      query_pre_attn_scalar=float(text['query_pre_attn_scalar']),
      attn_logit_softcap=_optional_float(text['attn_logit_softcapping']),
      final_logit_softcap=_optional_float(text['final_logit_softcapping']),
      use_qk_norm=family == 'gemma3',
      rms_norm_eps=float(text['rms_norm_eps']),
      max_position=int(text['max_position_embeddings']),
  )
  global_rope, local_rope = _rope(text)
  stated.update(rope_base_global=float(global_rope['rope_theta']),
                rope_base_local=float(local_rope['rope_theta']),
                global_every=_global_every(text, num_layers, source))
  for where, rope in (('global', global_rope), ('local', local_rope)):
    kind = rope.get('rope_type', rope.get('type', 'default'))
    factor = float(rope.get('factor', 1.0))
    if kind == 'linear' and where == 'global':
      stated['rope_scale_global'] = factor
    elif kind != 'default' and factor != 1.0:
      raise CheckpointError(f'{source}: {where} RoPE scaling {rope} is not supported (only '
                            'linear scaling of the global layers is)')
  return complete_config(stated, {}, source)


def read_hf_config(directory: str | os.PathLike) -> GemmaConfig:
  path = Path(directory) / 'config.json'
  try:
    hf = json.loads(path.read_text())
  except FileNotFoundError as e:
    raise CheckpointError(f'{path}: no such file') from e
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path}: unreadable config.json: {e}') from e
  if not isinstance(hf, dict):
    raise CheckpointError(f'{path}: config.json is not a JSON object')
  return config_from_hf(hf, path)
