"""Checkpoint loaders, round-tripping a tiny random Gemma through every format.

The writers below spell out each format's tensor names and layouts on their
own (they do not reuse the loaders' tables), so a naming or transposition
mistake in a loader shows up as a mismatch, and the forward-pass tests show
that what was loaded computes the same logits as the original parameters.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import re
import shutil
import threading
import types

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from specjax import checkpoints
from specjax.checkpoints import gguf_loader
from specjax.checkpoints import orbax_io
from specjax.checkpoints import param_tree
from specjax.checkpoints import safetensors_loader
from specjax.checkpoints import weight_cache
from specjax.checkpoints.errors import CheckpointError
from specjax.models import gemma
from specjax.models import kv_cache
from specjax.models.config import GemmaConfig, tiny_config

Q = gguf.GGMLQuantizationType

# Orbax's restore, failing on damaged data, leaves an asyncio callback that
# fires on a closed event loop, sometimes during a later test.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@pytest.fixture(scope='module')
def tiny() -> tuple[GemmaConfig, dict]:
  """A tiny Gemma 3 whose norm scales are random too, so the (1 + w) shift is tested."""
  config = tiny_config()
  params = jax.tree.map(np.asarray, gemma.init_params(config, jax.random.key(0)))
  rng = np.random.default_rng(0)
  flat = {name: (1.0 + 0.3 * rng.standard_normal(x.shape)).astype(np.float32)
          if name.endswith('.scale') else x for name, x in param_tree.flatten(params).items()}
  return config, param_tree.unflatten(flat)


def _logits(config: GemmaConfig, params: dict) -> np.ndarray:
  tokens_BxT = jnp.array([[2, 7, 11, 3, 60, 5, 5, 9, 1, 33]], jnp.int32)
  positions_BxT = jnp.arange(tokens_BxT.shape[1], dtype=jnp.int32)[None]
  cache = kv_cache.init(config, batch=1, num_slots=16)
  out = gemma.Transformer(config).apply({'params': params}, tokens_BxT, positions_BxT, cache)
  return np.asarray(out.logits_BxRxV)


def _names(*parts: object) -> str:
  """A pattern matching an error message that mentions each part, in order."""
  return '.*'.join(re.escape(str(p)) for p in parts)


def _assert_trees_close(got: dict, want: dict, atol: float = 0.0) -> None:
  got_flat, want_flat = param_tree.flatten(got), param_tree.flatten(want)
  assert sorted(got_flat) == sorted(want_flat)
  for name, x in want_flat.items():
    assert got_flat[name].dtype == np.float32, name
    np.testing.assert_allclose(got_flat[name], x, rtol=0, atol=atol, err_msg=name)


# --- GGUF -------------------------------------------------------------------------------------

def _gguf_tensors(config: GemmaConfig, params: dict) -> dict[str, np.ndarray]:
  """llama.cpp's names, each matrix stored (out, in)."""
  out = {'token_embd.weight': params['embedding_VxD'],
         'output_norm.weight': params['final_norm']['scale']}
  for i in range(config.num_layers):
    layer = params[f'layer_{i}']
    attn, mlp = layer['attn'], layer['mlp']
    out.update({
        f'blk.{i}.attn_norm.weight': layer['pre_attention_norm']['scale'],
        f'blk.{i}.post_attention_norm.weight': layer['post_attention_norm']['scale'],
        f'blk.{i}.ffn_norm.weight': layer['pre_ffw_norm']['scale'],
        f'blk.{i}.post_ffw_norm.weight': layer['post_ffw_norm']['scale'],
        f'blk.{i}.attn_q.weight': attn['q_NHxD'],
        f'blk.{i}.attn_k.weight': attn['k_KHxD'],
        f'blk.{i}.attn_v.weight': attn['v_KHxD'],
        f'blk.{i}.attn_output.weight': attn['o_DxNH'],
        f'blk.{i}.ffn_gate.weight': mlp['gate_FxD'],
        f'blk.{i}.ffn_up.weight': mlp['up_FxD'],
        f'blk.{i}.ffn_down.weight': mlp['down_DxF'],
    })
    if config.use_qk_norm:
      out[f'blk.{i}.attn_q_norm.weight'] = attn['query_norm']['scale']
      out[f'blk.{i}.attn_k_norm.weight'] = attn['key_norm']['scale']
  return {name: np.ascontiguousarray(x, np.float32) for name, x in out.items()}


