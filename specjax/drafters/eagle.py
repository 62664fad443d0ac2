"""EAGLE-3-style drafting: an autoregressive head in the target's feature space.

The network (`eagle_net.py`) is one decoder layer over the fused target
features and the next token's embedding. In decoding:

- `init` writes the layer's keys and values over the prompt: chain position t
  reads the fused target feature at t and the token at t + 1 (the last one is
  the pending token the prefill chose), filling the drafter's own KV cache;
- `update`, after every target call, writes them over the call's positions
  (the pending token and the drafts) from the target's real features, so
  every cache slot below the new pending token holds keys made from the
  target's features, whatever the drafts had written there;
- `propose` drafts: draft 1 from the layer's output at the position before
  the pending token, then each further draft from the layer's own previous
  output and the draft before it, one position at a time;
- `propose_tree` fills a static token tree as EAGLE-2 does (its static
  variant): a node that is its parent's r-th child takes the r-th most likely
  token after its parent, and the layer runs once per depth over the nodes
  that have children, each seeing the committed cache and its own ancestors
  (`eagle_net.step_nodes`), so every root-to-node path drafts what `propose`
  would draft along it. Siblings are distinct and ranked, never sampled, so q
  is one-hot (None) and the tree rule stays exact under sampling. After the
  call the target's view is the accepted path as a chain, which `update`
  takes as it takes a chain's.

A position's keys depend only on its own inputs, and drafting reads the
layer's output at one position only (the one before the pending token), so
`init` and `update` write keys and keep that position's inputs
(`hidden_BxD`, `embedded_BxD`), and `propose` runs the rest of the layer
(queries, attention, MLP) there, in the steps that draft. Running the whole
layer over every call's positions in `update`, as before, cost a step that
drafts nothing (a plain step, or a hybrid's lookup step) the layer's
attention and MLP over gamma + 1 positions for an output it never read.

The state keeps those inputs and the cache. It
reads the target's embedding and no other target weight (`reads_target_params`);
its head is the target's tied table restricted to the draft vocabulary,
gathered once. Trained by `python -m specjax.train --config=configs/train_eagle.py`.

Shapes: B batch, S slots, T positions, L fused layers, D width, G gamma,
N draft vocabulary, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import candidate_tree
from specjax.drafters import confidence
from specjax.drafters import draft_vocab
from specjax.drafters import eagle_net
from specjax.models.language_model import LanguageModel

Array = jax.Array

MIN_WINDOW = 16   # longer than any chain or tree drafts, so drafts always see each other
WEIGHTS = ('float32', 'int8')


@dataclasses.dataclass(frozen=True)
class Settings:
  """checkpoint: a trained drafter (a directory `specjax.train` wrote, or 'embedded' for
    the one shipped for the embedded 270M); '' is refused: an untrained EAGLE drafts noise.
  min_confidence: drafts less likely than this under the drafter end the evidence.
  window: how far back the layer attends (`eagle_net`): -1 the length of the
    sequences it was trained on (from its checkpoint), 0 no limit, or a number of
    positions (at least MIN_WINDOW, so a chain or tree always sees its own drafts).
  weights: 'int8' rounds the layer's matrices to int8 blocks
    (`eagle_net.with_int8_form`), which the CPU kernel reads at a quarter of the
    bytes: on 8 raw-text Spec-Bench prompts, interleaved on a 2-core Xeon, a
    chain of 4 ran 1.13x of plain decoding against 1.07x as trained, accepting
    231 drafts against 230 (6 December 2026). 'float32' serves it as trained.
  draft_vocab_size: score at most the first N ids of the drafter's draft
    vocabulary (ranked by how often the target produced each token,
    `build_draft_vocab`); 0 scores all of them, as does a drafter trained over
    the full vocabulary (whose ids are not ranked). The head over the draft vocabulary is most of what a
    draft reads (16,384 x 640 = 10.5M int8 weights, against the layer's 5.8M),
    and the shipped drafter's vocabulary holds the 4,820 tokens the target
    produced in calibration, then a tail ranked by prompt counts and id. With
    the first 4,096, 4 drafts cost 0.18-0.24 of a decode step against 0.25-0.34
    on a 2-core Xeon, and the hybrid over it ran 1.43x against 1.38x with all
    16,384 (n-gram lookup 1.41x; the first prompt of 13 raw-text Spec-Bench
    tasks, interleaved, `benchmarks/drafter_speed.py`, 7 December 2026), though
    the target's greedy tokens there are in the first 4,096 80% of the time
    against 90%."""

  checkpoint: str = 'embedded'
  min_confidence: float = 0.0
  window: int = -1
  weights: str = 'int8'
  draft_vocab_size: int = 4096

  def __post_init__(self):
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')
    if self.window not in (-1, 0) and self.window < MIN_WINDOW:
      raise ValueError(f'window must be -1 (the trained length), 0 (none) or >= {MIN_WINDOW}, '
                       f'got {self.window}')
    if self.weights not in WEIGHTS:
      raise ValueError(f'weights must be one of {", ".join(WEIGHTS)}, got {self.weights!r}')
    if self.draft_vocab_size < 0:
      raise ValueError(f'draft_vocab_size must be >= 0 (0: all of the drafter\'s), '
                       f'got {self.draft_vocab_size}')


def _at(x_BxTxD: Array, index_B: Array) -> Array:
  rows = jnp.arange(x_BxTxD.shape[0])
  return x_BxTxD[rows, jnp.clip(index_B, 0, x_BxTxD.shape[1] - 1)]


def _next_tokens(tokens_BxS: Array, positions_BxT: Array) -> Array:
  """The token after each chain position (x_{t+1}); past the buffer, token 0 (masked later)."""
  s = tokens_BxS.shape[1]
  nxt = positions_BxT + 1
  return jnp.where(nxt < s, jnp.take_along_axis(tokens_BxS, jnp.clip(nxt, 0, s - 1), axis=1), 0)


def make(target: LanguageModel, net: dict[str, Any], hidden_layers: tuple[int, ...],
         settings: Settings = Settings(), vocab_ids_N: np.ndarray | None = None,
         target_params=None, trained_length: int | None = None) -> base.Drafter:
  """The drafter for trained `net` weights reading the target's `hidden_layers`;
  `trained_length` is the sequence length it was trained on (None: unknown)."""
  cfg = target.config
  hidden_layers = tuple(int(i) for i in hidden_layers)
  eagle_net.check_shapes(net, cfg, len(hidden_layers))
  bad = [i for i in hidden_layers if not 0 <= i < cfg.num_layers]
  if bad:
    raise ValueError(f'eagle reads target layers {bad}, but the target has {cfg.num_layers}')
  if target_params is None:
    raise ValueError('the eagle drafter needs the target params to gather its head from')
  ids = draft_vocab.checked_ids(vocab_ids_N, cfg.vocab_size, 'eagle draft')
  if settings.draft_vocab_size and ids is not None:
    ids = ids[:settings.draft_vocab_size]
  # A draft vocabulary's rows are gathered once here; the full table is read where it is.
  head_NxD, head_q8 = (None, None) if ids is None else draft_vocab.head_rows(target_params, ids)
  net = dict(net)
  params = {'net': (eagle_net.with_int8_form(net) if settings.weights == 'int8'
                    else jax.tree.map(jnp.asarray, net)),
            'ids_N': None if ids is None else jnp.asarray(ids),
            'head_NxD': head_NxD, 'head_q8': head_q8}

  def head(params, target_params):
    """(float32 rows, their int8 form or None) of the draft head."""
    if params['head_NxD'] is None:
      return draft_vocab.head_rows(target_params, None)
    return params['head_NxD'], params['head_q8']
  window = {-1: trained_length, 0: None}.get(settings.window, settings.window)
  if window is not None and window < MIN_WINDOW:
    raise ValueError(f'eagle was trained on sequences of {window} tokens: too short to draft '
                     f'with a window of them; set eagle.window to 0 or >= {MIN_WINDOW}')
  geo = eagle_net.Geometry.of(net, cfg.rms_norm_eps, window)

  def layer_inputs(params, target_params, view: base.TargetView):
    """The fused target features at the view's positions and the next tokens' embeddings."""
    hidden_BxTxD = eagle_net.fuse(params['net'], view.layer_hidden_LxBxTxD)
    embedded_BxTxD = eagle_net.embed(target_params['embedding_VxD'],
                                     _next_tokens(view.tokens_BxS, view.positions_BxT))
    return hidden_BxTxD, embedded_BxTxD

  def catch_up(params, target_params, cache, view: base.TargetView):
    """Keys and values at the view's positions from the target's fused features, and
    the layer's inputs at the position before the pending token (lengths - 2), whose
    output drafts next. A prompt of hundreds of tokens or a call of gamma + 1
    positions would otherwise run the layer's attention and MLP at every position
    (on a 2-core CPU, 896 prompt positions cost 1.8 decode steps that way)."""
    hidden_BxTxD, embedded_BxTxD = layer_inputs(params, target_params, view)
    cache = eagle_net.write_keys(params['net'], geo, hidden_BxTxD, embedded_BxTxD,
                                 view.positions_BxT, cache)
    last_B = view.lengths_B - 2 - view.positions_BxT[:, 0]
    return {'hidden_BxD': _at(hidden_BxTxD, last_B), 'embedded_BxD': _at(embedded_BxTxD, last_B),
            'cache': cache}

  def init(*, params, target: base.TargetView, target_params):
    batch, slots = target.tokens_BxS.shape
    # The pending token is at lengths - 1; prefill positions are 0 .. P-1.
    return catch_up(params, target_params, eagle_net.init_cache(geo, batch, slots + 2), target)

  def update(*, params, state, target: base.TargetView, target_params):
    return catch_up(params, target_params, state['cache'], target)

  def first_output(params, state, lengths_B):
    """The layer's output at lengths - 2 from the inputs `catch_up` kept: what draft 1
    (and a tree's first level) is read from."""
    out_Bx1xD, cache = eagle_net.step(params['net'], geo, state['hidden_BxD'][:, None],
                                      state['embedded_BxD'][:, None], (lengths_B - 2)[:, None],
                                      state['cache'])
    return out_Bx1xD[:, 0], cache

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None,
              target_params):
    del tokens_BxS, shared
    ids_N = params['ids_N']
    out_BxD, cache = first_output(params, state, lengths_B)
    drafts, qs, probs = [], [], []
    for k in range(gamma):
      if k > 0:   # the layer at the previous draft's position, on its own last output
        position_Bx1 = (lengths_B - 2 + k)[:, None]
        embedded = eagle_net.embed(target_params['embedding_VxD'], drafts[-1][:, None])
        out_Bx1xD, cache = eagle_net.step(params['net'], geo, out_BxD[:, None], embedded,
                                          position_Bx1, cache)
        out_BxD = out_Bx1xD[:, 0]
      head_NxD, head_q8 = head(params, target_params)
      logits_BxN = eagle_net.logits(params['net'], head_NxD, out_BxD[:, None], cfg, geo.eps,
                                    head_q8)[:, 0]
      step_keys = sampling_lib.step_keys(keys_B, k)
      token_B, index_B, q_BxV = draft_vocab.draw(step_keys, logits_BxN, ids_N, cfg.vocab_size,
                                                 sampling)
      probs.append(confidence.draft_probability(logits_BxN, index_B))
      drafts.append(token_B.astype(jnp.int32))
      if q_BxV is not None:
        qs.append(q_BxV)
    num_drafts_B = confidence.confident_prefix(jnp.stack(probs, axis=1), settings.min_confidence)
    return base.Proposal(jnp.stack(drafts, axis=1), jnp.stack(qs, axis=1) if qs else None,
                         num_drafts_B, dict(state, cache=cache))

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree, shared=None,
                   target_params):
    del tokens_BxS, keys_B, sampling, shared
    ids_N = params['ids_N']
    head_NxD, head_q8 = head(params, target_params)
    root_BxD, cache = first_output(params, state, lengths_B)
    batch = lengths_B.shape[0]
    num_nodes = tree.num_nodes
    shape = (batch, num_nodes) + cache['k'].shape[2:]
    nodes = {'k': jnp.zeros(shape, cache['k'].dtype), 'v': jnp.zeros(shape, cache['v'].dtype)}
    sees_NxN = jnp.asarray(tree.mask_TxT[1:, 1:])   # ancestor-or-self among the nodes
    # out_T[t] drafts tree index t's children (0: the root, i + 1: node i).
    out_T = [root_BxD] + [None] * num_nodes
    ranked = {}   # tree index -> (token_BxR, prob_BxR) of its R best children

    def children_of(t):
      if t not in ranked:
        r = 1 + max(int(tree.child_rank_N[i]) for i in tree.children[t])
        logits_BxN = eagle_net.logits(params['net'], head_NxD, out_T[t][:, None], cfg,
                                      geo.eps, head_q8)[:, 0]
        ranked[t] = draft_vocab.ranked(logits_BxN, r, ids_N)
      return ranked[t]

    tokens, valid = [None] * num_nodes, [None] * num_nodes
    for depth in range(1, tree.max_depth + 1):
      expand = candidate_tree.fill_ranked_level(tree, depth, children_of,
                                                settings.min_confidence, tokens, valid)
      if not expand:
        continue
      hidden_BxWxD = jnp.stack([out_T[tree.parents[i] + 1] for i in expand], axis=1)
      embedded = eagle_net.embed(target_params['embedding_VxD'],
                                 jnp.stack([tokens[i] for i in expand], axis=1))
      positions_BxW = jnp.broadcast_to((lengths_B - 2 + depth)[:, None], (batch, len(expand)))
      index_W = np.asarray(expand, np.int32)
      out_BxWxD, nodes = eagle_net.step_nodes(params['net'], geo, hidden_BxWxD, embedded,
                                              positions_BxW, cache, lengths_B - 2, nodes,
                                              index_W, sees_NxN[index_W])
      for w, i in enumerate(expand):
        out_T[i + 1] = out_BxWxD[:, w]
    return base.TreeProposal(jnp.stack(tokens, axis=1), None, jnp.stack(valid, axis=1), state)

  return base.Drafter(name='eagle', vocab_size=cfg.vocab_size, init=init, update=update,
                      propose=propose, params=params, hidden_layers=hidden_layers,
                      reads_target_params=True, costly_drafts=True, propose_tree=propose_tree)
