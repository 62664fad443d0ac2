"""Gemma 2 / Gemma 3 text transformer in pure-functional Flax Linen.

One function serves prefill, one-token decode and the verification of gamma+1
drafted tokens: it takes T new tokens per row at per-row positions, writes
their keys and values into an explicit, preallocated KV cache and returns the
new cache, the logits and the hidden states drafters read. Nothing is mutable
under jit: `Transformer(cfg).apply({'params': p}, tokens, positions, cache)` is
a function of its arguments.

Einsum letters: B batch, T new tokens, S cache slots, D width, N query heads,
K key/value heads, G query heads per K head, H head dim, F MLP width, V vocab,
R positions that get logits, L requested hidden-state layers. A flattened pair
is written together: `q_NHxD` is the (N * H, D) query projection.

Every matrix is stored (out, in), as GGUF and torch store them, and applied as
`w @ x.T` (see `linear`): XLA:CPU computes a tall-and-skinny product W[O, I] @
X[I, T] at close to one pass over W for small T, but x[T, I] @ W[I, O] at two
to three passes (measured on a 2-core AVX2 EPYC: the tied 262,144 x 640 head at
T = 5 took 36-42 ms against 56-67 ms). That is what keeps a verify call over
gamma + 1 positions close to the cost of a one-token decode step. On CPU, in
float32, products of 2 to 15 rows go to specjax's own kernel instead
(`cpu_kernels/skinny_matmul`), which overlaps the weight reads with the
arithmetic and gives each row the same bits whatever the number of rows it
runs with (a decode step's single row is XLA's: see skinny_matmul.py). In
float32 on CPU, the attention of up to 16 new tokens per row (decode and
verify calls, not a prefill) is specjax's kernel too (`cpu_kernels/attention`):
it reads only the cache slots some query may see, on every thread. Where the
params carry a matrix's int8 form (`q8_weights`: the embedded 270M's GGUF
stores its head as Q8_0, its q, k, gate and up projections as Q5_0 and its o
and down projections as Q4_K and Q6_K, all exact in int8 blocks), its
products of 1 to 24 rows read that (`cpu_kernels/q8_matmul`): about a quarter
of the bytes for the same weights. Norm
`scale`s hold the full multiplier (Gemma's 1 + w), as GGUF files do.

Sharding: called with `model_axis` inside `shard_map`, every parameter is the
local shard (heads, MLP width and vocabulary split over that axis; K/V heads
replicated when fewer than the axis size) and the partial results are summed
with `psum`. Without `model_axis` it is the plain single-device model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax import argmax as argmax_lib
from specjax.cpu_kernels import attention as attention_lib
from specjax.cpu_kernels import q8_amx as q8_amx_lib
from specjax.cpu_kernels import q8_argmax as q8_argmax_lib
from specjax.cpu_kernels import q8_matmul as q8_matmul_lib
from specjax.cpu_kernels import skinny_matmul as skinny_matmul_lib
from specjax.models import kv_cache as kv_cache_lib
from specjax.models import q8_weights
from specjax.models.config import GemmaConfig

Array = jax.Array
Cache = kv_cache_lib.Cache


@dataclasses.dataclass(frozen=True)
class ForwardOutput:
  """What one forward pass returns.

  logits_BxRxV: float32 logits at the R positions asked for (all T by default).
  cache: the KV cache with the T new entries written.
  hidden_BxTxD: the last run layer's output after the final norm, at every new
    position (the features a Medusa or EAGLE head reads).
  layer_hidden_LxBxTxD: the residual stream after each layer in
    `hidden_layers` (0-based; EAGLE-3 fuses a low, a middle and a high one),
    or None when none was asked for.
  argmax_BxR: with `greedy=True`, the index of each scored position's largest
    logit (int32; the first, as `jnp.argmax`): greedy decoding's token. Where
    the head's argmax kernel serves it (`head_argmax`), logits_BxRxV is None.
  """

  logits_BxRxV: Array | None   # None when the pass was asked for no logits
  cache: Cache
  hidden_BxTxD: Array
  layer_hidden_LxBxTxD: Array | None = None
  argmax_BxR: Array | None = None


jax.tree_util.register_dataclass(
    ForwardOutput, data_fields=['logits_BxRxV', 'cache', 'hidden_BxTxD', 'layer_hidden_LxBxTxD',
                                 'argmax_BxR'],
    meta_fields=[])


def q8_form(module: nn.Module, name: str) -> tuple[Array, ...] | None:
  """The (int8 q, float32 scale[, float32 offset]) form of `module`'s parameter `name`, where
  the params carry one (`q8_weights.with_q8_weights`), else None."""
  if not module.has_variable('params', name + q8_weights.Q8_SUFFIX):
    return None
  suffixes = q8_weights.FORM_SUFFIXES
  if not module.has_variable('params', name + q8_weights.OFFSET_SUFFIX):
    suffixes = suffixes[:2]
  return tuple(module.get_variable('params', name + s) for s in suffixes)


def amx_form(module: nn.Module, name: str) -> tuple[Array, ...] | None:
  """The (int8 tiles, float32 scale[, float32 offset]) tile layout of `module`'s parameter
  `name` for `q8_amx`, where the params carry one (`q8_weights.with_q8_weights`), else None."""
  if not module.has_variable('params', name + q8_weights.AMX_SUFFIXES[0]):
    return None
  return tuple(module.get_variable('params', name + s) for s in q8_weights.AMX_SUFFIXES
               if module.has_variable('params', name + s))


def linear(x_BxTxI: Array, w_OxI: Array, out_dtype: Any = None,
           q8: tuple[Array, ...] | None = None, amx: tuple[Array, ...] | None = None) -> Array:
  """x @ w.T for a matrix stored (out, in), computed as (w @ x.T).T.

  On CPU the product's [O, B*T] result passes an optimization barrier before
  it is transposed: without it XLA folds the transpose into the matmul's
  output layout and picks its slow small-M kernel again. A float32 product of
  a few rows on CPU takes specjax's skinny-matmul kernel, or, given the
  matrix's int8 form `q8` (`q8_weights`), the kernel that reads that, or given its
  tile layout `amx` too, Intel AMX's tile products of it (`q8_amx`, 1 to 256 rows in calls of 64).
  """
  b, t, i = x_BxTxI.shape
  if amx is not None and q8_amx_lib.applies(b * t, x_BxTxI):
    y_NxO = q8_amx_lib.q8_amx_matmul(x_BxTxI.reshape(b * t, i), *amx)
    return y_NxO.astype(out_dtype or x_BxTxI.dtype).reshape(b, t, w_OxI.shape[0])
  if q8 is not None and q8_matmul_lib.applies(b * t, x_BxTxI):
    y_NxO = q8_matmul_lib.q8_matmul(x_BxTxI.reshape(b * t, i), *q8)
    return y_NxO.astype(out_dtype or x_BxTxI.dtype).reshape(b, t, w_OxI.shape[0])
  if skinny_matmul_lib.applies(b * t, x_BxTxI, w_OxI):
    y_NxO = skinny_matmul_lib.skinny_matmul(x_BxTxI.reshape(b * t, i), w_OxI)
    return y_NxO.astype(out_dtype or x_BxTxI.dtype).reshape(b, t, w_OxI.shape[0])
  y_OxN = jnp.einsum('oi,ni->on', w_OxI, x_BxTxI.reshape(b * t, i),
                     preferred_element_type=jnp.float32).astype(out_dtype or x_BxTxI.dtype)
  if jax.default_backend() == 'cpu' and b * t > 1:
    y_OxN = jax.lax.optimization_barrier(y_OxN)
  return y_OxN.T.reshape(b, t, w_OxI.shape[0])


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


def rope_table(positions_BxT: Array, head_dim: int, base: float, scale: float = 1.0
               ) -> tuple[Array, Array]:
  """(cos, sin) [B, T, 1, H / 2] of the rotary embedding's angles at these positions."""
  half = head_dim // 2
  inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / (2 * half)))
  angles_BxTxH2 = (positions_BxT[..., None].astype(jnp.float32) / scale) * inv_freq[None, None]
  return jnp.cos(angles_BxTxH2)[:, :, None, :], jnp.sin(angles_BxTxH2)[:, :, None, :]


