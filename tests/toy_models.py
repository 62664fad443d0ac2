"""Toy targets and drafters whose behaviour is known in advance, for decoding tests.

A toy model is duck-typed like `LanguageModel`: a `config` (a tiny GemmaConfig; the
loops read vocab_size and max_position), `data_parallelism`, `init_cache` and
`forward`. `TableModel`'s logits depend on the current token only
(`logits = params[token]`): a bigram model whose table is its params, so one
compiled program serves every table. Drafters here are `Drafter`s with a custom
`propose`, whose per-row behaviour is data (their params), not a static argument.

Shapes: B batch, T tokens, S cache slots, G gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.models import gemma
from specjax.models.config import GemmaConfig, tiny_config
from specjax.models.language_model import LanguageModel


def gguf_exact(matrix, kind: str = 'Q8_0') -> np.ndarray:
  """`matrix` rounded to GGUF's `kind` and dequantized as gguf does: float32 weights that
  `models/q8_weights` splits back exactly. Q8_0, Q5_0 and Q4_0 by gguf's own quantizer;
  Q4_K and Q6_K, which gguf-py cannot quantize to, by `k_quant_exact`."""
  if kind in ('Q4_K', 'Q6_K'):
    return k_quant_exact(matrix, kind)
  import gguf  # pylint: disable=g-import-not-at-top
  matrix = np.asarray(matrix, np.float32)
  qtype = gguf.GGMLQuantizationType[kind]
  blocks = gguf.quants.quantize(matrix, qtype)
  return np.asarray(gguf.quants.dequantize(blocks, qtype), np.float32).reshape(matrix.shape)


def k_quant_exact(matrix, kind: str) -> np.ndarray:
  """`matrix` rounded to the weights of GGUF's Q4_K or Q6_K, with their arithmetic as
  `gguf.quants` dequantizes them (a simpler choice of scales than llama.cpp's search):

    Q6_K  per 16 weights w = (d * sc) * q, d a float16 per super-block, sc an int8,
          q in [-32, 31];
    Q4_K  per 32 weights w = (d * sc) * q - (dmin * m), d and dmin float16 per
          super-block, sc and m in [0, 63], q in [0, 15].

  A super-block is 256 weights, or the row where that is shorter."""
  w = np.asarray(matrix, np.float32)
  rows, width = w.shape
  block = 16 if kind == 'Q6_K' else 32
  per_super = min(256, width) // block
  if width % (per_super * block):
    raise ValueError(f'{kind}: a row of {width} is not whole super-blocks')
  w_SxBxK = w.reshape(-1, per_super, block).astype(np.float64)
  f16 = lambda x: x.astype(np.float16).astype(np.float32)  # noqa: E731

  def small_ints(values_SxB, largest):
    d = f16(values_SxB.max(axis=1, keepdims=True) / largest)
    ints = np.clip(np.rint(values_SxB / np.where(d == 0, 1, d)), -largest, largest)
    return d, ints.astype(np.float32)

  if kind == 'Q6_K':
    d, sc = small_ints(np.abs(w_SxBxK).max(axis=2) / 32, 127)
    a = (d * sc)[..., None]
    q = np.clip(np.rint(w_SxBxK / np.where(a == 0, 1, a)), -32, 31).astype(np.float32)
    out = a * q
  else:
    least = np.maximum(0, -w_SxBxK.min(axis=2))
    d, sc = small_ints((w_SxBxK.max(axis=2) + least) / 15, 63)
    dmin, m = small_ints(least, 63)
    a, b = (d * sc)[..., None], (dmin * m)[..., None]
    q = np.clip(np.rint((w_SxBxK + b) / np.where(a == 0, 1, a)), 0, 15).astype(np.float32)
    out = (a * q) - b
  return np.asarray(out, np.float32).reshape(rows, width)


def gguf_like_params(params):
  """A Gemma param tree with the embedded 270M's formats: the head Q8_0, the q, k, gate and up
  projections Q5_0, v Q8_0, o Q4_K and down Q6_K (the 270M: half Q6_K, half Q4_K)."""
  kinds = {'embedding_VxD': 'Q8_0', 'q_NHxD': 'Q5_0', 'k_KHxD': 'Q5_0', 'v_KHxD': 'Q8_0',
           'o_DxNH': 'Q4_K', 'gate_FxD': 'Q5_0', 'up_FxD': 'Q5_0', 'down_DxF': 'Q6_K'}

  def convert(tree):
    return {k: convert(v) if isinstance(v, dict) else
            (jnp.asarray(gguf_exact(v, kinds[k])) if k in kinds else v) for k, v in tree.items()}
  return convert(params)


# ---------------------------------------------------------------- toy targets


@dataclasses.dataclass(frozen=True, eq=False)
class TableModel:
  """Bigram model: the logits after token t are `params[t]` (a [V, V] table)."""

  config: GemmaConfig
  data_parallelism: int = 1

  def init_cache(self, batch: int, num_slots: int):
    del num_slots
    return jnp.zeros((batch,), jnp.float32)  # the table needs no cache

  def forward(self, params, tokens_BxT, positions_BxT, cache, logit_indices_BxR=None,
              num_layers=None, hidden_layers=(), tree_mask=None, greedy=False):
    del positions_BxT, num_layers, tree_mask  # a bigram model: context and tree shape play no part
    logits_BxTxV = jnp.asarray(params, jnp.float32)[tokens_BxT]
    # The "hidden state" of a bigram model is its current token, as a float.
    hidden_BxTxD = tokens_BxT[..., None].astype(jnp.float32)
    layer_hidden = jnp.stack([hidden_BxTxD] * len(hidden_layers)) if hidden_layers else None
    if logit_indices_BxR is not None:
      logits_BxTxV = jnp.take_along_axis(logits_BxTxV, logit_indices_BxR[:, :, None], axis=1)
    return gemma.ForwardOutput(logits_BxTxV, cache, hidden_BxTxD, layer_hidden,
                               _argmax_if(greedy, logits_BxTxV))


@functools.cache
def table_model(vocab: int) -> TableModel:
  """One object per vocabulary size, so programs compiled for it are reused."""
  return TableModel(tiny_config(vocab_size=vocab))


def count_up_table(vocab: int, sharpness: float = 1e4) -> np.ndarray:
  """logits = one_hot(t + 1 mod V) * sharpness: exactly one-hot after softmax."""
  return (np.eye(vocab, dtype=np.float32)[(np.arange(vocab) + 1) % vocab] * sharpness)


def random_table(vocab: int, seed: int, scale: float = 1.0) -> np.ndarray:
  """Random bigram logits, without ties."""
  return (np.random.default_rng(seed).normal(size=(vocab, vocab)) * scale).astype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class RowPadded:
  """A model whose batches are padded to a multiple of `data_parallelism` rows,
  as on a data-parallel mesh: a batch of 1 then compiles to the same program as
  a batch of `data_parallelism`, and exercises inactive padding rows."""

  model: Any
  data_parallelism: int

  @property
  def config(self) -> GemmaConfig:
    return self.model.config

  def init_cache(self, batch: int, num_slots: int):
    return self.model.init_cache(batch, num_slots)

  def forward(self, *args, **kwargs):
    return self.model.forward(*args, **kwargs)


@dataclasses.dataclass(frozen=True, eq=False)
class HiddenBigram:
  """A bigram target with hidden states: h = params['hidden_VxD'][token] and logits =
  h @ params['embedding_VxD']^T, so heads on h score against a real tied embedding
  while the sequence distribution is the bigram table hidden @ embedding^T."""

  config: GemmaConfig
  data_parallelism: int = 1

  def init_cache(self, batch: int, num_slots: int):
    del num_slots
    return jnp.zeros((batch,), jnp.float32)

  def forward(self, params, tokens_BxT, positions_BxT, cache, logit_indices_BxR=None,
              num_layers=None, hidden_layers=(), tree_mask=None, logits=True, greedy=False):
    del positions_BxT, num_layers, tree_mask  # a bigram: context plays no part
    hidden_BxTxD = params['hidden_VxD'][tokens_BxT]
    if not logits:
      return gemma.ForwardOutput(None, cache, hidden_BxTxD, None)
    logits = jnp.einsum('btd,vd->btv', hidden_BxTxD, params['embedding_VxD'])
    if logit_indices_BxR is not None:
      logits = jnp.take_along_axis(logits, logit_indices_BxR[:, :, None], axis=1)
    # "Layer" i's residual stream: the hidden state, scaled and shifted by i, so an
    # EAGLE drafter has features to read at every layer it asks for.
    layers = (jnp.stack([hidden_BxTxD * (1.0 + i) + 0.1 * i for i in sorted(set(hidden_layers))])
              if hidden_layers else None)
    return gemma.ForwardOutput(logits, cache, hidden_BxTxD, layers, _argmax_if(greedy, logits))


def _argmax_if(greedy: bool, logits):
  """What `ForwardOutput.argmax_BxR` holds for a greedy pass (the first maximum)."""
  return jnp.argmax(logits, axis=-1).astype(jnp.int32) if greedy else None


# --------------------------------------------------------------- toy drafters


def right_for_k_drafter(vocab: int, k_B) -> base.Drafter:
  """For the count-up target: row b's first k_B[b] drafts are right, the rest wrong.

  k is the drafter's params (data), so every k shares one compiled program.
  """

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del keys_B, sampling, shared
    last_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    i_G = jnp.arange(gamma)
    right_BxG = (last_B[:, None] + 1 + i_G[None, :]) % vocab
    wrong_BxG = (right_BxG + 1) % vocab
    draft_BxG = jnp.where(i_G[None, :] < params[:, None], right_BxG, wrong_BxG)
    return base.Proposal(draft_BxG.astype(jnp.int32), None,
                         jnp.full(lengths_B.shape, gamma, jnp.int32), state)

  return base.Drafter(name='right_for_k', vocab_size=vocab, init=base.no_state_init,
                      update=base.no_state_update, propose=propose,
                      params=jnp.asarray(k_B, jnp.int32))


def argmax_table_drafter(q_table, *, soft_q: bool = False) -> base.Drafter:
  """Drafts the argmax chain of a bigram table: deterministic, so q is one-hot.

  `soft_q=True` returns the table's processed softmax as q instead: the bug of
  reporting the soft q of an argmax drafter, which a distribution test must reject.
  """

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del keys_B, shared
    table_VxV = jnp.asarray(params, jnp.float32)
    token_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    drafts, qs = [], []
    for _ in range(gamma):
      logits_BxV = table_VxV[token_B]
      qs.append(sampling_lib.probabilities(logits_BxV, sampling))
      token_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
      drafts.append(token_B)
    q_BxGxV = jnp.stack(qs, axis=1) if soft_q else None
    return base.Proposal(jnp.stack(drafts, axis=1), q_BxGxV,
                         jnp.full(lengths_B.shape, gamma, jnp.int32), state)

  return base.Drafter(name='argmax_table_soft_q' if soft_q else 'argmax_table',
                      vocab_size=int(np.shape(q_table)[0]), init=base.no_state_init,
                      update=base.no_state_update, propose=propose,
                      params=jnp.asarray(q_table, jnp.float32))


# ------------------------------------------------------------- tiny real Gemma

REFERENCE_PROMPT = (2, 5, 9, 11)


@functools.partial(jax.jit, static_argnames=('model',))
def _full_forward_logits(model, params, tokens_1xS):
  """Logits at every position from one uncached pass over a fresh cache."""
  num_slots = tokens_1xS.shape[1]
  positions_1xS = jnp.arange(num_slots, dtype=jnp.int32)[None]
  return model.forward(params, tokens_1xS, positions_1xS,
                       model.init_cache(1, num_slots)).logits_BxRxV[0]


def reference_greedy(model, params, prompt, num_new: int, eos_ids=(), width: int = 64):
  """Greedy continuation by full forward passes, independent of the decoding loops."""
  if len(prompt) + num_new > width:
    raise ValueError('reference_greedy: prompt + num_new exceeds the buffer width')
  tokens = np.zeros((1, width), np.int32)
  tokens[0, :len(prompt)] = prompt
  length, out = len(prompt), []
  for _ in range(num_new):
    logits_SxV = np.asarray(_full_forward_logits(model, params, jnp.asarray(tokens)))
    token = int(np.argmax(logits_SxV[length - 1]))
    out.append(token)
    tokens[0, length] = token
    length += 1
    if token in eos_ids:
      break
  return out


def random_params(config: GemmaConfig, seed: int, *, embedding: float = 0.3,
                  post_norms: float = 2.0, final_norm: float = 10.0):
  """Random float32 Gemma params with init_params' layout and scales, drawn in numpy
  (no compile; eager `init_params` takes seconds on a busy CPU).

  Random tied-embedding models copy their last token forever; shrinking the
  embedding and boosting the blocks' outputs gives a varied greedy continuation,
  and a larger final norm widens the gaps between logits (no near-ties).
  """
  rng = np.random.default_rng(seed)

  def draw(path, shape_dtype):
    names = [str(getattr(k, 'key', k)) for k in path]
    shape = shape_dtype.shape
    if names[-1] == 'scale':
      value = np.ones(shape)
      if names[0] == 'final_norm':
        value *= final_norm
      elif names[-2].startswith('post_'):
        value *= post_norms
    elif names[0] == 'embedding_VxD':
      value = rng.normal(size=shape) * config.embed_dim ** -0.5 * embedding
    else:
      value = rng.normal(size=shape) * 0.2
    return jnp.asarray(value, jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, gemma.param_shapes(config))


def _check_varied(model, params, what: str):
  out = reference_greedy(model, params, REFERENCE_PROMPT, 24)
  assert len(set(out)) >= 6, f'{what}: greedy continuation is not varied: {out}'


@functools.cache
def tiny_gemma() -> tuple[LanguageModel, Any]:
  """A 4-layer, vocab-64 random Gemma 3 whose greedy output is varied."""
  config = tiny_config()
  params = random_params(config, seed=2)
  model = LanguageModel(config)
  _check_varied(model, params, 'tiny_gemma')
  return model, params


@functools.cache
def small_draft_gemma() -> tuple[LanguageModel, Any]:
  """A smaller (2-layer, width-16) random Gemma with tiny_gemma's vocabulary."""
  config = tiny_config(num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8,
                       hidden_dim=32)
  params = random_params(config, seed=0)
  model = LanguageModel(config)
  assert config.vocab_size == tiny_gemma()[0].config.vocab_size
  _check_varied(model, params, 'small_draft_gemma')
  return model, params


# ---------------------------------------------------------- toy tree drafters


def _chain_only(**kwargs):
  raise NotImplementedError('a tree drafter: use it with a tree')


def ranked_table_tree_drafter(q_table, *, duplicate: bool = False) -> base.Drafter:
  """Fills a token tree from a bigram table: a node's r-th child is the table's r-th
  most likely token after the node's own token (distinct siblings, deterministic:
  q one-hot, returned None), a Medusa-style top-k tree. `duplicate=True` gives
  every child the most likely token: identical siblings, which the rule must handle."""

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree,
                   shared=None):
    del keys_B, sampling, shared
    order_VxV = jnp.argsort(-jnp.asarray(params, jnp.float32), axis=1)
    last_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    tokens = []
    for p, rank in zip(tree.parents, tree.child_rank_N):
      parent_B = last_B if p < 0 else tokens[p]
      tokens.append(order_VxV[parent_B, 0 if duplicate else int(rank)])
    tokens_BxN = jnp.stack(tokens, axis=1).astype(jnp.int32)
    return base.TreeProposal(tokens_BxN, None, jnp.ones(tokens_BxN.shape, bool), state)

  return base.Drafter(name='ranked_table_tree' + ('_dup' if duplicate else ''),
                      vocab_size=int(np.shape(q_table)[0]), init=base.no_state_init,
                      update=base.no_state_update, propose=_chain_only,
                      params=jnp.asarray(q_table, jnp.float32), propose_tree=propose_tree)


def sampled_table_tree_drafter(q_table) -> base.Drafter:
  """Fills a token tree with draws from a bigram table: a node's children are i.i.d.
  draws from q(. | node's token), and q is reported (SpecInfer's setting)."""

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree,
                   shared=None):
    del shared
    table_VxV = jnp.asarray(params, jnp.float32)
    last_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    tokens, qs = [], []
    for i, p in enumerate(tree.parents):
      parent_B = last_B if p < 0 else tokens[p]
      token_B, q_BxV = sampling_lib.draw(sampling_lib.step_keys(keys_B, i), table_VxV[parent_B],
                                         sampling)
      tokens.append(token_B)
      qs.append(q_BxV)
    tokens_BxN = jnp.stack(tokens, axis=1).astype(jnp.int32)
    q_BxNxV = None if qs[0] is None else jnp.stack(qs, axis=1)
    return base.TreeProposal(tokens_BxN, q_BxNxV, jnp.ones(tokens_BxN.shape, bool), state)

  return base.Drafter(name='sampled_table_tree', vocab_size=int(np.shape(q_table)[0]),
                      init=base.no_state_init, update=base.no_state_update, propose=_chain_only,
                      params=jnp.asarray(q_table, jnp.float32), propose_tree=propose_tree)
