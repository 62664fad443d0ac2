"""Gemma 2 / Gemma 3 weights and config from a GGUF file (llama.cpp's format).

GGUF stores a matrix (out, in) once dequantized, i.e. its `shape` field lists
(in, out); our matrices are (out, in) too (`q_NHxD`, `embedding_VxD`), so a
dequantized tensor is used as it is. Norm weights already
hold Gemma's (1 + w), as our `scale`s do. llama.cpp does not permute Gemma's
Q/K rows (Gemma uses split-half RoPE, as we do), so no un-permuting is needed.

Opening a GGUF parses every metadata field (the 262k-token vocabulary makes
that ~10 s for Gemma 3); `weight_cache` keeps the converted result.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from absl import logging
import gguf
import numpy as np

from specjax.checkpoints import gguf_header
from specjax.checkpoints import param_tree
from specjax.checkpoints.config_io import complete_config
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

SUPPORTED_ARCHITECTURES = ('gemma2', 'gemma3')

# GGUF tensor name within a block -> (leaf name within `layer_{i}`, is a matrix).
_BLOCK_TENSORS = {
    'attn_norm': ('pre_attention_norm.scale', False),
    'post_attention_norm': ('post_attention_norm.scale', False),
    'ffn_norm': ('pre_ffw_norm.scale', False),
    'post_ffw_norm': ('post_ffw_norm.scale', False),
    'attn_q': ('attn.q_NHxD', True),
    'attn_k': ('attn.k_KHxD', True),
    'attn_v': ('attn.v_KHxD', True),
    'attn_output': ('attn.o_DxNH', True),
    'attn_q_norm': ('attn.query_norm.scale', False),
    'attn_k_norm': ('attn.key_norm.scale', False),
    'ffn_gate': ('mlp.gate_FxD', True),
    'ffn_up': ('mlp.up_FxD', True),
    'ffn_down': ('mlp.down_DxF', True),
}
_GLOBAL_TENSORS = {
    'token_embd': ('embedding_VxD', True),
    'output_norm': ('final_norm.scale', False),
}

# Large matrices are dequantized in row blocks to keep the peak memory low.
_ROWS_PER_BLOCK = 8192


def tensor_names(config: GemmaConfig) -> dict[str, tuple[str, int | None]]:
  """GGUF tensor name -> (our dotted leaf name, is a matrix)."""
  names = {f'{g}.weight': leaf for g, leaf in _GLOBAL_TENSORS.items()}
  for i in range(config.num_layers):
    for g, (leaf, is_matrix) in _BLOCK_TENSORS.items():
      if g in ('attn_q_norm', 'attn_k_norm') and not config.use_qk_norm:
        continue
      names[f'blk.{i}.{g}.weight'] = (f'layer_{i}.{leaf}', is_matrix)
  return names


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
  path = Path(path)
  if not path.is_file():
    raise CheckpointError(f'{path}: no such GGUF file')
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # the reader raises ValueError/IndexError/... on bad bytes
    raise CheckpointError(
        f'{path}: not a readable GGUF file (truncated or corrupt?): {type(e).__name__}: {e}') from e


def _value(reader: gguf.GGUFReader, key: str, path: Path, default: Any = KeyError) -> Any:
  field = reader.fields.get(key)
  if field is None:
    if default is KeyError:
      raise CheckpointError(f'{path}: GGUF metadata lacks {key!r}')
    return default
  try:
    return field.contents()
  except Exception as e:
    raise CheckpointError(f'{path}: cannot decode GGUF metadata {key!r}: {e}') from e


def _float32_value(x: float) -> float:
  # GGUF stores floats as float32: 1e-6 comes back as 9.99999997e-07. The
  # shortest decimal that rounds to the same float32 recovers the intended value.
  return float(str(np.float32(x)))


def _global_every(pattern: Any, num_layers: int, path: Path) -> int | None:
  """The period of a sliding-window pattern key: an int, or one bool per layer (True = local)."""
  if pattern is None:
    return None
  if isinstance(pattern, int):
    return pattern
  is_local = [bool(x) for x in pattern]
  if not all(x for x in is_local) and len(is_local) == num_layers:
    period = is_local.index(False) + 1
    if all(is_local[i] == bool((i + 1) % period) for i in range(num_layers)):
      return period
  raise CheckpointError(f'{path}: sliding-window pattern {is_local} is not periodic; '
                        'GemmaConfig cannot express it')


def gguf_config(reader: gguf.GGUFReader, path: str | os.PathLike) -> GemmaConfig:
  """The GemmaConfig a GGUF's metadata describes, completed as llama.cpp would."""
  path = Path(path)
  arch = _value(reader, 'general.architecture', path)
  if arch not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(f'{path}: unsupported GGUF architecture {arch!r}; '
                          f'supported: {", ".join(SUPPORTED_ARCHITECTURES)}')
  key = lambda name: f'{arch}.{name}'  # noqa: E731
  num_heads = _value(reader, key('attention.head_count'), path)
  embed_dim = _value(reader, key('embedding_length'), path)
  tokens = reader.fields.get('tokenizer.ggml.tokens')
  if tokens is not None:
    vocab_size = len(tokens.data)
  else:
    embedding = next((t for t in reader.tensors if t.name == 'token_embd.weight'), None)
    if embedding is None:
      raise CheckpointError(f'{path}: GGUF has neither a token list nor token_embd.weight')
    vocab_size = int(embedding.shape[-1])
  num_layers = _value(reader, key('block_count'), path)
  stated = dict(
      family=arch,
      num_layers=num_layers,
      embed_dim=embed_dim,
      num_heads=num_heads,
      num_kv_heads=_value(reader, key('attention.head_count_kv'), path, num_heads),
      head_dim=_value(reader, key('attention.key_length'), path, embed_dim // num_heads),
      hidden_dim=_value(reader, key('feed_forward_length'), path),
      vocab_size=vocab_size,
      sliding_window=_value(reader, key('attention.sliding_window'), path),
      rope_base_global=_float32_value(_value(reader, key('rope.freq_base'), path, 10_000.0)),
      rms_norm_eps=_float32_value(_value(reader, key('attention.layer_norm_rms_epsilon'), path)),
      max_position=_value(reader, key('context_length'), path),
  )
  optional = {
      'rope_base_local': (key('rope.freq_base_swa'), _float32_value),
      'attn_logit_softcap': (key('attn_logit_softcapping'), _float32_value),
      'final_logit_softcap': (key('final_logit_softcapping'), _float32_value),
      'query_pre_attn_scalar': (key('attention.scale'), lambda s: _float32_value(s ** -2)),
  }
  for field, (name, convert) in optional.items():
    value = _value(reader, name, path, None)
    if value is not None:
      stated[field] = convert(value)
  every = _global_every(_value(reader, key('attention.sliding_window_pattern'), path, None),
                        num_layers, path)
  if every is not None:
    stated['global_every'] = every
  rope_scaling = _value(reader, key('rope.scaling.type'), path, None)
  rope_factor = _value(reader, key('rope.scaling.factor'), path, 1.0)
  if rope_scaling == 'linear':
    stated['rope_scale_global'] = float(rope_factor)
  elif rope_scaling not in (None, 'none') and rope_factor != 1.0:
    raise CheckpointError(f'{path}: RoPE scaling {rope_scaling!r} x{rope_factor} is not '
                          'supported (only linear scaling of the global layers is)')

  # llama.cpp's conventions for what Gemma GGUFs leave unsaid (llama-model.cpp).
  head_dim = stated['head_dim']
  convention = dict(
      query_pre_attn_scalar=float(head_dim), attn_logit_softcap=None, final_logit_softcap=None,
      rope_base_local=10_000.0, global_every=6, use_qk_norm=True)
  if arch == 'gemma2':
    convention.update(global_every=2, use_qk_norm=False, attn_logit_softcap=50.0,
                      final_logit_softcap=30.0, rope_base_local=stated['rope_base_global'])
  return complete_config(stated, convention, path)


def _dequantize(tensor: gguf.ReaderTensor, rows: slice, path: Path) -> np.ndarray:
  try:
    out = gguf.quants.dequantize(tensor.data[rows], tensor.tensor_type)
  except Exception as e:
    raise CheckpointError(f'{path}: cannot dequantize {tensor.name} '
                          f'({tensor.tensor_type.name}): {type(e).__name__}: {e}') from e
  return np.asarray(out, np.float32)


def _convert(tensor: gguf.ReaderTensor, shape: tuple[int, ...], is_matrix: bool,
             path: Path) -> np.ndarray:
  """One GGUF tensor as a float32 array of our `shape` (checked before any dequantizing)."""
  gguf_shape = tuple(int(d) for d in tensor.shape)  # (in, out) for a matrix
  want = (shape[1], shape[0]) if is_matrix else (int(np.prod(shape)),)
  if gguf_shape != want:
    raise CheckpointError(f'{path}: tensor {tensor.name} has shape {gguf_shape}, '
                          f'expected {want} for a model of this config')
  if not is_matrix:
    return np.array(_dequantize(tensor, slice(None), path)).reshape(shape)
  num_out, num_in = shape
  out_OxI = np.empty((num_out, num_in), np.float32)
  for start in range(0, num_out, _ROWS_PER_BLOCK):
    block = slice(start, min(start + _ROWS_PER_BLOCK, num_out))
    out_OxI[block] = _dequantize(tensor, block, path).reshape(-1, num_in)
  return out_OxI


def gguf_params(reader: gguf.GGUFReader, config: GemmaConfig,
                path: str | os.PathLike) -> dict[str, Any]:
  """Every tensor of the model, dequantized to float32 and laid out as our tree."""
  path = Path(path)
  by_name = {t.name: t for t in reader.tensors}
  names = tensor_names(config)
  missing = sorted(set(names) - set(by_name))
  if missing:
    raise CheckpointError(f'{path}: GGUF lacks tensors {missing[:8]}'
                          + (f' and {len(missing) - 8} more' if len(missing) > 8 else ''))
  unused = sorted(set(by_name) - set(names))
  if unused:
    logging.warning('%s: ignoring GGUF tensors %s', path, unused)
  shapes = param_tree.expected_shapes(config)
  flat = {}
  for name, (leaf, is_matrix) in names.items():
    flat[leaf] = _convert(by_name[name], shapes[leaf], is_matrix, path)
  params = param_tree.unflatten(flat)
  param_tree.check_params(params, config, path)
  return params


_METADATA_PREFIXES = ('general.', 'tokenizer.ggml.')


def gguf_metadata(reader: gguf.GGUFReader, path: str | os.PathLike) -> dict[str, Any]:
  """The `general.*` and `tokenizer.ggml.*` fields as plain Python values."""
  return {key: _value(reader, key, Path(path)) for key in reader.fields
          if key.startswith(_METADATA_PREFIXES)}


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """The tokenizer and general metadata of a GGUF (token list, scores, special ids, ...),
  as `gguf_metadata` gives them, read by walking the header (`gguf_header`), not by
  GGUFReader, which parses every field (13 s for Gemma 3's vocabulary against 0.3 s)."""
  path = Path(path)
  if not path.is_file():
    raise CheckpointError(f'{path}: no such GGUF file')
  return gguf_header.read_fields(path, _METADATA_PREFIXES)


def load_gguf(path: str | os.PathLike) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, float32 numpy params) from a GGUF, without caching (see weight_cache)."""
  reader = open_gguf(path)
  config = gguf_config(reader, path)
  return config, gguf_params(reader, config, path)