def materialized(fn: Callable[[Array], Any], x: Array) -> Any:
  """fn(x) (x an integer array), computed once into buffers of its own.

  XLA fuses an elementwise producer into each of its consumers and recomputes it there; for
  a rotary table (sines and cosines) consumed by 36 rotations a forward of the 270M, each
  over 4 heads, was 0.9 ms of a 9-position verify call on a 2-core Xeon (6 December 2026;
  made once, a call over 1 / 5 / 9 positions took 0.99 / 0.93 / 0.91 of the time). A loop
  whose trip count XLA cannot know at compile time (one iteration, but it depends on x) is
  not fused across, and an optimization barrier did not stop the fusion."""
  once = 1 + (jnp.min(x) == jnp.iinfo(x.dtype).min).astype(jnp.int32)   # 1
  init = (jnp.int32(0), jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                     jax.eval_shape(fn, x)))
  return jax.lax.while_loop(lambda c: c[0] < once, lambda c: (c[0] + 1, fn(x)), init)[1]


def rope_settings(config: GemmaConfig, kind: str) -> tuple[float, float]:
  """(base, scale) of a 'global' or 'local' layer's rotary embedding."""
  if kind == 'global':
    return config.rope_base_global, config.rope_scale_global
  return config.rope_base_local, 1.0


