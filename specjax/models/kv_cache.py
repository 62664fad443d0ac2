"""The preallocated KV cache: one `[B, S, K, H]` key and value buffer per layer.

Slot s of a row holds the keys and values of that row's position s. Entries
past a row's committed length are stale (rejected drafts, prompt padding): the
causal mask hides them and the next write overwrites them, so nothing is ever
copied back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from specjax.models.config import GemmaConfig

CACHE_AXES = ('batch', 'slot', 'kv_heads', 'head_dim')

Cache = list  # list[dict[str, Array]], one {'k', 'v'} dict per layer


def init(config: GemmaConfig, batch: int, num_slots: int, dtype: Any = jnp.float32,
         num_layers: int | None = None) -> Cache:
  shape = (batch, num_slots, config.num_kv_heads, config.head_dim)
  return [{'k': jnp.zeros(shape, dtype), 'v': jnp.zeros(shape, dtype)}
          for _ in range(num_layers or config.num_layers)]


def num_slots(cache: Cache) -> int:
  return cache[0]['k'].shape[1]


def write(layer_cache: dict[str, jax.Array], k_BxTxKxH: jax.Array, v_BxTxKxH: jax.Array,
          start_B: jax.Array) -> dict[str, jax.Array]:
  """Writes T new entries per row at that row's own start slot.

  A single new entry is written twice (slots start and start + 1; the second
  is past the row's length, so it is stale and hidden). XLA:CPU turns a
  one-slot row update into a select-and-update that it cannot do in place in
  a decoding loop, and copied every layer's cache twice per decode step (2 x
  36 MB at 1,024 slots for Gemma 3 270M); two-slot updates stay in place.

  Callers guarantee start + max(T, 2) <= S (dynamic_update_slice would
  otherwise clamp the start and silently overwrite the wrong slots); the
  decoding loops size the cache for this.
  """
  if k_BxTxKxH.shape[1] == 1:
    k_BxTxKxH = jnp.concatenate([k_BxTxKxH] * 2, axis=1)
    v_BxTxKxH = jnp.concatenate([v_BxTxKxH] * 2, axis=1)

  def row(buf_SxKxH, new_TxKxH, start):
    return jax.lax.dynamic_update_slice(buf_SxKxH, new_TxKxH.astype(buf_SxKxH.dtype),
                                        (start, 0, 0))
  write_rows = jax.vmap(row)
  return {'k': write_rows(layer_cache['k'], k_BxTxKxH, start_B),
          'v': write_rows(layer_cache['v'], v_BxTxKxH, start_B)}


def compact(cache: Cache, start_B: jax.Array, source_BxN: jax.Array) -> Cache:
  """Moves entries down after a token tree's verify call: slot start + k gets
  the entry of slot start + source[:, k], for k < N, in every layer.

  The accepted path's nodes sit at increasing slots, so source[k] >= k; rows
  pass source[k] = k where nothing moves. It is a gather of the N slots, then
  one write: no entry is read after it was overwritten. Leaves that are not
  [B, S, K, H] buffers (a toy model's stand-in cache) pass through.
  """
  def move(buf):
    if buf.ndim != 4:
      return buf
    def row(buf_SxKxH, start, source_N):
      moved_NxKxH = jnp.take(buf_SxKxH, start + source_N, axis=0, mode='clip')
      return jax.lax.dynamic_update_slice(buf_SxKxH, moved_NxKxH, (start, 0, 0))
    return jax.vmap(row)(buf, start_B, source_BxN)
  return jax.tree.map(move, cache)