def _add_sizes(writer: gguf.GGUFWriter, config: GemmaConfig) -> None:
  """The size keys every Gemma GGUF states."""
  writer.add_block_count(config.num_layers)
  writer.add_context_length(config.max_position)
  writer.add_embedding_length(config.embed_dim)
  writer.add_feed_forward_length(config.hidden_dim)
  writer.add_head_count(config.num_heads)
  writer.add_head_count_kv(config.num_kv_heads)
  writer.add_key_length(config.head_dim)


def _finish(writer: gguf.GGUFWriter) -> None:
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def test_gguf_metadata_read_from_the_header_equals_gguf_readers(tiny, tmp_path):
  """The header walk the tokenizer reads (`read_gguf_metadata`, 0.3 s for Gemma 3's
  vocabulary) decodes every kind of field as GGUFReader's `contents()` does (13 s):
  strings, string / float / int / bool arrays, scalars of each width, nested arrays;
  a file cut inside the vocabulary is an error naming it."""
  config, params = tiny
  path = tmp_path / 'kinds.gguf'
  write_gguf(path, config, params, extra=lambda writer: [
      writer.add_array('general.tags', ['a', 'bé', '']),
      writer.add_array('general.nested', [[1, 2], [3]]),
      writer.add_array('tokenizer.ggml.merges', ['t o', 'to k']),
      writer.add_uint8('general.u8', 7), writer.add_int16('general.i16', -3),
      writer.add_uint64('general.u64', 1 << 40), writer.add_float64('general.f64', 0.1),
      writer.add_float32('general.f32', 1e-6), writer.add_bool('general.flag', False),
      writer.add_array('general.flags', [True, False])])
  fast = gguf_loader.read_gguf_metadata(path)
  slow = gguf_loader.gguf_metadata(gguf.GGUFReader(path), path)
  assert fast == slow and list(fast) == list(slow)
  for key, value in slow.items():
    assert type(fast[key]) is type(value), key
    if isinstance(value, list) and value:
      assert type(fast[key][0]) is type(value[0]), key
  assert fast['general.tags'] == ['a', 'bé', '']
  assert fast['general.nested'] == [1, 2, 3]   # GGUFReader flattens nested arrays; so do we
  cut = tmp_path / 'cut.gguf'
  cut.write_bytes(path.read_bytes()[:400])
  with pytest.raises(CheckpointError, match='cut.gguf'):
    gguf_loader.read_gguf_metadata(cut)


def write_gguf(path: Path, config: GemmaConfig, params: dict, types: dict[str, Q] | None = None,
               arch: str = 'gemma3', drop: tuple[str, ...] = (),
               replace: dict[str, np.ndarray] | None = None, extra=None) -> dict[str, np.ndarray]:
  """Writes a GGUF as llama.cpp would; returns what each tensor decodes to (after quantizing).
  `extra(writer)` adds more metadata fields."""
  writer = gguf.GGUFWriter(path, arch=arch)
  _add_sizes(writer, config)
  writer.add_value_length(config.head_dim)
  writer.add_sliding_window(config.sliding_window)
  writer.add_sliding_window_pattern(config.global_every)
  writer.add_rope_freq_base(config.rope_base_global)
  writer.add_rope_freq_base_swa(config.rope_base_local)
  writer.add_layer_norm_rms_eps(config.rms_norm_eps)
  writer.add_tokenizer_model('llama')
  writer.add_token_list([f'tok{i}' for i in range(config.vocab_size)])
  writer.add_token_scores([float(-i) for i in range(config.vocab_size)])
  writer.add_token_types([1] * config.vocab_size)
  writer.add_bos_token_id(2)
  writer.add_eos_token_id(1)
  writer.add_add_bos_token(True)
  writer.add_name('tiny test model')
  if extra is not None:
    extra(writer)
  decoded = {}
  tensors = {**_gguf_tensors(config, params), **(replace or {})}
  for name, value in tensors.items():
    if name in drop:
      continue
    kind = (types or {}).get(name, Q.F32)
    if kind == Q.F32:
      writer.add_tensor(name, value)
    elif kind == Q.F16:
      writer.add_tensor(name, value.astype(np.float16))
    else:
      writer.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
    decoded[name] = gguf.quants.dequantize(gguf.quants.quantize(value, kind), kind)
  _finish(writer)
  return decoded