def apply_rope(x_BxTxNxH: Array, positions_BxT: Array, base: float, scale: float = 1.0, *,
               table: tuple[Array, Array] | None = None) -> Array:
  """Rotary embedding, split-half ("NeoX") convention as Gemma uses it; `table`: the
  positions' `rope_table` for this base, where the caller has made it."""
  half = x_BxTxNxH.shape[-1] // 2
  cos, sin = (rope_table(positions_BxT, 2 * half, base, scale) if table is None else table)
  x32 = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def attention_mask(positions_BxT: Array, slot_positions_BxS: Array, window: int | None) -> Array:
  """Which cache slots each new token may attend to; a slot holds the position it is named by.

  Slots past a query's own position hold stale or unwritten entries (rejected
  drafts, padding) and are hidden by causality, so a rollback costs nothing.
  """
  q_BxTx1 = positions_BxT[:, :, None]
  s_Bx1xS = slot_positions_BxS[:, None, :]
  mask_BxTxS = s_Bx1xS <= q_BxTx1
  if window is not None:
    mask_BxTxS &= s_Bx1xS > q_BxTx1 - window
  return mask_BxTxS


def tree_attention_mask(positions_BxT: Array, slots_BxS: Array, start_B: Array,
                        tree_mask_BxTxT: Array, window: int | None) -> Array:
  """The mask of a token-tree verify call: T new tokens at consecutive slots from
  start_B, at positions by depth (not by slot).

  Committed slots (< start) are seen causally (and within the window) as in
  `attention_mask`; new slot start + u is seen by new token t iff
  tree_mask[t, u] (u is an ancestor of t, or t itself) and, on a local layer,
  u's position is within t's window. Slots past the T new ones are stale.
  """
  t = positions_BxT.shape[1]
  rel_BxS = slots_BxS - start_B[:, None]
  new_BxS = (rel_BxS >= 0) & (rel_BxS < t)
  u_BxS = jnp.clip(rel_BxS, 0, t - 1)
  tree_BxTxS = jnp.take_along_axis(tree_mask_BxTxT, jnp.broadcast_to(
      u_BxS[:, None, :], (u_BxS.shape[0], t, u_BxS.shape[1])), axis=2)
  key_pos_BxS = jnp.take_along_axis(positions_BxT, u_BxS, axis=1)
  q_BxTx1 = positions_BxT[:, :, None]
  if window is not None:
    tree_BxTxS &= key_pos_BxS[:, None, :] > q_BxTx1 - window
  committed_BxTxS = attention_mask(positions_BxT, slots_BxS, window) & (rel_BxS < 0)[:, None, :]
  return jnp.where(new_BxS[:, None, :], tree_BxTxS, committed_BxTxS)


