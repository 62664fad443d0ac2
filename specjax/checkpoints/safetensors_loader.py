"""Gemma 2 / Gemma 3 weights from a Hugging Face directory of safetensors.

The directory holds `config.json` and either one `model.safetensors` or shards
listed by `model.safetensors.index.json`. Hugging Face stores matrices as
torch Linear weights, (out, in), as we do, and norm weights as w where Gemma
multiplies by (1 + w), to which we add 1. bf16 tensors come out
of `safetensors.numpy` as ml_dtypes bfloat16 and are widened to float32.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from specjax.checkpoints import param_tree
from specjax.checkpoints.errors import CheckpointError
from specjax.checkpoints.hf_config import read_hf_config
from specjax.models.config import GemmaConfig

SINGLE_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'

# Where the text tower's `embed_tokens`, `layers` and `norm` live: text-only
# checkpoints, multimodal Gemma 3 before transformers 4.52, and after.
TEXT_TOWER_PREFIXES = ('model.', 'language_model.model.', 'model.language_model.',
                       'language_model.')

# Hugging Face name within `layers.{i}.` -> (our leaf within `layer_{i}`, conversion).
# A conversion is 'norm' (add 1) or 'matrix' (used as stored, (out, in)).
_LAYER_TENSORS = {
    'input_layernorm.weight': ('pre_attention_norm.scale', 'norm'),
    'post_attention_layernorm.weight': ('post_attention_norm.scale', 'norm'),
    'pre_feedforward_layernorm.weight': ('pre_ffw_norm.scale', 'norm'),
    'post_feedforward_layernorm.weight': ('post_ffw_norm.scale', 'norm'),
    'self_attn.q_proj.weight': ('attn.q_NHxD', 'matrix'),
    'self_attn.k_proj.weight': ('attn.k_KHxD', 'matrix'),
    'self_attn.v_proj.weight': ('attn.v_KHxD', 'matrix'),
    'self_attn.o_proj.weight': ('attn.o_DxNH', 'matrix'),
    'self_attn.q_norm.weight': ('attn.query_norm.scale', 'norm'),
    'self_attn.k_norm.weight': ('attn.key_norm.scale', 'norm'),
    'mlp.gate_proj.weight': ('mlp.gate_FxD', 'matrix'),
    'mlp.up_proj.weight': ('mlp.up_FxD', 'matrix'),
    'mlp.down_proj.weight': ('mlp.down_DxF', 'matrix'),
}
_GLOBAL_TENSORS = {
    'embed_tokens.weight': ('embedding_VxD', 'matrix'),
    'norm.weight': ('final_norm.scale', 'norm'),
}


def tensor_names(config: GemmaConfig, prefix: str) -> dict[str, tuple[str, str | int]]:
  """Hugging Face tensor name -> (our dotted leaf name, conversion)."""
  names = {prefix + hf: leaf for hf, leaf in _GLOBAL_TENSORS.items()}
  for i in range(config.num_layers):
    for hf, (leaf, conversion) in _LAYER_TENSORS.items():
      if hf.startswith(('self_attn.q_norm', 'self_attn.k_norm')) and not config.use_qk_norm:
        continue
      names[f'{prefix}layers.{i}.{hf}'] = (f'layer_{i}.{leaf}', conversion)
  return names


def shard_files(directory: Path) -> dict[str, Path]:
  """Tensor name -> the file that holds it (per the index, or the single file)."""
  index = directory / INDEX_FILE
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())['weight_map']
      files = {name: directory / shard for name, shard in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise CheckpointError(f'{index}: malformed safetensors index: {e}') from e
    for shard in sorted(set(files.values())):
      if not shard.is_file():
        raise CheckpointError(f'{shard}: shard listed in {index} does not exist')
    return files
  single = directory / SINGLE_FILE
  if not single.is_file():
    raise CheckpointError(f'{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} exists')
  with _open(single) as f:
    return {name: single for name in f.keys()}


def _open(path: Path):
  try:
    return safetensors.safe_open(path, framework='numpy')
  except Exception as e:  # SafetensorError on a bad header, OSError, ...
    raise CheckpointError(f'{path}: not a readable safetensors file: {e}') from e


def _convert(handle: Any, path: Path, name: str, shape: tuple[int, ...],
             conversion: str | int) -> np.ndarray:
  """One tensor as a float32 array of our `shape` (checked before reading the data)."""
  try:
    hf_shape = tuple(handle.get_slice(name).get_shape())
  except Exception as e:
    raise CheckpointError(f'{path}: does not hold tensor {name} (corrupt index?): {e}') from e
  if conversion == 'norm':
    want = (int(np.prod(shape)),)
  else:  # torch stores (out, in), as we do
    want = tuple(shape)
  if hf_shape != want:
    raise CheckpointError(f'{path}: tensor {name} has shape {hf_shape}, expected {want} '
                          'for a model of this config')
  try:
    value = np.asarray(handle.get_tensor(name), np.float32)
  except Exception as e:
    raise CheckpointError(f'{path}: cannot read tensor {name}: {e}') from e
  if conversion == 'norm':
    return (value + 1.0).reshape(shape)
  return np.ascontiguousarray(value)


def _text_tower_prefix(names: set[str], directory: Path) -> str:
  for prefix in TEXT_TOWER_PREFIXES:
    if f'{prefix}embed_tokens.weight' in names:
      return prefix
  raise CheckpointError(f'{directory}: no embed_tokens.weight under any of the prefixes '
                        f'{TEXT_TOWER_PREFIXES}; not a Gemma checkpoint?')


def load_safetensors(directory: str | os.PathLike) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, float32 numpy params) from a Hugging Face Gemma 2 / Gemma 3 directory."""
  directory = Path(directory)
  if not directory.is_dir():
    raise CheckpointError(f'{directory}: no such checkpoint directory')
  config = read_hf_config(directory)
  files = shard_files(directory)
  names = tensor_names(config, _text_tower_prefix(set(files), directory))
  missing = sorted(set(names) - set(files))
  if missing:
    raise CheckpointError(f'{directory}: checkpoint lacks tensors {missing[:8]}'
                          + (f' and {len(missing) - 8} more' if len(missing) > 8 else ''))
  shapes = param_tree.expected_shapes(config)
  flat = {}
  with contextlib.ExitStack() as stack:
    needed = sorted({files[name] for name in names})
    handles = {path: stack.enter_context(_open(path)) for path in needed}
    for name, (leaf, conversion) in names.items():
      path = files[name]
      flat[leaf] = _convert(handles[path], path, name, shapes[leaf], conversion)
  params = param_tree.unflatten(flat)
  param_tree.check_params(params, config, directory)
  return config, params