# Every storage type the gguf package can write, spread over layer 0 (layer 1+ stay F32).
MIXED_TYPES = {
    'token_embd.weight': Q.Q8_0,
    'blk.0.attn_q.weight': Q.F16,
    'blk.0.attn_k.weight': Q.BF16,
    'blk.0.attn_v.weight': Q.Q8_0,
    'blk.0.attn_output.weight': Q.Q5_0,
    'blk.0.ffn_gate.weight': Q.Q4_0,
    'blk.0.ffn_up.weight': Q.Q5_1,
    'blk.0.ffn_down.weight': Q.Q4_1,
    'blk.0.attn_q_norm.weight': Q.F16,
}


def test_gguf_f32_round_trip_is_exact(tiny, tmp_path):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  got_config, got = gguf_loader.load_gguf(path)
  assert got_config == config
  _assert_trees_close(got, params)
  np.testing.assert_array_equal(_logits(config, got), _logits(config, params))


def test_gguf_quantized_tensors_decode_into_place(tiny, tmp_path, monkeypatch):
  config, params = tiny
  monkeypatch.setattr(gguf_loader, '_ROWS_PER_BLOCK', 5)  # several blocks, the last one partial
  path = tmp_path / 'mixed.gguf'
  decoded = write_gguf(path, config, params, MIXED_TYPES)
  got_config, got = gguf_loader.load_gguf(path)
  assert got_config == config
  # Laid out again as GGUF tensors by the writer's own mapping, the loaded
  # params are exactly what each stored tensor decodes to.
  relaid = _gguf_tensors(config, got)
  assert sorted(relaid) == sorted(decoded)
  for name, value in decoded.items():
    np.testing.assert_array_equal(relaid[name], value, err_msg=name)
  # And quantization moved no tensor by more than its type's resolution.
  want = _gguf_tensors(config, params)
  for name, kind in MIXED_TYPES.items():
    resolution = {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 1e-2}.get(kind, 0.2)
    np.testing.assert_allclose(relaid[name], want[name], rtol=0,
                               atol=resolution * np.abs(want[name]).max(), err_msg=name)


def test_gguf_config_uses_llama_cpp_conventions_for_unstated_fields(tmp_path):
  # Gemma 2 GGUFs state neither the pattern nor the local RoPE base nor the query scale.
  config = tiny_config(family='gemma2', use_qk_norm=False, global_every=2, attn_logit_softcap=50.0,
                       final_logit_softcap=30.0, rope_base_local=10_000.0)
  params = jax.tree.map(np.asarray, gemma.init_params(config, jax.random.key(1)))
  writer = gguf.GGUFWriter(tmp_path / 'g2.gguf', arch='gemma2')
  _add_sizes(writer, config)
  writer.add_sliding_window(config.sliding_window)
  writer.add_layer_norm_rms_eps(config.rms_norm_eps)
  writer.add_attn_logit_softcapping(50.0)
  writer.add_final_logit_softcapping(30.0)
  writer.add_token_list([f't{i}' for i in range(config.vocab_size)])
  for name, value in _gguf_tensors(config, params).items():
    writer.add_tensor(name, value)
  _finish(writer)
  got_config, got = gguf_loader.load_gguf(tmp_path / 'g2.gguf')
  assert got_config == config
  _assert_trees_close(got, params)


def test_gguf_metadata_is_plain_python(tiny, tmp_path):
  config, params = tiny
  write_gguf(tmp_path / 'tiny.gguf', config, params)
  metadata = gguf_loader.read_gguf_metadata(tmp_path / 'tiny.gguf')
  assert metadata['general.architecture'] == 'gemma3'
  assert metadata['general.name'] == 'tiny test model'
  assert metadata['tokenizer.ggml.tokens'] == [f'tok{i}' for i in range(config.vocab_size)]
  assert metadata['tokenizer.ggml.scores'][:3] == [0.0, -1.0, -2.0]
  assert metadata['tokenizer.ggml.bos_token_id'] == 2
  assert metadata['tokenizer.ggml.add_bos_token'] is True
  assert not any(key.startswith('gemma3.') for key in metadata)
  json.dumps(metadata)  # plain values only


