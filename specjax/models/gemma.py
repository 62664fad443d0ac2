"""Gemma 2 / Gemma 3 text transformer in pure-functional Flax Linen.

One function serves prefill, one-token decode and the verification of gamma+1
drafted tokens: it takes T new tokens per row at per-row positions, writes
their keys and values into an explicit, preallocated KV cache and returns the
new cache. Nothing is mutable under jit: `Transformer(cfg).apply({'params': p},
tokens, positions, cache)` is a function of its arguments.

Einsum letters: B batch, T new tokens, S cache slots, D width, N query heads,
K key/value heads, G query heads per K head, H head dim, F MLP width, V vocab.

Parameter layouts are (in, out) throughout, the tied embedding included
(`embedding_DxV`): on CPU, XLA's skinny matmuls x[T,D] @ W[D,V] are faster
than with W stored (V, D) for T >= 2, which is what a verify step needs.
Norm `scale`s hold the full multiplier (Gemma's 1 + w), as GGUF files do.

Sharding: called with `model_axis` inside `shard_map`, every parameter is the
local shard (heads, MLP width and vocabulary split over that axis; K/V heads
replicated when fewer than the axis size) and the partial results are summed
with `psum`. Without `model_axis` it is the plain single-device model.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.models import kv_cache as kv_cache_lib
from specjax.models.config import GemmaConfig

Array = jax.Array
Cache = kv_cache_lib.Cache

_NEG_INF = -2.3819763e38  # a large finite negative that survives softcap and bf16


def rms_norm(x: Array, scale: Array, eps: float) -> Array:
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  scale = scale.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))
  return (normed * scale).astype(x.dtype)


class RMSNorm(nn.Module):
  eps: float

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return rms_norm(x, scale, self.eps)


def apply_rope(x_BxTxNxH: Array, positions_BxT: Array, base: float, scale: float = 1.0) -> Array:
  """Rotary embedding, split-half ("NeoX") convention as Gemma uses it."""
  half = x_BxTxNxH.shape[-1] // 2
  inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / (2 * half)))
  angles_BxTxH2 = (positions_BxT[..., None].astype(jnp.float32) / scale) * inv_freq[None, None]
  sin = jnp.sin(angles_BxTxH2)[:, :, None, :]
  cos = jnp.cos(angles_BxTxH2)[:, :, None, :]
  x32 = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def attention_mask(positions_BxT: Array, num_slots: int, window: int | None) -> Array:
  """Which cache slots each new token may attend to; slot s holds position s.

  Slots past a query's own position hold stale or unwritten entries (rejected
  drafts, padding) and are hidden by causality, so a rollback costs nothing.
  """
  slots_S = jnp.arange(num_slots)
  q_BxTx1 = positions_BxT[:, :, None]
  mask_BxTxS = slots_S[None, None, :] <= q_BxTx1
  if window is not None:
    mask_BxTxS &= slots_S[None, None, :] > q_BxTx1 - window
  return mask_BxTxS


def _model_rank(model_axis: str | None) -> Array | int:
  return 0 if model_axis is None else jax.lax.axis_index(model_axis)


def local_kv_heads(config: GemmaConfig, model_shards: int) -> int:
  """K/V heads per 'model' shard: split when they divide evenly, else replicated."""
  return config.num_kv_heads // model_shards if config.num_kv_heads % model_shards == 0 \
      else config.num_kv_heads


class Attention(nn.Module):
  config: GemmaConfig
  kind: str  # 'global' or 'local'
  model_axis: str | None = None
  model_shards: int = 1

  @nn.compact
  def __call__(self, x_BxTxD: Array, positions_BxT: Array, layer_cache: dict[str, Array]):
    cfg = self.config
    init = nn.initializers.normal(0.2)
    num_q = cfg.num_heads // self.model_shards
    num_kv = local_kv_heads(cfg, self.model_shards)
    q_DxNxH = self.param('q_DxNxH', init, (cfg.embed_dim, num_q, cfg.head_dim))
    k_DxKxH = self.param('k_DxKxH', init, (cfg.embed_dim, num_kv, cfg.head_dim))
    v_DxKxH = self.param('v_DxKxH', init, (cfg.embed_dim, num_kv, cfg.head_dim))
    o_NxHxD = self.param('o_NxHxD', init, (num_q, cfg.head_dim, cfg.embed_dim))

    q = jnp.einsum('btd,dnh->btnh', x_BxTxD, q_DxNxH)
    k = jnp.einsum('btd,dkh->btkh', x_BxTxD, k_DxKxH)
    v = jnp.einsum('btd,dkh->btkh', x_BxTxD, v_DxKxH)
    if cfg.use_qk_norm:
      q = RMSNorm(cfg.rms_norm_eps, name='query_norm')(q)
      k = RMSNorm(cfg.rms_norm_eps, name='key_norm')(k)
    if self.kind == 'global':
      base, scale = cfg.rope_base_global, cfg.rope_scale_global
    else:
      base, scale = cfg.rope_base_local, 1.0
    q = apply_rope(q, positions_BxT, base, scale) * (cfg.query_pre_attn_scalar ** -0.5)
    k = apply_rope(k, positions_BxT, base, scale)

    layer_cache = kv_cache_lib.write(layer_cache, k, v, positions_BxT[:, 0])
    k_BxSxKxH, v_BxSxKxH = layer_cache['k'], layer_cache['v']

    # Under shard_map the local shard may hold fewer query heads than K/V heads
    # are replicated for: pick, for each local query head, its K/V head.
    n_local, k_local = q.shape[2], k_BxSxKxH.shape[2]
    if k_local * (cfg.num_heads // n_local) != cfg.num_kv_heads and k_local > 1:
      group = cfg.num_heads // cfg.num_kv_heads
      kv_idx = (_model_rank(self.model_axis) * n_local + jnp.arange(n_local)) // group
      k_BxSxKxH = jnp.take(k_BxSxKxH, kv_idx, axis=2)
      v_BxSxKxH = jnp.take(v_BxSxKxH, kv_idx, axis=2)
      k_local = n_local
    b, t = q.shape[:2]
    q_BxTxKxGxH = q.reshape(b, t, k_local, n_local // k_local, cfg.head_dim)

    logits = jnp.einsum('btkgh,bskh->bkgts', q_BxTxKxGxH, k_BxSxKxH,
                        preferred_element_type=jnp.float32)
    if cfg.attn_logit_softcap is not None:
      logits = jnp.tanh(logits / cfg.attn_logit_softcap) * cfg.attn_logit_softcap
    window = cfg.sliding_window if self.kind == 'local' else None
    mask_BxTxS = attention_mask(positions_BxT, k_BxSxKxH.shape[1], window)
    logits = jnp.where(mask_BxTxS[:, None, None], logits, _NEG_INF)
    probs = jax.nn.softmax(logits, axis=-1).astype(v_BxSxKxH.dtype)
    out = jnp.einsum('bkgts,bskh->btkgh', probs, v_BxSxKxH).reshape(b, t, n_local, cfg.head_dim)
    out_BxTxD = jnp.einsum('btnh,nhd->btd', out, o_NxHxD)
    if self.model_axis is not None:
      out_BxTxD = jax.lax.psum(out_BxTxD, self.model_axis)
    return out_BxTxD, layer_cache


class MLP(nn.Module):
  config: GemmaConfig
  model_axis: str | None = None
  model_shards: int = 1

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    cfg = self.config
    init = nn.initializers.normal(0.2)
    hidden = cfg.hidden_dim // self.model_shards
    gate_DxF = self.param('gate_DxF', init, (cfg.embed_dim, hidden))
    up_DxF = self.param('up_DxF', init, (cfg.embed_dim, hidden))
    down_FxD = self.param('down_FxD', init, (hidden, cfg.embed_dim))
    h = jax.nn.gelu(x_BxTxD @ gate_DxF, approximate=True) * (x_BxTxD @ up_DxF)
    out = h @ down_FxD
    if self.model_axis is not None:
      out = jax.lax.psum(out, self.model_axis)
    return out


class Block(nn.Module):
  config: GemmaConfig
  kind: str
  model_axis: str | None = None
  model_shards: int = 1

  @nn.compact
  def __call__(self, x: Array, positions_BxT: Array, layer_cache: dict[str, Array]):
    eps = self.config.rms_norm_eps
    h = RMSNorm(eps, name='pre_attention_norm')(x)
    h, layer_cache = Attention(self.config, self.kind, self.model_axis, self.model_shards,
                               name='attn')(
        h, positions_BxT, layer_cache)
    x = x + RMSNorm(eps, name='post_attention_norm')(h)
    h = RMSNorm(eps, name='pre_ffw_norm')(x)
    h = MLP(self.config, self.model_axis, self.model_shards, name='mlp')(h)
    return x + RMSNorm(eps, name='post_ffw_norm')(h), layer_cache


class Transformer(nn.Module):
  """Gemma decoder over an explicit KV cache.

  __call__(tokens_BxT, positions_BxT, cache, logit_indices_BxR=None, num_layers=None)
  returns (logits_BxRxV, new_cache). `positions_BxT` must be consecutive in
  each row (T new tokens starting at the row's own offset). `logit_indices_BxR`
  picks which of the T outputs get the (costly, V-wide) head; None means all.
  `num_layers` runs only the first layers, then the final norm and head: the
  early-exit drafter.
  """

  config: GemmaConfig
  model_axis: str | None = None
  model_shards: int = 1  # the size of `model_axis`; parameters are that axis's local shards

  @nn.compact
  def __call__(self, tokens_BxT: Array, positions_BxT: Array, cache: Cache,
               logit_indices_BxR: Array | None = None, num_layers: int | None = None):
    cfg = self.config
    embedding_DxV = self.param('embedding_DxV', nn.initializers.normal(cfg.embed_dim ** -0.5),
                               (cfg.embed_dim, cfg.vocab_size // self.model_shards))
    x_BxTxD = embed(embedding_DxV, tokens_BxT, self.model_axis)
    x_BxTxD = x_BxTxD * jnp.asarray(math.sqrt(cfg.embed_dim), x_BxTxD.dtype)

    depth = cfg.num_layers if num_layers is None else num_layers
    new_cache = list(cache)
    for i in range(depth):
      x_BxTxD, new_cache[i] = Block(cfg, cfg.attention_kind(i), self.model_axis,
                                    self.model_shards, name=f'layer_{i}')(
                                        x_BxTxD, positions_BxT, cache[i])
    if depth < cfg.num_layers and self.is_initializing():
      # Create the remaining layers' parameters so init always yields the full model.
      for i in range(depth, cfg.num_layers):
        Block(cfg, cfg.attention_kind(i), self.model_axis, self.model_shards,
              name=f'layer_{i}')(
            x_BxTxD, positions_BxT, cache[i])

    x_BxTxD = RMSNorm(cfg.rms_norm_eps, name='final_norm')(x_BxTxD)
    if logit_indices_BxR is not None:
      x_BxTxD = jnp.take_along_axis(x_BxTxD, logit_indices_BxR[:, :, None], axis=1)
    logits = lm_head(embedding_DxV, x_BxTxD, self.model_axis)
    if cfg.final_logit_softcap is not None:
      logits = jnp.tanh(logits / cfg.final_logit_softcap) * cfg.final_logit_softcap
    return logits, new_cache


def embed(embedding_DxV: Array, tokens_BxT: Array, model_axis: str | None) -> Array:
  """Looks tokens up in the tied table; with a vocab-sharded table, sums shards."""
  local_v = embedding_DxV.shape[1]
  if model_axis is None:
    return jnp.take(embedding_DxV, tokens_BxT, axis=1).transpose(1, 2, 0)
  local_tokens = tokens_BxT - _model_rank(model_axis) * local_v
  mine = (local_tokens >= 0) & (local_tokens < local_v)
  x = jnp.take(embedding_DxV, jnp.clip(local_tokens, 0, local_v - 1), axis=1).transpose(1, 2, 0)
  return jax.lax.psum(jnp.where(mine[..., None], x, 0), model_axis)


def lm_head(embedding_DxV: Array, x_BxRxD: Array, model_axis: str | None) -> Array:
  logits = jnp.einsum('brd,dv->brv', x_BxRxD, embedding_DxV,
                      preferred_element_type=jnp.float32)
  if model_axis is not None:
    logits = jax.lax.all_gather(logits, model_axis, axis=2, tiled=True)
  return logits


def init_params(config: GemmaConfig, rng: Array, dtype: Any = jnp.float32) -> dict:
  """Random parameters (for tests and shape inspection)."""
  cache = kv_cache_lib.init(config, batch=1, num_slots=2, dtype=dtype)
  tokens = jnp.zeros((1, 1), jnp.int32)
  params = Transformer(config).init(rng, tokens, tokens, cache)['params']
  return jax.tree.map(lambda x: x.astype(dtype), params)


def param_shapes(config: GemmaConfig) -> dict:
  return jax.eval_shape(lambda r: init_params(config, r), jax.random.key(0))


def count_params(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