def window_slots(num_slots: int, window: int, num_new: int) -> int | None:
  """How many cache slots a local layer gives XLA's attention, or None for all of them.

  (The CPU attention kernel takes the whole cache and skips what the mask
  hides on its own.) T new tokens from position p attend to slots (p - window, p + T - 1]: a
  window of window + T - 1 slots. Reading only those (a per-row dynamic slice)
  pays off whenever the cache is longer: at 1024 slots a call over 9 positions
  of the 270M took 67 ms reading 520 slots against 74-77 ms reading all 1024
  (benchmarks/verify_cost.py --num_slots=1024; the slice itself is a copy of
  the window, 1 MB a layer).
  """
  needed = window + num_new - 1
  return needed if num_slots > needed else None


def _model_rank(model_axis: str | None) -> Array | int:
  return 0 if model_axis is None else jax.lax.axis_index(model_axis)


def local_kv_heads(config: GemmaConfig, model_shards: int) -> int:
  """K/V heads per 'model' shard: split when they divide evenly, else replicated."""
  return config.num_kv_heads // model_shards if config.num_kv_heads % model_shards == 0 \
      else config.num_kv_heads


def _read_window(layer_cache: dict[str, Array], start_B: Array, length: int):
  def row(buf_SxKxH, start):
    return jax.lax.dynamic_slice_in_dim(buf_SxKxH, start, length, axis=0)
  return jax.vmap(row)(layer_cache['k'], start_B), jax.vmap(row)(layer_cache['v'], start_B)