@pytest.mark.parametrize('damage', ['not_gguf', 'truncated_half', 'truncated_header'])
def test_damaged_gguf_raises_naming_the_file(tiny, tmp_path, damage):
  config, params = tiny
  path = tmp_path / 'bad.gguf'
  write_gguf(path, config, params)
  data = path.read_bytes()
  path.write_bytes({'not_gguf': b'PK\x03\x04 this is a zip, not a GGUF' * 10,
                    'truncated_half': data[:len(data) // 2],
                    'truncated_header': data[:40]}[damage])
  with pytest.raises(CheckpointError, match=_names(path)):
    gguf_loader.load_gguf(path)
  with pytest.raises(CheckpointError, match=_names(path)):
    checkpoints.load_checkpoint(path, cache_dir=tmp_path / 'cache')


def test_gguf_missing_tensor_wrong_shape_and_arch_raise(tiny, tmp_path):
  config, params = tiny
  missing = tmp_path / 'missing.gguf'
  write_gguf(missing, config, params, drop=('blk.1.ffn_up.weight',))
  with pytest.raises(CheckpointError, match=_names(missing, 'blk.1.ffn_up.weight')):
    gguf_loader.load_gguf(missing)
  wrong = tmp_path / 'wrong.gguf'
  write_gguf(wrong, config, params,
             replace={'blk.2.attn_q.weight': np.zeros((config.embed_dim,) * 2, np.float32)})
  with pytest.raises(CheckpointError, match=_names(wrong, 'blk.2.attn_q.weight')):
    gguf_loader.load_gguf(wrong)
  llama = tmp_path / 'llama.gguf'
  write_gguf(llama, config, params, arch='llama')
  with pytest.raises(CheckpointError, match=_names(llama, "'llama'")):
    gguf_loader.load_gguf(llama)
  with pytest.raises(CheckpointError, match='nowhere.gguf'):
    gguf_loader.load_gguf(tmp_path / 'nowhere.gguf')


# --- Weight cache ----------------------------------------------------------------------------

class _CountingReader:
  """Wraps gguf.GGUFReader to count how often a GGUF is opened."""

  def __init__(self, monkeypatch):
    self.opens = 0
    real = gguf.GGUFReader

    def reader(*args, **kwargs):
      self.opens += 1
      return real(*args, **kwargs)
    monkeypatch.setattr(gguf, 'GGUFReader', reader)


def test_cache_second_load_skips_the_gguf(tiny, tmp_path, monkeypatch):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params, MIXED_TYPES)
  reader = _CountingReader(monkeypatch)
  cold_config, cold = weight_cache.load_gguf_cached(path, tmp_path / 'cache')
  assert reader.opens == 1
  warm_config, warm = weight_cache.load_gguf_cached(path, tmp_path / 'cache')
  assert reader.opens == 1
  assert warm_config == cold_config == config
  assert all(isinstance(x, np.memmap) for x in jax.tree.leaves(warm))
  cached_metadata = weight_cache.read_gguf_metadata_cached(path, tmp_path / 'cache')
  assert reader.opens == 1
  _assert_trees_close(warm, cold)
  _assert_trees_close(warm, gguf_loader.load_gguf(path)[1])
  assert cached_metadata == gguf_loader.read_gguf_metadata(path)


def _two_at_once(build, monkeypatch, module, name):
  """Runs `build()` on two threads that both find the cache entry missing, the second
  starting while the first is inside `module.name` (made to wait); returns the number of
  calls of `module.name`, the two results and any errors. A second loader that does not
  wait for the first converts too (two calls); one that deletes the first's entry makes
  the first fail reading it back."""
  inside, release, calls = threading.Event(), threading.Event(), []
  real = getattr(module, name)

  def held(*args, **kwargs):
    calls.append(1)
    inside.set()
    release.wait(30)
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, held)
  results, errors = [None, None], []

  def run(i):
    try:
      results[i] = build()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
  threads[0].start()
  assert inside.wait(30)
  threads[1].start()
  threads[1].join(0.5)   # time to reach the conversion, were it not waiting for the first
  release.set()
  for t in threads:
    t.join(60)
  return len(calls), results, errors


def test_two_loaders_of_a_fresh_cache_convert_once(tiny, tmp_path, monkeypatch):
  """The suite's two workers on a fresh machine both load a checkpoint into an empty
  cache: one converts it, the other waits and reads the entry the first wrote."""
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  calls, results, errors = _two_at_once(
      lambda: weight_cache.load_gguf_cached(path, tmp_path / 'cache'), monkeypatch,
      gguf_loader, 'gguf_params')
  assert not errors and calls == 1
  for got_config, got in results:
    assert got_config == config
    _assert_trees_close(got, params)


