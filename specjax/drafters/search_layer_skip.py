r"""Searches which target layers a layer-skipping self-drafter should leave out.

  python -m specjax.drafters.search_layer_skip \
      --out=specjax/drafters/data/gemma3-270m-layer-skip.json

On calibration prompts (specjax/prompts/calibration.jsonl, not Spec-Bench),
the target's own greedy continuations are the reference. For a skip set S the
draft (the target without S, then the final norm and the reduced head) runs
teacher-forced over each whole sequence, and its agreement `a` is the share of
continuation positions where its argmax is the target's next token. The cost
`c` of a draft step relative to a target step is estimated from the weights it
reads (kept layers + head rows over all layers + the full head: a decode step
of a small model is bound by reading its weights). With gamma drafts per call
and independent acceptances, a call commits (1 - a^(gamma+1)) / (1 - a)
tokens for 1 + gamma c steps' cost; that ratio is the estimated speedup the
search maximises, adding one layer at a time (greedy forward selection) while
it grows.

Teacher forcing is an approximation: in decoding, the kept layers attend to
the full model's keys and values at committed positions, here to the draft's
own. The file records the set, the command, each round's figures and the
model it was found for (the drafter refuses it for another model).

Shape letters: B batch, T positions, D width, N draft vocabulary.
"""

from __future__ import annotations

import json
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specjax import checkpoints
from specjax import compile_cache
from specjax.checkpoints import embedded
from specjax.decoding import autoregressive
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.experiments import loading
from specjax.experiments import prompts as prompts_lib
from specjax.models import gemma
from specjax.models import kv_cache as kv_cache_lib
from specjax.models import language_model

_MODEL = flags.DEFINE_string('model', 'embedded:gemma3-270m', 'The target checkpoint.')
_OUT = flags.DEFINE_string('out', None, 'The .json to write.', required=True)
_VOCAB = flags.DEFINE_string('draft_vocab', 'embedded', "The draft head's vocabulary file.")
_VOCAB_SIZE = flags.DEFINE_integer('draft_vocab_size', 32768, 'Its first N ids.')
_PROMPTS = flags.DEFINE_integer('prompts', 12, 'Calibration prompts used (every k-th).')
_NEW = flags.DEFINE_integer('max_new_tokens', 40, 'Greedy tokens per prompt.')
_GAMMA = flags.DEFINE_integer('gamma', 4, 'Drafts per call in the speedup estimate.')
_MAX_SKIP = flags.DEFINE_integer('max_skip', 12, 'The most layers skipped.')


def estimated_speedup(agreement: float, cost: float, gamma: int) -> float:
  """Expected tokens per call over its cost in target steps (Leviathan et al. 2023)."""
  a = min(agreement, 1 - 1e-9)
  return (1 - a ** (gamma + 1)) / (1 - a) / (1 + gamma * cost)


class Search:
  """Runs the target layer by layer over fixed sequences, so that a skip set costs no compile."""

  def __init__(self, config, params, head_NxD, ids_N, tokens_BxT, score_BxT):
    self.config, self.params = config, params
    self.tokens_BxT, self.score_BxT = tokens_BxT, score_BxT
    b, t = tokens_BxT.shape
    self.positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    self.cache = kv_cache_lib.init(config, b, t)
    self.head_NxD, self.ids_N = head_NxD, ids_N
    self.next_BxT = jnp.concatenate([tokens_BxT[:, 1:], tokens_BxT[:, -1:]], axis=1)
    self.layer = {kind: jax.jit(lambda p, x, pos, c, kind=kind: gemma.Block(
        config, kind).apply({'params': p}, x, pos, c)[0]) for kind in ('local', 'global')}

    @jax.jit
    def embed(emb_VxD, tokens_BxT):
      x = jnp.take(emb_VxD, tokens_BxT, axis=0)
      return x * jnp.asarray(np.sqrt(config.embed_dim), x.dtype)

    @jax.jit
    def agree(scale_D, x_BxTxD):
      h = gemma.rms_norm(x_BxTxD, scale_D, config.rms_norm_eps)
      logits = gemma.softcap_logits(gemma.linear(h, self.head_NxD, jnp.float32), config)
      draft_BxT = jnp.take(self.ids_N, jnp.argmax(logits, axis=-1))
      return jnp.sum((draft_BxT == self.next_BxT) * self.score_BxT) / jnp.sum(self.score_BxT)

    self.x0 = embed(params['embedding_VxD'], tokens_BxT)
    self._agree = agree

  def inputs(self, skip: frozenset[int]) -> list:
    """The input of every layer (and the final output, last) with `skip` left out."""
    xs, x = [], self.x0
    for i in range(self.config.num_layers):
      xs.append(x)
      x = self.run_layer(i, x, skip)
    return xs + [x]

  def run_layer(self, i, x, skip):
    if i in skip:
      return x
    return self.layer[self.config.attention_kind(i)](self.params[f'layer_{i}'], x,
                                                     self.positions_BxT, self.cache[i])

  def agreement_from(self, start: int, x, skip: frozenset[int]) -> float:
    for i in range(start, self.config.num_layers):
      x = self.run_layer(i, x, skip)
    return float(self._agree(self.params['final_norm']['scale'], x))