class Attention(nn.Module):
  config: GemmaConfig
  kind: str  # 'global' or 'local'
  model_axis: str | None = None
  model_shards: int = 1

  @nn.compact
  def __call__(self, x_BxTxD: Array, positions_BxT: Array, layer_cache: dict[str, Array],
               tree_mask_BxTxT: Array | None = None,
               rope: tuple[Array, Array] | None = None):
    cfg = self.config
    init = nn.initializers.normal(0.2)
    num_q = cfg.num_heads // self.model_shards
    num_kv = local_kv_heads(cfg, self.model_shards)
    h_dim = cfg.head_dim
    q_NHxD = self.param('q_NHxD', init, (num_q * h_dim, cfg.embed_dim))
    k_KHxD = self.param('k_KHxD', init, (num_kv * h_dim, cfg.embed_dim))
    v_KHxD = self.param('v_KHxD', init, (num_kv * h_dim, cfg.embed_dim))
    o_DxNH = self.param('o_DxNH', init, (cfg.embed_dim, num_q * h_dim))

    b, t = x_BxTxD.shape[:2]
    q = linear(x_BxTxD, q_NHxD, q8=q8_form(self, 'q_NHxD'),
               amx=amx_form(self, 'q_NHxD')).reshape(b, t, num_q, h_dim)
    k = linear(x_BxTxD, k_KHxD, q8=q8_form(self, 'k_KHxD'),
               amx=amx_form(self, 'k_KHxD')).reshape(b, t, num_kv, h_dim)
    v = linear(x_BxTxD, v_KHxD, q8=q8_form(self, 'v_KHxD'),
               amx=amx_form(self, 'v_KHxD')).reshape(b, t, num_kv, h_dim)
    if cfg.use_qk_norm:
      q = RMSNorm(cfg.rms_norm_eps, name='query_norm')(q)
      k = RMSNorm(cfg.rms_norm_eps, name='key_norm')(k)
    base, scale = rope_settings(cfg, self.kind)
    q = apply_rope(q, positions_BxT, base, scale, table=rope) * (
        cfg.query_pre_attn_scalar ** -0.5)
    k = apply_rope(k, positions_BxT, base, scale, table=rope)

    start_B = positions_BxT[:, 0]
    layer_cache = kv_cache_lib.write(layer_cache, k, v, start_B)
    num_slots = layer_cache['k'].shape[1]
    window = cfg.sliding_window if self.kind == 'local' else None
    k_BxSxKxH, v_BxSxKxH = layer_cache['k'], layer_cache['v']
    slots_BxS = jnp.broadcast_to(jnp.arange(num_slots), (b, num_slots))
    # The CPU kernel reads only the slots a query may see, so it takes the
    # whole cache; XLA's einsums read every slot they are given, so a local
    # layer gives them its window alone.
    use_kernel = attention_lib.applies(q, k_BxSxKxH, v_BxSxKxH)
    length = None if window is None or use_kernel else window_slots(num_slots, window, t)
    if length is not None:
      first_B = jnp.clip(start_B - window + 1, 0, num_slots - length)
      k_BxSxKxH, v_BxSxKxH = _read_window(layer_cache, first_B, length)
      slots_BxS = first_B[:, None] + jnp.arange(length)[None, :]

    # Under shard_map the local shard may hold fewer query heads than K/V heads
    # are replicated for: pick, for each local query head, its K/V head.
    k_local = k_BxSxKxH.shape[2]
    if k_local * (cfg.num_heads // num_q) != cfg.num_kv_heads and k_local > 1:
      group = cfg.num_heads // cfg.num_kv_heads
      kv_idx = (_model_rank(self.model_axis) * num_q + jnp.arange(num_q)) // group
      k_BxSxKxH = jnp.take(k_BxSxKxH, kv_idx, axis=2)
      v_BxSxKxH = jnp.take(v_BxSxKxH, kv_idx, axis=2)
      k_local = num_q
    q_BxTxKxGxH = q.reshape(b, t, k_local, num_q // k_local, h_dim)
    if tree_mask_BxTxT is None:
      mask_BxTxS = attention_mask(positions_BxT, slots_BxS, window)
    else:
      mask_BxTxS = tree_attention_mask(positions_BxT, slots_BxS, start_B, tree_mask_BxTxT, window)

    attend = attention_lib.attention if use_kernel else attention_lib.xla_attention
    out_BxTxKxGxH = attend(q_BxTxKxGxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, cfg.attn_logit_softcap)
    out_BxTxNH = out_BxTxKxGxH.reshape(b, t, num_q * h_dim)
    out_BxTxD = linear(out_BxTxNH, o_DxNH, q8=q8_form(self, 'o_DxNH'),
                       amx=amx_form(self, 'o_DxNH'))
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
    gate_FxD = self.param('gate_FxD', init, (hidden, cfg.embed_dim))
    up_FxD = self.param('up_FxD', init, (hidden, cfg.embed_dim))
    down_DxF = self.param('down_DxF', init, (cfg.embed_dim, hidden))
    gate = linear(x_BxTxD, gate_FxD, q8=q8_form(self, 'gate_FxD'),
                  amx=amx_form(self, 'gate_FxD'))
    up = linear(x_BxTxD, up_FxD, q8=q8_form(self, 'up_FxD'), amx=amx_form(self, 'up_FxD'))
    h = jax.nn.gelu(gate, approximate=True) * up
    out = linear(h, down_DxF, q8=q8_form(self, 'down_DxF'), amx=amx_form(self, 'down_DxF'))
    if self.model_axis is not None:
      out = jax.lax.psum(out, self.model_axis)
    return out


class Block(nn.Module):
  config: GemmaConfig
  kind: str
  model_axis: str | None = None
  model_shards: int = 1

  @nn.compact
  def __call__(self, x: Array, positions_BxT: Array, layer_cache: dict[str, Array],
               tree_mask_BxTxT: Array | None = None, rope: tuple[Array, Array] | None = None):
    eps = self.config.rms_norm_eps
    h = RMSNorm(eps, name='pre_attention_norm')(x)
    h, layer_cache = Attention(self.config, self.kind, self.model_axis, self.model_shards,
                               name='attn')(
        h, positions_BxT, layer_cache, tree_mask_BxTxT, rope)
    x = x + RMSNorm(eps, name='post_attention_norm')(h)
    h = RMSNorm(eps, name='pre_ffw_norm')(x)
    h = MLP(self.config, self.model_axis, self.model_shards, name='mlp')(h)
    return x + RMSNorm(eps, name='post_ffw_norm')(h), layer_cache


class Transformer(nn.Module):
  """Gemma decoder over an explicit KV cache.

  __call__(tokens_BxT, positions_BxT, cache, logit_indices_BxR=None,
  num_layers=None, hidden_layers=(), skip_layers=(), logits=True, tree_mask=None,
  greedy=False) returns a `ForwardOutput`. The T new tokens are written at consecutive slots
  from positions_BxT[:, 0]. Without `tree_mask`, `positions_BxT` must be
  consecutive in each row (T new tokens starting at the row's own offset). With
  `tree_mask` ([T, T] or [B, T, T] bool, ancestor-or-self, see
  `decoding/tree.py`) the T tokens are a token tree: positions are the root's
  plus each node's depth, and token t sees the committed context and the new
  tokens tree_mask[t] names. `logit_indices_BxR` picks which of the T outputs get
  the (costly, V-wide) head; None means all. `num_layers` runs only the first
  layers, then the final norm and head: the early-exit drafter. `skip_layers`
  (static) makes those layers the identity: they neither read nor write their
  cache (a layer-skipping self-drafter). `logits=False` stops after the final
  norm (logits None): a drafter with its own, smaller head skips the V-wide one.
  `greedy=True` adds each scored position's argmax (`ForwardOutput.argmax_BxR`),
  from the head's argmax kernel without logits where it serves (`head_argmax`).
  """

  config: GemmaConfig
  model_axis: str | None = None
  model_shards: int = 1  # the size of `model_axis`; parameters are that axis's local shards

  @nn.compact
  def __call__(self, tokens_BxT: Array, positions_BxT: Array, cache: Cache,
               logit_indices_BxR: Array | None = None, num_layers: int | None = None,
               hidden_layers: tuple[int, ...] = (), skip_layers: tuple[int, ...] = (),
               logits: bool = True, tree_mask: Array | None = None,
               greedy: bool = False) -> ForwardOutput:
    cfg = self.config
    tree_mask_BxTxT = None
    if tree_mask is not None:
      tree_mask_BxTxT = jnp.broadcast_to(tree_mask.astype(bool), tokens_BxT.shape[:1] + (
          tokens_BxT.shape[1],) * 2)
    embedding_VxD = self.param('embedding_VxD', nn.initializers.normal(cfg.embed_dim ** -0.5),
                               (cfg.vocab_size // self.model_shards, cfg.embed_dim))
    x_BxTxD = embed(embedding_VxD, tokens_BxT, self.model_axis)
    x_BxTxD = x_BxTxD * jnp.asarray(math.sqrt(cfg.embed_dim), x_BxTxD.dtype)

    depth = cfg.num_layers if num_layers is None else num_layers
    new_cache = list(cache)
    layer_hidden = []
    # Each base's rotary table, made once for every layer: on CPU behind a loop (see
    # `materialized`); a GPU's loop would wait on the host for its condition. Sorted: a set's
    # order varies between processes, and so would the program and its cache key.
    made_once = materialized if jax.default_backend() == 'cpu' else (lambda fn, x: fn(x))
    rope = {kind: made_once(lambda p, kind=kind: rope_table(p, cfg.head_dim,
                                                            *rope_settings(cfg, kind)),
                            positions_BxT)
            for kind in sorted({cfg.attention_kind(i) for i in range(depth)})}
    for i in range(depth):
      if i in skip_layers and not self.is_initializing():
        continue   # the identity: its cache entry is left as it was
      kind = cfg.attention_kind(i)
      x_BxTxD, new_cache[i] = Block(cfg, kind, self.model_axis, self.model_shards,
                                    name=f'layer_{i}')(
                                        x_BxTxD, positions_BxT, cache[i], tree_mask_BxTxT,
                                        rope[kind])
      if i in hidden_layers:
        layer_hidden.append(x_BxTxD)
    if depth < cfg.num_layers and self.is_initializing():
      # Create the remaining layers' parameters so init always yields the full model.
      for i in range(depth, cfg.num_layers):
        Block(cfg, cfg.attention_kind(i), self.model_axis, self.model_shards,
              name=f'layer_{i}')(
            x_BxTxD, positions_BxT, cache[i])

    hidden_BxTxD = RMSNorm(cfg.rms_norm_eps, name='final_norm')(x_BxTxD)
    stacked = jnp.stack(layer_hidden) if layer_hidden else None
    if not logits:
      return ForwardOutput(None, new_cache, hidden_BxTxD, stacked)
    x_BxRxD = hidden_BxTxD
    if logit_indices_BxR is not None:
      x_BxRxD = jnp.take_along_axis(hidden_BxTxD, logit_indices_BxR[:, :, None], axis=1)
    if greedy:
      argmax_BxR = head_argmax(x_BxRxD, argmax_form(self), self.model_axis, cfg)
      if argmax_BxR is not None:
        return ForwardOutput(None, new_cache, hidden_BxTxD, stacked, argmax_BxR)
    logits_BxRxV = softcap_logits(
        lm_head(embedding_VxD, x_BxRxD, self.model_axis, q8_form(self, 'embedding_VxD')), cfg)
    return ForwardOutput(logits_BxRxV, new_cache, hidden_BxTxD, stacked,
                         argmax_lib.argmax(logits_BxRxV) if greedy else None)


def embed(embedding_VxD: Array, tokens_BxT: Array, model_axis: str | None) -> Array:
  """Looks tokens up in the tied table; with a vocab-sharded table, sums shards."""
  local_v = embedding_VxD.shape[0]
  if model_axis is None:
    return jnp.take(embedding_VxD, tokens_BxT, axis=0)
  local_tokens = tokens_BxT - _model_rank(model_axis) * local_v
  mine = (local_tokens >= 0) & (local_tokens < local_v)
  x = jnp.take(embedding_VxD, jnp.clip(local_tokens, 0, local_v - 1), axis=0)
  return jax.lax.psum(jnp.where(mine[..., None], x, 0), model_axis)


# Rows up to which the CPU head is a multiply-and-reduce instead of a matmul.
_CPU_HEAD_REDUCE_MAX_ROWS = 64


def head_logits(x_BxRxD: Array, table_VxD: Array,
                q8: tuple[Array, ...] | None = None) -> Array:
  """x @ table.T in float32 for a vocabulary-sized table: the head's product.

  `q8` is the same table as int8 values and float32 scales (`q8_weights`): on CPU
  1 to 24 rows then take the Q8_0 kernel, which reads a quarter of the bytes
  and gives the skinny-matmul kernel's bits (on the 2-core Xeon of 5 December
  2026, the 270M's head at 1 / 5 / 9 rows: 5.4-6.0 / 9.5-10.0 / 13.8-16.0 ms
  against XLA's 24-33 at one row and the float32 kernel's 22-29 / 28-31 at 5 /
  9; see q8_matmul.py).
  On CPU a float32 table and 2 to 15 rows take the skinny-matmul kernel
  (through `linear`). Past that, or where the kernel is not built, for 2 to 64
  rows (a verify call's gamma + 1 positions, a small batch of them) it is
  written as an elementwise product reduced over D, which XLA emits as one
  fused pass over the table with each row's D values kept in cache, instead
  of a call to its general matmul, which is slow on a 262,144 x 640 by
  640 x 5 product. Measured on a 2-core AVX-512 EPYC, the
  head alone: at 5 rows 26-30 ms against 34-45 ms, at 9 rows 33-36 against
  42-58 (three runs). In a whole verify call of the 270M the gain is smaller
  and noisy: over 5 positions 1.62 against 1.86 decode steps in one run, 1.67
  against 1.75 in another (benchmarks/verify_cost.py). One row stays a
  matrix-vector product (XLA's own GEMV reads the table at memory speed), and
  so does a large batch.
  """
  b, r, d = x_BxRxD.shape
  rows = b * r
  x32_BxRxD = x_BxRxD.astype(jnp.float32)
  if (q8 is not None and q8_matmul_lib.applies(rows, x32_BxRxD)
      or skinny_matmul_lib.applies(rows, x32_BxRxD, table_VxD)):
    return linear(x32_BxRxD, table_VxD, out_dtype=jnp.float32, q8=q8)
  if jax.default_backend() != 'cpu' or not 1 < rows <= _CPU_HEAD_REDUCE_MAX_ROWS:
    return linear(x_BxRxD, table_VxD, out_dtype=jnp.float32)
  x_NxD = x32_BxRxD.reshape(rows, d)
  y_VxN = jnp.sum(table_VxD.astype(jnp.float32)[:, None, :] * x_NxD[None], axis=-1)
  return y_VxN.T.reshape(b, r, table_VxD.shape[0])


def lm_head(embedding_VxD: Array, x_BxRxD: Array, model_axis: str | None,
            q8: tuple[Array, ...] | None = None) -> Array:
  """Float32 logits against the tied table (its local vocabulary shard, gathered);
  `q8`: the table's Q8_0 form, where the run has one (see `head_logits`)."""
  logits = head_logits(x_BxRxD, embedding_VxD, q8)
  if model_axis is not None:
    logits = jax.lax.all_gather(logits, model_axis, axis=2, tiled=True)
  return logits


class ArgmaxForm(NamedTuple):
  """The tied head's operands for greedy's argmax kernel, and the kernel's entry point."""
  call: Callable[..., tuple[Array, Array]]   # q8_argmax.screen_argmax or .head_argmax
  arrays: tuple[Array, ...]                   # its operands after x: ..., q[V, D], scale


def argmax_form(module: nn.Module) -> ArgmaxForm | None:
  """The tied head's form for `q8_argmax` where the params carry one
  (`q8_weights.with_q8_weights`), the first of `q8_weights.HEAD_ARGMAX_KINDS`; else None."""
  for kind in q8_weights.HEAD_ARGMAX_KINDS:
    names = (*kind.names, q8_weights.HEAD_FORM, q8_weights.HEAD_SCALE)
    if all(module.has_variable('params', n) for n in names):
      return ArgmaxForm(kind.call, tuple(module.get_variable('params', n) for n in names))
  return None


def head_argmax_serves(num_rows: int, has_form: bool, config: GemmaConfig) -> bool:
  """Whether `head_argmax` gives the argmax of `num_rows` positions (and no logits)."""
  return (has_form and config.final_logit_softcap is None
          and q8_argmax_lib.applies(num_rows, jnp.zeros((), jnp.float32)))


def head_argmax(x_BxRxD: Array, form: ArgmaxForm | None, model_axis: str | None,
                config: GemmaConfig) -> Array | None:
  """Each row's argmax over the tied head's logits, from `q8_argmax` without the logits
  (the same index as `argmax_lib.argmax` of `lm_head`'s logits), or None where that kernel
  does not serve: no tile form, not CPU, too many rows, or a final soft cap (tanh can map
  distinct logits to one float, and the first of them would then win). With a
  vocab-sharded head each shard finds its own, and the largest wins (the first shard on a
  tie, so the first index)."""
  b, r, d = x_BxRxD.shape
  x_NxD = x_BxRxD.reshape(b * r, d).astype(jnp.float32)
  if not head_argmax_serves(b * r, form is not None, config):
    return None
  index_N, value_N = form.call(x_NxD, *form.arrays)
  if model_axis is not None:
    index_N = index_N + _model_rank(model_axis) * form.arrays[-2].shape[0]
    index_SxN = jax.lax.all_gather(index_N, model_axis)
    best_N = jnp.argmax(jax.lax.all_gather(value_N, model_axis), axis=0)
    index_N = jnp.take_along_axis(index_SxN, best_N[None, :], axis=0)[0]
  return index_N.reshape(b, r)


def softcap_logits(logits: Array, config: GemmaConfig) -> Array:
  """Gemma 2's final soft cap (a no-op for Gemma 3); a reduced draft head applies it too."""
  if config.final_logit_softcap is None:
    return logits
  return jnp.tanh(logits / config.final_logit_softcap) * config.final_logit_softcap


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