def test_cache_dir_comes_from_the_environment(tiny, tmp_path, monkeypatch):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  monkeypatch.setenv(weight_cache.CACHE_DIR_ENV, str(tmp_path / 'env_cache'))
  weight_cache.load_gguf_cached(path)
  entry = weight_cache.entry_dir(weight_cache.file_sha256(path))
  assert entry.parent == tmp_path / 'env_cache'
  assert (entry / weight_cache.COMPLETE_MARKER).is_file()
  assert entry.name.endswith(weight_cache.file_sha256(path))


def test_interrupted_cache_entry_is_rebuilt(tiny, tmp_path, monkeypatch):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  cache = tmp_path / 'cache'
  first = jax.tree.map(np.array, weight_cache.load_gguf_cached(path, cache)[1])  # off the mmap
  entry = weight_cache.entry_dir(weight_cache.file_sha256(path, cache), cache)
  # An interrupted write: no marker, and a leaf cut short.
  (entry / weight_cache.COMPLETE_MARKER).unlink()
  leaf = entry / 'params' / 'embedding_VxD.npy'
  leaf.write_bytes(leaf.read_bytes()[:100])
  reader = _CountingReader(monkeypatch)
  _, rebuilt = weight_cache.load_gguf_cached(path, cache)
  assert reader.opens == 1
  assert (entry / weight_cache.COMPLETE_MARKER).is_file()
  _assert_trees_close(rebuilt, first)
  _assert_trees_close(rebuilt, params)