def weights_read(config, params, skip, head_rows: int) -> int:
  layer = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params['layer_0']))
  return layer * (config.num_layers - len(skip)) + head_rows * config.embed_dim


def main(argv):
  del argv
  compile_cache.enable()
  start = time.time()
  model_config, params = checkpoints.load_checkpoint(_MODEL.value)
  params = jax.device_put(params)
  model = language_model.single_device(model_config)
  source = (str(embedded.default_gguf_path()) if _MODEL.value.startswith('embedded:')
            else _MODEL.value)
  tokenizer = loading.load_tokenizer(source)
  vocab = draft_vocab_lib.resolve(_VOCAB.value, _VOCAB_SIZE.value,
                                  vocab_size=model_config.vocab_size,
                                  tokenizer=draft_vocab_lib.tokenizer_fingerprint(tokenizer))
  prompts, prompts_sha = prompts_lib.prompt_set('calibration')
  step = max(1, len(prompts) // _PROMPTS.value)
  chosen = prompts[::step][:_PROMPTS.value]
  ids = [tokenizer.encode(p.text, add_bos=True) for p in chosen]
  gen = autoregressive.generate(model, params, ids, max_new_tokens=_NEW.value)
  width = max(len(p) + len(g) for p, g in zip(ids, gen.new_tokens))
  tokens = np.zeros((len(ids), width), np.int32)
  score = np.zeros((len(ids), width), np.float32)
  for b, (p, g) in enumerate(zip(ids, gen.new_tokens)):
    seq = p + g
    tokens[b, :len(seq)] = seq
    score[b, len(p) - 1:len(seq) - 1] = 1.0   # predictions of the continuation tokens
  ids_N = jnp.asarray(vocab.ids_N, jnp.int32)
  search = Search(model_config, params, draft_vocab_lib.reduced_head(params['embedding_VxD'],
                                                                     ids_N),
                  ids_N, jnp.asarray(tokens), jnp.asarray(score))
  full = weights_read(model_config, params, (), model_config.vocab_size)

  def figures(skip, agreement):
    cost = weights_read(model_config, params, skip, vocab.size) / full
    return dict(skip=sorted(skip), agreement=round(agreement, 4), cost=round(cost, 4),
                estimated_speedup=round(estimated_speedup(agreement, cost, _GAMMA.value), 4))

  skip = frozenset()
  xs = search.inputs(skip)
  best = figures(skip, search.agreement_from(model_config.num_layers, xs[-1], skip))
  rounds = [best]
  logging.info('no layer skipped (reduced head only): %s', best)
  while len(skip) < min(_MAX_SKIP.value, model_config.num_layers - 1):
    candidates = []
    for j in sorted(set(range(model_config.num_layers)) - skip):
      trial = skip | {j}
      candidates.append(figures(trial, search.agreement_from(j, xs[j], trial)))
    top = max(candidates, key=lambda f: f['estimated_speedup'])
    logging.info('round %d: %s', len(skip) + 1, top)
    rounds.append(dict(top, candidates=len(candidates)))
    skip = frozenset(top['skip'])
    xs = search.inputs(skip)
    if top['estimated_speedup'] > best['estimated_speedup']:
      best = top
  result = dict(
      skip=best['skip'], figures=best,
      model=dict(name=_MODEL.value, num_layers=model_config.num_layers,
                 embed_dim=model_config.embed_dim, vocab_size=model_config.vocab_size),
      command='python -m specjax.drafters.search_layer_skip ' + ' '.join(sys.argv[1:]),
      draft_vocab=dict(file=_VOCAB.value, size=vocab.size), gamma=_GAMMA.value,
      prompts=f'specjax/prompts/{prompts_lib.CALIBRATION}', prompts_sha256=prompts_sha,
      num_prompts=len(chosen), max_new_tokens=_NEW.value,
      method='greedy forward selection; teacher-forced agreement with the target\'s greedy '
             'continuation; cost = weights read relative to a full step',
      rounds=rounds, seconds=round(time.time() - start))
  with open(_OUT.value, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(f'{_OUT.value}: skip {best["skip"]}: {best}')


if __name__ == '__main__':
  app.run(main)
