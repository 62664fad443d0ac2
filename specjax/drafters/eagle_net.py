"""The EAGLE-3 draft network: one decoder layer in the target's feature space.

EAGLE (Li et al. 2024) drafts in feature space: at chain position t it reads
a feature h_t and the embedding of the next token x_{t+1}, and its output
o_t is both a new feature and, through the target's own tied head, a guess
of x_{t+2}. EAGLE-3 (Li et al. 2025) fuses the target's residual stream at a
low, a middle and a high layer into the first feature (h = W_fuse [g_lo;
g_mid; g_hi], each RMS-normalised here) and, drafting further, feeds the network its own output
(h_{t+1} = o_t) instead of the target's feature, which is what its
training-time test teaches (`training/eagle_objective.py`).

The layer is Llama-style, as EAGLE-3's:

  a   = Attention(concat(norm_e(e(x_{t+1})), norm_h(h_t)))   # 2D -> D
  r   = h_t + a
  o_t = r + MLP(norm_m(r))
  logits_t = final_norm(o_t) @ E_N^T      # the target's embedding rows of the draft vocabulary

Only the layer is trained; the embedding and the head are the frozen target's
(a reduced draft vocabulary keeps the head cheap), so a checkpoint holds 6-8M
parameters. Attention has its own single-layer KV cache, written at the
chain positions, and RoPE at those positions. A `window` limits it to the
last keys, as a local layer of the target is limited: a layer trained on
sequences of L tokens never saw a key further back than L - 1, and on longer
contexts (Spec-Bench's prompts run to hundreds of tokens) it drafts better
when it does not see one (measured on the shipped drafter: 1.82 against 1.73
mean accepted tokens at positions 384-511 with a window of its 128).

Shapes: B batch, T positions, S cache slots, D width, L fused target layers,
H query heads, K key/value heads, E head dim, F MLP width, N draft vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import attention as attention_lib
from specjax.models import gemma
from specjax.models import kv_cache as kv_cache_lib
from specjax.models.config import GemmaConfig

Array = jax.Array

_NEG_INF = -2.3819763e38
ROPE_BASE = 10000.0


@dataclasses.dataclass(frozen=True)
class Geometry:
  """The draft layer's shape, fixed by the target's config and the fused layers."""

  width: int
  num_fused: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_width: int
  eps: float
  window: int | None = None   # keys at most window - 1 positions back; None: all

  @classmethod
  def of(cls, params: dict[str, Array], eps: float = 1e-6, window: int | None = None
         ) -> Geometry:
    width, fused = params['fuse_DxLD'].shape
    head_dim = params['q_norm_E'].shape[0]
    return cls(width=width, num_fused=fused // width,
               num_heads=params['q_HEx2D'].shape[0] // head_dim,
               num_kv_heads=params['k_KEx2D'].shape[0] // head_dim, head_dim=head_dim,
               mlp_width=params['gate_FxD'].shape[0], eps=eps, window=window)


def default_layers(num_layers: int) -> tuple[int, ...]:
  """EAGLE-3's low, middle and high layers (its code takes 2, L/2 and L-3, 0-based)."""
  return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


def init_params(target: GemmaConfig, num_fused: int, mlp_width: int, rng: Array,
                final_norm_D: Array | None = None) -> dict[str, Array]:
  """Fan-in scaled normal weights; norms start at one, the final norm at the target's own."""
  d, e = target.embed_dim, target.head_dim
  h, k = target.num_heads, target.num_kv_heads
  shapes = {'fuse_DxLD': (d, num_fused * d), 'q_HEx2D': (h * e, 2 * d),
            'k_KEx2D': (k * e, 2 * d), 'v_KEx2D': (k * e, 2 * d), 'o_DxHE': (d, h * e),
            'gate_FxD': (mlp_width, d), 'up_FxD': (mlp_width, d), 'down_DxF': (d, mlp_width)}
  keys = jax.random.split(rng, len(shapes))
  params = {name: jax.random.normal(key, shape, jnp.float32) / math.sqrt(shape[1])
            for key, (name, shape) in zip(keys, shapes.items())}
  # The first feature starts as the highest fused layer's residual stream (plus a little
  # of the others), so the initial guesses are the target's own, not random directions
  # through its sharp tied head.
  eye = jnp.zeros((d, num_fused * d), jnp.float32).at[:, (num_fused - 1) * d:].set(jnp.eye(d))
  params['fuse_DxLD'] = eye + 0.1 * params['fuse_DxLD']
  params['o_DxHE'] = params['o_DxHE'] * 0.1     # the layer starts close to the identity on h
  params['down_DxF'] = params['down_DxF'] * 0.1
  for name, size in (('embed_norm_D', d), ('hidden_norm_D', d), ('mlp_norm_D', d),
                     ('q_norm_E', e), ('k_norm_E', e)):
    params[name] = jnp.ones((size,), jnp.float32)
  params['final_norm_D'] = (jnp.ones((d,), jnp.float32) if final_norm_D is None
                            else jnp.array(final_norm_D, jnp.float32, copy=True))  # ours to donate
  return params