def test_cache_entry_damaged_in_place_is_detected_and_rebuilt(tiny, tmp_path, monkeypatch,
                                                              caplog):
  """Bytes overwritten inside a cached leaf (same size, header intact, mtime kept)
  would load as silently wrong weights; the recorded digests catch them."""
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  cache = tmp_path / 'cache'
  weight_cache.load_gguf_cached(path, cache)
  entry = weight_cache.entry_dir(weight_cache.file_sha256(path, cache), cache)
  leaf = entry / 'params' / 'embedding_VxD.npy'
  stat = leaf.stat()
  with leaf.open('r+b') as f:
    f.seek(stat.st_size // 2)
    f.write(b'\0' * 64)
  os.utime(leaf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  reader = _CountingReader(monkeypatch)
  _, got = weight_cache.load_gguf_cached(path, cache)
  assert reader.opens == 1, 'the damaged entry must be rebuilt from the GGUF'
  assert 'embedding_VxD.npy does not match the digest' in caplog.text
  _assert_trees_close(got, params)
  _, again = weight_cache.load_gguf_cached(path, cache)  # the rebuilt entry verifies
  assert reader.opens == 1


def test_a_rewritten_gguf_is_rehashed_even_with_its_mtime_restored(tiny, tmp_path):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params)
  cache = tmp_path / 'cache'
  before = weight_cache.file_sha256(path, cache)
  stat = path.stat()
  with path.open('r+b') as f:  # same size, new bytes, old mtime
    f.seek(stat.st_size - 8)
    f.write(b'\xff' * 8)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert weight_cache.file_sha256(path, cache) != before


def test_cache_is_keyed_by_content(tiny, tmp_path):
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  cache = tmp_path / 'cache'
  write_gguf(path, config, params)
  weight_cache.load_gguf_cached(path, cache)
  other = jax.tree.map(lambda x: x * 2, params)
  write_gguf(path, config, other)  # same path, new content
  os.utime(path, ns=(0, 1))  # and a new mtime even on coarse clocks
  _, got = weight_cache.load_gguf_cached(path, cache)
  _assert_trees_close(got, other)
  assert len([p for p in cache.iterdir() if p.name.startswith('params-')]) == 2


# --- Hugging Face safetensors ----------------------------------------------------------------

def hf_config_json(config: GemmaConfig) -> dict:
  return {
      'architectures': ['Gemma3ForCausalLM'], 'model_type': 'gemma3_text',
      'hidden_size': config.embed_dim, 'intermediate_size': config.hidden_dim,
      'num_hidden_layers': config.num_layers, 'num_attention_heads': config.num_heads,
      'num_key_value_heads': config.num_kv_heads, 'head_dim': config.head_dim,
      'vocab_size': config.vocab_size, 'sliding_window': config.sliding_window,
      'layer_types': ['full_attention' if kind == 'global' else 'sliding_attention'
                      for kind in config.attention_kinds],
      'rope_theta': config.rope_base_global, 'rope_local_base_freq': config.rope_base_local,
      'rope_scaling': None, 'query_pre_attn_scalar': config.query_pre_attn_scalar,
      'attn_logit_softcapping': None, 'final_logit_softcapping': None,
      'rms_norm_eps': config.rms_norm_eps, 'max_position_embeddings': config.max_position,
      'hidden_activation': 'gelu_pytorch_tanh', 'torch_dtype': 'bfloat16'}


def hf_tensors(config: GemmaConfig, params: dict, prefix: str = 'model.') -> dict[str, np.ndarray]:
  """transformers' names; Linear weights (out, in); norms store w of Gemma's (1 + w)."""
  out = {f'{prefix}embed_tokens.weight': params['embedding_VxD'],
         f'{prefix}norm.weight': params['final_norm']['scale'] - 1}
  for i in range(config.num_layers):
    layer = params[f'layer_{i}']
    attn, mlp = layer['attn'], layer['mlp']
    p = f'{prefix}layers.{i}.'
    out.update({
        p + 'input_layernorm.weight': layer['pre_attention_norm']['scale'] - 1,
        p + 'post_attention_layernorm.weight': layer['post_attention_norm']['scale'] - 1,
        p + 'pre_feedforward_layernorm.weight': layer['pre_ffw_norm']['scale'] - 1,
        p + 'post_feedforward_layernorm.weight': layer['post_ffw_norm']['scale'] - 1,
        p + 'self_attn.q_proj.weight': attn['q_NHxD'],
        p + 'self_attn.k_proj.weight': attn['k_KHxD'],
        p + 'self_attn.v_proj.weight': attn['v_KHxD'],
        p + 'self_attn.o_proj.weight': attn['o_DxNH'],
        p + 'self_attn.q_norm.weight': attn['query_norm']['scale'] - 1,
        p + 'self_attn.k_norm.weight': attn['key_norm']['scale'] - 1,
        p + 'mlp.gate_proj.weight': mlp['gate_FxD'],
        p + 'mlp.up_proj.weight': mlp['up_FxD'],
        p + 'mlp.down_proj.weight': mlp['down_DxF'],
    })
  return {name: np.ascontiguousarray(x) for name, x in out.items()}


def write_hf(directory: Path, config: GemmaConfig, params: dict, dtype=np.float32,
             num_shards: int = 3, prefix: str = 'model.', hf_config: dict | None = None) -> Path:
  directory.mkdir(parents=True)
  (directory / 'config.json').write_text(json.dumps(hf_config or hf_config_json(config)))
  tensors = {k: v.astype(dtype) for k, v in hf_tensors(config, params, prefix).items()}
  if num_shards == 1:
    safetensors.numpy.save_file(tensors, directory / 'model.safetensors')
    return directory
  names = sorted(tensors)
  weight_map = {}
  for s in range(num_shards):
    shard = f'model-{s + 1:05d}-of-{num_shards:05d}.safetensors'
    part = names[s::num_shards]
    safetensors.numpy.save_file({n: tensors[n] for n in part}, directory / shard)
    weight_map.update({n: shard for n in part})
  (directory / 'model.safetensors.index.json').write_text(
      json.dumps({'metadata': {'total_size': 0}, 'weight_map': weight_map}))
  return directory


def test_safetensors_sharded_f32_round_trip_is_exact(tiny, tmp_path):
  config, params = tiny
  directory = write_hf(tmp_path / 'hf', config, params)
  got_config, got = safetensors_loader.load_safetensors(directory)
  assert got_config == config
  _assert_trees_close(got, params, atol=1e-6)  # the norms' +1/-1 rounds
  np.testing.assert_allclose(_logits(config, got), _logits(config, params), atol=1e-4)


def test_safetensors_bf16_multimodal_layout(tiny, tmp_path):
  config, params = tiny
  hf = {'model_type': 'gemma3', 'architectures': ['Gemma3ForConditionalGeneration'],
        'text_config': hf_config_json(config), 'vision_config': {'hidden_size': 8}}
  directory = write_hf(tmp_path / 'mm', config, params, ml_dtypes.bfloat16, num_shards=1,
                       prefix='language_model.model.', hf_config=hf)
  got_config, got = checkpoints.load_checkpoint(directory)
  assert got_config == config
  want = {n: np.asarray(x, np.float32) for n, x in hf_tensors(config, params).items()}
  flat = param_tree.flatten(got)
  np.testing.assert_array_equal(
      flat['embedding_VxD'],
      want['model.embed_tokens.weight'].astype(ml_dtypes.bfloat16).astype(np.float32))
  _assert_trees_close(got, params, atol=0.02)
  np.testing.assert_allclose(_logits(config, got), _logits(config, params), atol=0.1)


@pytest.mark.parametrize('damage', ['missing_shard', 'missing_tensor', 'wrong_shape',
                                    'corrupt_header', 'no_config'])
def test_damaged_safetensors_raise_naming_the_file(tiny, tmp_path, damage):
  config, params = tiny
  directory = write_hf(tmp_path / 'hf', config, params)
  shard = directory / 'model-00002-of-00003.safetensors'
  index = directory / 'model.safetensors.index.json'
  if damage == 'missing_shard':
    shard.unlink()
    culprit = (shard,)
  elif damage == 'missing_tensor':
    weight_map = json.loads(index.read_text())['weight_map']
    del weight_map['model.layers.3.mlp.up_proj.weight']
    index.write_text(json.dumps({'weight_map': weight_map}))
    culprit = (directory, 'model.layers.3.mlp.up_proj.weight')
  elif damage == 'wrong_shape':
    tensors = safetensors.numpy.load_file(shard)
    name = next(n for n in tensors if n.endswith('o_proj.weight'))
    tensors[name] = tensors[name][:, :-1]
    safetensors.numpy.save_file(tensors, shard)
    culprit = (shard, name)
  elif damage == 'corrupt_header':
    shard.write_bytes(b'\xff' * 8 + b'{not json' + shard.read_bytes()[17:])
    culprit = (shard,)
  else:
    (directory / 'config.json').unlink()
    culprit = (directory / 'config.json',)
  with pytest.raises(CheckpointError, match=_names(*culprit)):
    safetensors_loader.load_safetensors(directory)


# --- Orbax -------------------------------------------------------------------------------------

def test_orbax_round_trip_restores_float32(tiny, tmp_path):
  config, params = tiny
  orbax_io.save_orbax(tmp_path / 'ckpt', config, params)
  got_config, got = checkpoints.load_checkpoint(tmp_path / 'ckpt')
  assert got_config == config
  _assert_trees_close(got, params)
  np.testing.assert_array_equal(_logits(config, got), _logits(config, params))
  # bf16 device arrays come back as float32 host arrays.
  orbax_io.save_orbax(tmp_path / 'bf16', config, jax.tree.map(
      lambda x: jnp.asarray(x, jnp.bfloat16), params))
  _, got16 = orbax_io.load_orbax(tmp_path / 'bf16')
  assert all(type(x) is np.ndarray for x in jax.tree.leaves(got16))
  _assert_trees_close(got16, params, atol=0.02)


def test_orbax_missing_or_corrupt_raise(tiny, tmp_path):
  config, params = tiny
  with pytest.raises(CheckpointError, match='nowhere'):
    orbax_io.load_orbax(tmp_path / 'nowhere')
  directory = orbax_io.save_orbax(tmp_path / 'ckpt', config, params)
  with pytest.raises(CheckpointError, match=_names(directory)):
    orbax_io.save_orbax(directory, config, params)  # exists; overwrite=False
  for data in directory.rglob('*'):
    if data.is_file() and data.parent.name == 'd':
      data.write_bytes(b'garbage')
  with pytest.raises(CheckpointError, match=_names(directory)):
    orbax_io.load_orbax(directory)
  (directory / orbax_io.ORBAX_MARKER).unlink()
  with pytest.raises(CheckpointError, match=_names(directory)):
    checkpoints.load_checkpoint(directory)


# --- Dispatcher ------------------------------------------------------------------------------

def test_load_checkpoint_picks_the_loader(tiny, tmp_path):
  config, params = tiny
  write_gguf(tmp_path / 'model.bin', config, params)  # found by its magic, not its name
  write_hf(tmp_path / 'hf', config, params, num_shards=1)
  orbax_io.save_orbax(tmp_path / 'ckpt', config, params)
  for source in (tmp_path / 'model.bin', tmp_path / 'hf', tmp_path / 'hf' / 'model.safetensors',
                 str(tmp_path / 'ckpt')):
    got_config, got = checkpoints.load_checkpoint(source, cache_dir=tmp_path / 'cache')
    assert got_config == config, source
    _assert_trees_close(got, params, atol=1e-6)
  with pytest.raises(CheckpointError, match='nowhere'):
    checkpoints.load_checkpoint(tmp_path / 'nowhere')
  (tmp_path / 'notes.txt').write_text('hello')
  with pytest.raises(CheckpointError, match='notes.txt'):
    checkpoints.load_checkpoint(tmp_path / 'notes.txt')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(CheckpointError, match='empty'):
    checkpoints.load_checkpoint(tmp_path / 'empty')
  with pytest.raises(CheckpointError, match='embedded:gemma9'):
    checkpoints.load_checkpoint('embedded:gemma9')
  shutil.rmtree(tmp_path / 'cache')



# --- Arrays derived from a checkpoint (the int8 forms) ---------------------------------------

def test_derived_arrays_are_made_once_then_read_back(tmp_path, caplog):
  cache, made = tmp_path / 'cache', []
  arrays = {'a.b_q8': np.arange(-64, 64, dtype=np.int8).reshape(2, 64),
            'a.b_q8scale': np.linspace(0.5, 1.0, 4, dtype=np.float32).reshape(2, 2)}

  def make():
    made.append(1)
    return arrays

  first = weight_cache.derived_arrays('forms', 1, 'abc', make, cache)
  again = weight_cache.derived_arrays('forms', 1, 'abc', make, cache)
  assert len(made) == 1
  assert all(isinstance(x, np.memmap) for x in again.values())
  for got in (first, again):
    assert sorted(got) == sorted(arrays)
    for name, value in arrays.items():
      assert got[name].dtype == value.dtype and np.array_equal(got[name], value)
  weight_cache.derived_arrays('forms', 2, 'abc', make, cache)    # another way of making them
  weight_cache.derived_arrays('forms', 1, 'abd', make, cache)    # from another checkpoint
  assert len(made) == 3
  # Damaged in place: the digests catch it and the entry is made again.
  leaf = weight_cache.derived_dir('forms', 1, 'abc', cache) / 'arrays' / 'a.b_q8.npy'
  with leaf.open('r+b') as f:
    f.seek(leaf.stat().st_size - 8)
    f.write(b'\x7f' * 8)
  got = weight_cache.derived_arrays('forms', 1, 'abc', make, cache)
  assert len(made) == 4 and 'a.b_q8.npy does not match the digest' in caplog.text
  assert np.array_equal(got['a.b_q8'], arrays['a.b_q8'])
  with pytest.raises(ValueError, match='plain file names'):
    weight_cache.derived_arrays('forms', 1, 'xyz', lambda: {'../up': arrays['a.b_q8']}, cache)


def test_derived_arrays_made_by_two_at_once_are_made_once(tmp_path, monkeypatch):
  arrays = {'a_q8': np.arange(-64, 64, dtype=np.int8).reshape(2, 64)}
  maker = types.SimpleNamespace(make=lambda: arrays)
  calls, results, errors = _two_at_once(
      lambda: weight_cache.derived_arrays('forms', 1, 'abc', maker.make, tmp_path / 'cache'),
      monkeypatch, maker, 'make')
  assert not errors and calls == 1
  assert all(np.array_equal(got['a_q8'], arrays['a_q8']) for got in results)


def test_the_loader_splits_a_checkpoint_once(tiny, tmp_path, monkeypatch):
  """The int8 forms of a GGUF's matrices are kept beside its weights: a second load reads
  them back instead of splitting, and serves the same params."""
  from specjax.experiments import loading
  from specjax.models import q8_weights
  if not q8_weights.serves():
    pytest.fail('the q8_matmul kernel did not build')
  config, params = tiny
  path = tmp_path / 'tiny.gguf'
  write_gguf(path, config, params, MIXED_TYPES)
  monkeypatch.setenv(weight_cache.CACHE_DIR_ENV, str(tmp_path / 'cache'))
  loading._load.cache_clear()
  _, first = loading._load(str(path), 0, 1, 1)
  assert q8_weights.HEAD_FORM in first   # token_embd is Q8_0
  entries = [p.name for p in (tmp_path / 'cache').iterdir() if p.name.startswith('q8forms-')]
  assert entries == [f'q8forms-v{loading.Q8_FORMS_VERSION}-{weight_cache.file_sha256(path)}']
  loading._load.cache_clear()
  monkeypatch.setattr(q8_weights, 'split', lambda *a: pytest.fail('split again'))
  _, second = loading._load(str(path), 0, 1, 1)
  loading._load.cache_clear()
  flat_first, flat_second = param_tree.flatten(first), param_tree.flatten(second)
  assert sorted(flat_first) == sorted(flat_second)
  for name, value in flat_first.items():
    assert np.array_equal(np.asarray(value), np.asarray(flat_second[name])), name