def check_shapes(params: dict[str, Array], target: GemmaConfig, num_fused: int) -> None:
  """A checkpoint made for another target (width, heads, fused layers) is a clear error."""
  want = init_params(target, num_fused, int(np.shape(params['gate_FxD'])[0]),
                     jax.random.key(0))
  got = {k: tuple(np.shape(v)) for k, v in params.items()}
  expected = {k: tuple(v.shape) for k, v in want.items()}
  if got != expected:
    wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    raise ValueError(f'eagle weights do not fit this target ({num_fused} fused layers, width '
                     f'{target.embed_dim}): {", ".join(f"{k} is {got.get(k)}, want {expected.get(k)}" for k in wrong)}')


MATRICES = ('fuse_DxLD', 'q_HEx2D', 'k_KEx2D', 'v_KEx2D', 'o_DxHE', 'gate_FxD', 'up_FxD',
            'down_DxF')
INT8 = 'int8'   # params[INT8]: {matrix name: (q int8 [O, I], scale float32 [O, I / B])}
INT8_BLOCKS = (32, 16)   # B: weights per scale, the first that divides the matrix's width


def with_int8_form(params: dict[str, Any]) -> dict[str, Any]:
  """The layer with each matrix rounded to int8 blocks (Q8_0's: one scale per 32
  weights, or 16 where 32 does not divide the width, the block's largest magnitude
  at 127), for CPU serving; a matrix neither divides stays float32.

  Drafting at batch 1 is bound by reading the layer's weights: in float32 (23 MB
  for the shipped drafter) its update after every target call cost 0.13-0.15 of
  a decode step of the int8-served 270M on a 2-core Xeon. The matrices are
  replaced by their rounding, and params[INT8] holds the int8 form that
  `gemma.linear` gives the CPU kernel, so every backend computes the same
  drafter. Drafts change where the rounding flips one; the output never does.
  """
  out = {k: v for k, v in params.items() if k != INT8}
  forms = {}
  for name in MATRICES:
    w_OxI = np.asarray(params[name], np.float32)
    o, i = w_OxI.shape
    block = next((b for b in INT8_BLOCKS if i % b == 0), None)
    if block is None:
      out[name] = jnp.asarray(w_OxI)
      continue
    blocks_NxK = w_OxI.reshape(-1, block)
    scale_N = (np.abs(blocks_NxK).max(axis=1) / 127.0).astype(np.float32)
    safe_N = np.where(scale_N > 0, scale_N, 1.0)
    q_NxK = np.clip(np.rint(blocks_NxK / safe_N[:, None]), -127, 127).astype(np.int8)
    out[name] = jnp.asarray((q_NxK * scale_N[:, None]).reshape(o, i))
    forms[name] = (jnp.asarray(q_NxK.reshape(o, i)),
                   jnp.asarray(scale_N.reshape(o, i // block)))
  out[INT8] = forms
  return out


def _linear(params: dict[str, Any], name: str, x_BxTxI: Array) -> Array:
  """x @ params[name].T, from the matrix's int8 form where the layer has one."""
  return gemma.linear(x_BxTxI, params[name].astype(jnp.float32),
                      q8=params.get(INT8, {}).get(name))


def fuse(params: dict[str, Array], layer_hidden_LxBxTxD: Array, eps: float = 1e-6) -> Array:
  """h = W_fuse [n(g_1); ...; n(g_L)]: the first feature from the target's layers, [B, T, D].

  n is a parameter-free RMS norm. Gemma's residual stream grows to norms in the
  thousands through the layers; fused raw, it would dwarf what the layer's
  attention and MLP add to it, and the drafter could barely turn the feature.
  """
  normed = [gemma.rms_norm(g, jnp.ones((g.shape[-1],), jnp.float32), eps)
            for g in layer_hidden_LxBxTxD.astype(jnp.float32)]
  return _linear(params, 'fuse_DxLD', jnp.concatenate(normed, axis=-1))


def embed(embedding_VxD: Array, tokens_BxT: Array) -> Array:
  """The target's own input embedding (Gemma scales it by sqrt(D))."""
  x = jnp.take(embedding_VxD, tokens_BxT, axis=0).astype(jnp.float32)
  return x * math.sqrt(embedding_VxD.shape[1])


def _qkv(params, geo: Geometry, hidden_BxTxD: Array, embedded_BxTxD: Array, positions_BxT):
  p = {k: v.astype(jnp.float32) for k, v in params.items() if k != INT8}
  x = jnp.concatenate([gemma.rms_norm(embedded_BxTxD, p['embed_norm_D'], geo.eps),
                       gemma.rms_norm(hidden_BxTxD, p['hidden_norm_D'], geo.eps)], axis=-1)
  b, t = x.shape[:2]
  e = geo.head_dim
  q = _linear(params, 'q_HEx2D', x).reshape(b, t, geo.num_heads, e)
  k = _linear(params, 'k_KEx2D', x).reshape(b, t, geo.num_kv_heads, e)
  v = _linear(params, 'v_KEx2D', x).reshape(b, t, geo.num_kv_heads, e)
  q = gemma.rms_norm(q, p['q_norm_E'], geo.eps)
  k = gemma.rms_norm(k, p['k_norm_E'], geo.eps)
  q = gemma.apply_rope(q, positions_BxT, ROPE_BASE) * (e ** -0.5)
  k = gemma.apply_rope(k, positions_BxT, ROPE_BASE)
  return q, k, v


def _attend(q_BxTxHxE: Array, k_BxSxKxE: Array, v_BxSxKxE: Array, mask_BxTxS: Array) -> Array:
  b, t, h, e = q_BxTxHxE.shape
  kv = k_BxSxKxE.shape[2]
  q = q_BxTxHxE.reshape(b, t, kv, h // kv, e)
  return attention_lib.xla_attention(q, k_BxSxKxE, v_BxSxKxE, mask_BxTxS).reshape(b, t, h * e)


def _finish(params, geo: Geometry, hidden_BxTxD: Array, attn_BxTxHE: Array) -> Array:
  r = hidden_BxTxD + _linear(params, 'o_DxHE', attn_BxTxHE)
  m = gemma.rms_norm(r, params['mlp_norm_D'].astype(jnp.float32), geo.eps)
  m = (jax.nn.gelu(_linear(params, 'gate_FxD', m), approximate=True)
       * _linear(params, 'up_FxD', m))
  return r + _linear(params, 'down_DxF', m)


def logits(params, head_NxD: Array, out_BxTxD: Array, target: GemmaConfig,
           eps: float = 1e-6, head_q8: tuple[Array, Array] | None = None) -> Array:
  """Float32 logits over the draft vocabulary, soft-capped as the target's head is;
  `head_q8`: the head rows' int8 form (`draft_vocab.head_form`), where there is one."""
  normed = gemma.rms_norm(out_BxTxD, params['final_norm_D'].astype(jnp.float32), eps)
  return gemma.softcap_logits(
      gemma.linear(normed, head_NxD, out_dtype=jnp.float32, q8=head_q8), target)


def init_cache(geo: Geometry, batch: int, num_slots: int) -> dict[str, Array]:
  shape = (batch, num_slots, geo.num_kv_heads, geo.head_dim)
  return {'k': jnp.zeros(shape, jnp.float32), 'v': jnp.zeros(shape, jnp.float32)}


def write_keys(params, geo: Geometry, hidden_BxTxD: Array, embedded_BxTxD: Array,
               positions_BxT: Array, cache: dict[str, Array]) -> dict[str, Array]:
  """The keys and values of T consecutive chain positions per row, written to the
  cache (slot = position) without the rest of the layer. A position's keys
  depend only on its own inputs, so this is what `step` writes there; where
  only the last position's output is wanted (a prompt), the attention and MLP
  of the others need not run."""
  _, k, v = _qkv(params, geo, hidden_BxTxD, embedded_BxTxD, positions_BxT)
  return kv_cache_lib.write(cache, k, v, positions_BxT[:, 0])


def step(params, geo: Geometry, hidden_BxTxD: Array, embedded_BxTxD: Array,
         positions_BxT: Array, cache: dict[str, Array], key_slots: int | None = None
         ) -> tuple[Array, dict[str, Array]]:
  """The layer at T consecutive chain positions per row, over its KV cache.

  Keys are written at the positions (slot = position); each query sees the
  slots at or before its position, so stale entries past it (rejected drafts)
  are never read and are overwritten when those positions are run again.
  `key_slots` (static) reads only the first slots, for a call whose positions
  all lie below it (the prompt: its attention is T x T, not T x S).
  """
  q, k, v = _qkv(params, geo, hidden_BxTxD, embedded_BxTxD, positions_BxT)
  cache = kv_cache_lib.write(cache, k, v, positions_BxT[:, 0])
  num_slots = cache['k'].shape[1] if key_slots is None else key_slots
  slots_BxS = jnp.broadcast_to(jnp.arange(num_slots), (positions_BxT.shape[0], num_slots))
  mask = gemma.attention_mask(positions_BxT, slots_BxS, geo.window)
  attn = _attend(q, cache['k'][:, :num_slots], cache['v'][:, :num_slots], mask)
  return _finish(params, geo, hidden_BxTxD, attn), cache


def step_nodes(params, geo: Geometry, hidden_BxWxD: Array, embedded_BxWxD: Array,
               positions_BxW: Array, cache: dict[str, Array], committed_B: Array,
               nodes: dict[str, Array], index_W, sees_WxN: Array
               ) -> tuple[Array, dict[str, Array]]:
  """The layer at W token-tree nodes of one depth (EAGLE-2's tree drafting).

  Siblings share a position, so a node's keys cannot go to the position-indexed
  cache: they go to `nodes` (keys and values per tree node, [B, N, K, E]) at
  the static node indices `index_W`. Each node's query sees the cache's slots
  at positions <= committed_B (the committed context; the cache is not
  written) and the tree nodes `sees_WxN` marks (its ancestors and itself).
  Along any root-to-node path this is exactly what `step` computes for a chain
  of those tokens. Returns the outputs and the updated node keys and values.
  """
  q, k, v = _qkv(params, geo, hidden_BxWxD, embedded_BxWxD, positions_BxW)
  nodes = {'k': nodes['k'].at[:, index_W].set(k), 'v': nodes['v'].at[:, index_W].set(v)}
  batch, num_slots = cache['k'].shape[:2]
  width = hidden_BxWxD.shape[1]
  slots_S = jnp.arange(num_slots)
  cached_BxWxS = jnp.broadcast_to(
      (slots_S[None, :] <= committed_B[:, None])[:, None], (batch, width, num_slots))
  if geo.window is not None:   # the nodes' own keys lie within any window wider than the tree
    cached_BxWxS &= slots_S[None, None, :] > positions_BxW[:, :, None] - geo.window
  mask_BxWxSN = jnp.concatenate(
      [cached_BxWxS, jnp.broadcast_to(sees_WxN[None], (batch,) + sees_WxN.shape)], axis=2)
  attn = _attend(q, jnp.concatenate([cache['k'], nodes['k']], axis=1),
                 jnp.concatenate([cache['v'], nodes['v']], axis=1), mask_BxWxSN)
  return _finish(params, geo, hidden_BxWxD, attn), nodes


def unrolled(params, geo: Geometry, first_BxLxD: Array, embedded_BxLxD: Array, steps: int
             ) -> list[Array]:
  """The training-time test: `steps` drafting steps from every chain start at once.

  Chain t starts from the fused target feature at t and the token x_{t+1};
  step j (1-based) runs at position t + j - 1 on the previous step's output
  and token x_{t+j} (`embedded_BxLxD` rolled left by j - 1; the tail is
  invalid and masked out of the loss). Its query sees step 1's keys at
  positions <= t, computed from the target's features, and the keys of steps
  2..j of its own chain: exactly the cache a drafting step reads in decoding.
  Returns each step's outputs o^j, [B, L, D] (o^j_t predicts x_{t+j+1}).
  """
  b, length, _ = first_BxLxD.shape
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  t_L = jnp.arange(length)

  def sees_BxLxL(j):   # step j + 1 of chain t, at position t + j, sees step 1's keys at s <= t
    mask_LxL = t_L[None, :] <= t_L[:, None]
    if geo.window is not None:
      mask_LxL &= t_L[None, :] > t_L[:, None] + j - geo.window
    return jnp.broadcast_to(mask_LxL, (b, length, length))

  hidden, outs, own_k, own_v = first_BxLxD, [], [], []
  k1 = v1 = None
  for j in range(steps):
    embedded = jnp.roll(embedded_BxLxD, -j, axis=1)
    q, k, v = _qkv(params, geo, hidden, embedded, positions_BxL + j)
    if j == 0:
      k1, v1 = k, v
      attn = _attend(q, k1, v1, sees_BxLxL(0))
    else:
      own_k.append(k)
      own_v.append(v)
      # Keys: step 1's at every position (causal), then this chain's own steps 2..j.
      kv_heads, e = k.shape[2], k.shape[3]
      h = q.shape[2]
      qg = q.reshape(b, length, kv_heads, h // kv_heads, e)
      shared = jnp.einsum('btkge,bske->bkgts', qg, k1)
      shared = jnp.where(sees_BxLxL(j)[:, None, None], shared, _NEG_INF)
      own = jnp.einsum('btkge,jbtke->bkgtj', qg, jnp.stack(own_k))
      probs = jax.nn.softmax(jnp.concatenate([shared, own], axis=-1), axis=-1)
      attn = (jnp.einsum('bkgts,bske->btkge', probs[..., :length], v1)
              + jnp.einsum('bkgtj,jbtke->btkge', probs[..., length:], jnp.stack(own_v)))
      attn = attn.reshape(b, length, h * e)
    hidden = _finish(params, geo, hidden, attn)
    outs.append(hidden)
  return outs
