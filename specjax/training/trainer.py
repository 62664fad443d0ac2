"""Training a drafter against a frozen target: optax, Orbax, resumable, with progress.

`train(cfg)` runs the whole recipe: self-distillation data (made if missing,
`distill_data`), the target's features for every sequence (one teacher-forced
pass, computed once and kept on disk under `output_dir/teacher` as memory maps,
`teacher_store`: on a CPU that pass costs more than the drafter's whole update,
so recomputing it every step would dominate, and a resumed run reads it back;
for EAGLE with `soft_labels` the same pass keeps the target's likeliest next
tokens at every position), the drafter's objective
(`medusa_objective`, `eagle_objective`, `distilled_objective`), AdamW with linear warm-up and cosine decay and
gradient clipping, from random weights or (`init_from`) a trained drafter of the
same shape, and an Orbax checkpoint every `checkpoint_every` steps of
the drafter's weights and the optimizer state (the last `keep` kept). A killed run
restarts from its last checkpoint on the same trajectory: the batch of step s
is a pure function of (seed, s), so the resumed losses equal those of an
unbroken run. The target is loaded once and never updated (its params are not
an argument of the gradient).

Progress goes to the absl log (loss, per-head accuracy, tokens/s, time left);
every logged step is a line of `metrics.jsonl`, held-out figures every
`eval_every` steps (mean accepted tokens of a greedy chain, teacher-forced on
held-out shards, over every position and walked in served order, as decoding
commits them; the second is the lower and the one that predicts decoding,
`medusa_objective.served_order`), and `curve.png` is redrawn at each evaluation when
matplotlib is installed. The trained drafter is exported with its manifest
(`checkpoints.drafter_io`) to `output_dir/drafter`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from specjax import checkpoints
from specjax.checkpoints import CheckpointError
from specjax.checkpoints import drafter_io
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.drafters import eagle_net
from specjax.experiments import loading
from specjax.experiments import tiny
from specjax.experiments.config import TINY_RANDOM
from specjax.models import gemma
from specjax.models import language_model
from specjax.models import q8_weights
from specjax.training import distill_data
from specjax.training import distilled_objective
from specjax.training import eagle_objective
from specjax.training import medusa_objective
from specjax.training import teacher_store

TRAINABLE = ('medusa', 'eagle', 'distilled')
EAGLE_KEYS = {'steps': int, 'mlp_width': int, 'hidden_layers': (tuple, list),
              'soft_labels': int}
DISTILLED_KEYS = {'layers': int, 'loss': str}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run; see configs/train_medusa.py, train_eagle.py and train_distilled.py
  for what each key means. `num_heads` is Medusa's; `eagle` holds the EAGLE layer's
  settings (steps: training-time-test depth, mlp_width, hidden_layers: () = EAGLE-3's
  three, soft_labels: J > 0 scores on the target's J likeliest tokens); `distilled` the
  distilled student's (layers: the target's first blocks it starts from, loss: 'tv' or
  'kl')."""

  target: str
  drafter: str
  draft_vocab: str
  draft_vocab_size: int
  data: dict
  heldout_shards: int
  batch_size: int
  steps: int
  learning_rate: float
  warmup_steps: int
  final_learning_rate: float
  weight_decay: float
  clip_norm: float
  checkpoint_every: int
  keep: int
  eval_every: int
  log_every: int
  seed: int
  output_dir: str
  num_heads: int = 4
  eagle: dict = dataclasses.field(default_factory=dict)
  distilled: dict = dataclasses.field(default_factory=dict)
  data_dir: str = ''   # '' = output_dir/data; drafters of one target can share their data
  export_dtype: str = 'float32'   # the exported drafter's weights: 'float32' or 'bfloat16'
  init_from: str = ''   # '' = random weights; else a trained drafter (directory or 'embedded')

  @classmethod
  def from_config(cls, config) -> TrainConfig:
    values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = sorted(set(values) - names), sorted(required - set(values))
    if unknown or missing:
      raise ValueError(f'train config: unknown key(s) {unknown}, missing key(s) {missing}')
    return cls(**values)

  def __post_init__(self):
    if self.drafter not in TRAINABLE:
      raise ValueError(f"config.drafter is {self.drafter!r}: the trainer knows "
                       f"{', '.join(map(repr, TRAINABLE))}")
    unknown = sorted(set(self.eagle) - set(EAGLE_KEYS))
    if unknown:
      raise ValueError(f'config.eagle has unknown key(s) {unknown}; known: {sorted(EAGLE_KEYS)}')
    for key, kind in EAGLE_KEYS.items():
      if key in self.eagle and (not isinstance(self.eagle[key], kind)
                                or isinstance(self.eagle[key], bool)):
        raise ValueError(f'config.eagle.{key} must be {kind}, got {self.eagle[key]!r}')
    for key in ('steps', 'mlp_width'):
      if self.eagle.get(key, 1) < 1:
        raise ValueError(f'config.eagle.{key} must be >= 1, got {self.eagle[key]}')
    soft_labels = self.eagle.get('soft_labels', 0)
    if soft_labels < 0 or (self.draft_vocab and soft_labels > self.draft_vocab_size):
      raise ValueError(f'config.eagle.soft_labels must be in [0, draft_vocab_size = '
                       f'{self.draft_vocab_size}], got {soft_labels}')
    unknown = sorted(set(self.distilled) - set(DISTILLED_KEYS))
    if unknown:
      raise ValueError(f'config.distilled has unknown key(s) {unknown}; known: '
                       f'{sorted(DISTILLED_KEYS)}')
    for key, kind in DISTILLED_KEYS.items():
      if key in self.distilled and (not isinstance(self.distilled[key], kind)
                                    or isinstance(self.distilled[key], bool)):
        raise ValueError(f'config.distilled.{key} must be {kind.__name__}, got '
                         f'{self.distilled[key]!r}')
    if self.distilled.get('loss', 'tv') not in distilled_objective.LOSSES:
      raise ValueError(f"config.distilled.loss must be one of "
                       f"{', '.join(distilled_objective.LOSSES)}, got {self.distilled['loss']!r}")
    for key in ('num_heads', 'draft_vocab_size', 'batch_size', 'steps', 'checkpoint_every',
                'keep', 'eval_every', 'log_every', 'heldout_shards'):
      if getattr(self, key) < 1:
        raise ValueError(f'config.{key} must be >= 1, got {getattr(self, key)}')
    try:  # the data recipe's keys and values, before anything loads
      distill_data.Recipe(target=self.target, target_sha256='', **self.data)
    except TypeError as e:
      raise ValueError(f'config.data: {e}') from None
    except ValueError as e:
      raise ValueError(f'config.{e}') from None
    if self.heldout_shards >= self.data.get('num_shards', 0):
      raise ValueError(f'config.heldout_shards ({self.heldout_shards}) must leave training '
                       f'shards out of config.data.num_shards ({self.data.get("num_shards")})')
    if not self.learning_rate > 0 or self.final_learning_rate < 0 or self.clip_norm <= 0:
      raise ValueError('config.learning_rate and config.clip_norm must be > 0 and '
                       'config.final_learning_rate >= 0')
    if self.export_dtype not in ('float32', 'bfloat16'):
      raise ValueError(f"config.export_dtype must be 'float32' or 'bfloat16', got "
                       f'{self.export_dtype!r}')
    if not isinstance(self.init_from, str):
      raise ValueError(f'config.init_from must be a drafter directory, got {self.init_from!r}')
    if self.init_from and (drafter_io.resolve(self.init_from, self.drafter)
                           == drafter_io.resolve(os.path.join(self.output_dir, 'drafter'),
                                                 self.drafter)):
      raise ValueError(f'config.init_from is {self.init_from!r}, the drafter this run writes: '
                       'it would be overwritten; copy it elsewhere first')
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f'config.warmup_steps must be in [0, steps), got {self.warmup_steps}')


def load_target(name: str):
  """(LanguageModel, params, sha256) of the frozen target."""
  if name == TINY_RANDOM:
    config, params, _ = tiny.load(0)
    return language_model.single_device(config), params, ''
  config, params = checkpoints.load_checkpoint(name)
  return language_model.single_device(config), params, checkpoints.content_digest(name)


def generation_params(name: str, target_params):
  """The target's params as the product serves them, for writing its text: with the int8
  forms of its matrices (`loading.cached_forms`, kept in the weight cache) where they
  serve, so greedy rows take the head's argmax kernel instead of 262,144 float32 logits a
  row. A shard of 32 rows at batch 32 on a 2-core Zen 4 (7 December 2026): 81-89 ms a
  greedy step against 144-149 with the float32 params, the same tokens. The teacher pass
  keeps the float32 params: at 2,048 positions a call the forms do not serve (its
  features came out identical, 2.8 s a batch either way)."""
  if name == TINY_RANDOM:
    return target_params
  forms = loading.cached_forms(name, target_params)
  if forms is None:
    return target_params
  return q8_weights.with_q8_weights(target_params, model_shards=1, forms=forms)


def make_objective(cfg: TrainConfig, target_config):
  """The drafter's objective; an EAGLE layer reading layers the target lacks is refused."""
  if cfg.drafter == 'medusa':
    return medusa_objective.Objective(target_config, cfg.num_heads)
  if cfg.drafter == 'distilled':
    try:
      return distilled_objective.Objective(target_config, cfg.distilled.get('layers', 1),
                                           cfg.distilled.get('loss', 'tv'))
    except ValueError as e:
      raise ValueError(f'config.distilled.layers: {e}') from None
  layers = tuple(cfg.eagle.get('hidden_layers', ())) or eagle_net.default_layers(
      target_config.num_layers)
  bad = [i for i in layers if not isinstance(i, int) or not 0 <= i < target_config.num_layers]
  if bad or len(set(layers)) != len(layers):
    raise ValueError(f'config.eagle.hidden_layers is {layers}: distinct layers of the '
                     f'target, 0 .. {target_config.num_layers - 1}')
  return eagle_objective.Objective(target_config, tuple(sorted(layers)),
                                   steps=cfg.eagle.get('steps', 4),
                                   mlp_width=cfg.eagle.get('mlp_width', 1024),
                                   soft_labels=cfg.eagle.get('soft_labels', 0))


@functools.partial(jax.jit, static_argnames=('target', 'hidden_layers', 'soft_labels'))
def _teacher_step(target_params, tokens_BxL, head_NxD, *, target, hidden_layers, soft_labels):
  batch, length = tokens_BxL.shape
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  out = target.forward(target_params, tokens_BxL, positions_BxL,
                       target.init_cache(batch, max(length, 2)),
                       jnp.zeros((batch, 1), jnp.int32),  # the head at one position only
                       hidden_layers=hidden_layers)
  features = (out.hidden_BxTxD if not hidden_layers
              else jnp.concatenate(list(out.layer_hidden_LxBxTxD), axis=-1))
  if not soft_labels:
    return features, None
  # The target's own logits over the draft vocabulary's rows of its tied head.
  logits_BxLxN = gemma.softcap_logits(
      gemma.linear(out.hidden_BxTxD, head_NxD, out_dtype=jnp.float32), target.config)
  # The top J renormalized are a softmax over the top J logits: no pass over all N.
  top_BxLxJ, rows_BxLxJ = jax.lax.top_k(logits_BxLxN, soft_labels)
  return features, eagle_objective.SoftLabels(rows_BxLxJ.astype(jnp.int32),
                                              jax.nn.softmax(top_BxLxJ, axis=-1))


class Teacher(NamedTuple):
  """What the frozen target gives a drafter to learn from, for every sequence, on the host."""

  features_NxLxF: np.ndarray
  soft: eagle_objective.SoftLabels | None   # [N, L, J] each; None without soft labels

  def rows(self, idx) -> tuple[np.ndarray, eagle_objective.SoftLabels | None]:
    soft = None if self.soft is None else eagle_objective.SoftLabels(
        self.soft.rows_BxLxJ[idx], self.soft.probs_BxLxJ[idx])
    return self.features_NxLxF[idx], soft


def teacher_pass(target, target_params, tokens_NxL: np.ndarray, hidden_layers, batch: int,
                 what: str = '', head_NxD=None, soft_labels: int = 0, store: str = '',
                 target_key: str = '') -> Teacher:
  """One teacher-forced pass of the frozen target over every sequence: its features,
  [N, L, F] float32 (the final-norm output with no `hidden_layers`, else the residual
  stream after each of them, side by side), and with `soft_labels` = J its J
  likeliest next tokens at every position among `head_NxD`'s rows.

  With `store` (a directory) the arrays are memory maps there (`teacher_store`): a
  finished pass for the same inputs (`target_key` names the target's weights) is read
  back, an unfinished one goes on from its last recorded batch."""
  if soft_labels and (head_NxD is None or soft_labels > head_NxD.shape[0]):
    raise ValueError(f'{soft_labels} soft labels need a draft vocabulary of at least as many '
                     f'tokens, got {None if head_NxD is None else head_NxD.shape[0]}')
  n = len(tokens_NxL)
  step_fn = functools.partial(_teacher_step, target=target, hidden_layers=tuple(hidden_layers),
                              soft_labels=soft_labels)
  # Shapes first (no compile), so the arrays are allocated, or mapped, whole: filled in
  # place, not concatenated from pieces (for a million tokens the features at three
  # layers are 8 GB, and pieces plus their concatenation would need twice that).
  f_shape, soft_shape = jax.eval_shape(
      step_fn, target_params, jax.ShapeDtypeStruct((batch,) + tokens_NxL.shape[1:], jnp.int32),
      head_NxD)
  shapes = {'features_NxLxF': ((n,) + f_shape.shape[1:], np.float32)}
  if soft_shape is not None:
    shapes['rows_NxLxJ'] = ((n,) + soft_shape.rows_BxLxJ.shape[1:], soft_shape.rows_BxLxJ.dtype)
    shapes['probs_NxLxJ'] = ((n,) + soft_shape.probs_BxLxJ.shape[1:],
                             soft_shape.probs_BxLxJ.dtype)
  if store:
    key = {'target': target_key, 'hidden_layers': [int(i) for i in hidden_layers],
           'soft_labels': int(soft_labels), 'batch': int(batch),
           'tokens': teacher_store.digest(tokens_NxL),
           'head': teacher_store.digest(head_NxD if soft_labels else None),
           **teacher_store.environment()}
    kept = teacher_store.Store(store, key, shapes)
    arrays, first_row = kept.arrays, kept.done
    if first_row:
      logging.info('features%s: %d of %d sequences read back from %s', what, first_row, n,
                   store)
  else:
    kept = None
    arrays = {name: np.empty(shape, dtype) for name, (shape, dtype) in shapes.items()}
    first_row = 0
  start = time.monotonic()
  for step, first in enumerate(range(first_row, n, batch)):
    chunk = tokens_NxL[first:first + batch]
    keep = len(chunk)
    if keep < batch:   # one compiled shape: pad the last batch
      chunk = np.concatenate([chunk, np.zeros((batch - keep,) + chunk.shape[1:], chunk.dtype)])
    f, soft = step_fn(target_params, jnp.asarray(chunk), head_NxD)
    done = first + keep
    arrays['features_NxLxF'][first:done] = np.asarray(f)[:keep]
    if soft is not None:
      arrays['rows_NxLxJ'][first:done] = np.asarray(soft.rows_BxLxJ)[:keep]
      arrays['probs_NxLxJ'][first:done] = np.asarray(soft.probs_BxLxJ)[:keep]
    if (step + 1) % 20 == 0 or done == n:
      if kept is not None:
        kept.commit(done)
      spent = time.monotonic() - start
      logging.info('features%s: %d of %d sequences (%.0f s spent, ~%.0f s left)', what, done,
                   n, spent, spent / (done - first_row) * (n - done))
  soft = (eagle_objective.SoftLabels(arrays['rows_NxLxJ'], arrays['probs_NxLxJ'])
          if soft_labels else None)
  return Teacher(arrays['features_NxLxF'], soft)


def target_features(target, target_params, tokens_NxL: np.ndarray, hidden_layers, batch: int,
                    what: str = '') -> np.ndarray:
  """The frozen target's features for every sequence, [N, L, F] float32 on the host."""
  return teacher_pass(target, target_params, tokens_NxL, hidden_layers, batch,
                      what).features_NxLxF


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.steps, end_value=cfg.final_learning_rate)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(schedule, weight_decay=cfg.weight_decay))


def batch_indices(seed: int, step: int, batch: int, num_sequences: int) -> np.ndarray:
  """The sequences of step `step`: epochs of seeded permutations, a pure function of the step."""
  flat = np.arange(step * batch, (step + 1) * batch)
  out = np.empty(batch, np.int64)
  for epoch in np.unique(flat // num_sequences):
    order = np.random.default_rng([seed, int(epoch)]).permutation(num_sequences)
    here = flat // num_sequences == epoch
    out[here] = order[flat[here] % num_sequences]
  return out


def _tokenizer_source(target: str) -> str:
  """Where the target's tokenizer is: the embedded GGUF, or the target's own path."""
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  return str(embedded.default_gguf_path()) if target.startswith('embedded:') else target


def _draft_vocab(cfg: TrainConfig, vocab: int) -> np.ndarray | None:
  """The heads' draft vocabulary (`drafters.draft_vocab`): its first draft_vocab_size ids,
  checked against the target's vocabulary and, for a GGUF target, its tokenizer."""
  if not cfg.draft_vocab:
    return None
  tokenizer = None
  if cfg.target != TINY_RANDOM:
    from specjax.experiments import loading  # pylint: disable=g-import-not-at-top
    source = _tokenizer_source(cfg.target)
    if source.endswith('.gguf'):
      tokenizer = draft_vocab_lib.tokenizer_fingerprint(loading.load_tokenizer(source))
  try:
    chosen = draft_vocab_lib.resolve(cfg.draft_vocab, cfg.draft_vocab_size, vocab_size=vocab,
                                     tokenizer=tokenizer)
  except ValueError as e:
    raise ValueError(f'config.draft_vocab is {cfg.draft_vocab!r}: {e}') from None
  return np.asarray(chosen.ids_N, np.int32)


def _data_prompts(cfg: TrainConfig) -> tuple[list[list[int]], str]:
  """The token ids (without BOS) of the data's prompt set, and its file's sha256."""
  name = cfg.data.get('prompts', '')
  if not name:
    return [], ''
  if cfg.target == TINY_RANDOM:
    raise ValueError('config.data.prompts needs a target with a tokenizer; '
                     f'{TINY_RANDOM} has none')
  from specjax.experiments import loading  # pylint: disable=g-import-not-at-top
  from specjax.experiments import prompts as prompts_lib  # pylint: disable=g-import-not-at-top
  tokenizer = loading.load_tokenizer(_tokenizer_source(cfg.target))
  prompts, sha = prompts_lib.prompt_set(name)
  return [tokenizer.encode(p.text, add_bos=False) for p in prompts], sha


def _leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
  return {jax.tree_util.keystr(path): tuple(np.shape(x))
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def initial_weights(cfg: TrainConfig, objective, params, vocab_ids_N, signature: dict[str, Any]
                    ) -> tuple[Any, dict[str, Any] | None]:
  """The weights training starts from, and where they came from.

  Random (`objective.init`) unless `config.init_from` names a trained drafter: then
  its weights, to train further on other data (a drafter trained on one recipe,
  continued on text nearer what it will serve). The drafter must be of this kind,
  for this target, over this draft vocabulary, read the same target layers and
  have the same weight shapes; any difference is a clear error before the first
  step, since a silent partial load would train from noise under a trained name.
  """
  if not cfg.init_from:
    return params, None
  where = drafter_io.resolve(cfg.init_from, objective.kind)
  try:
    weights, ids_N, manifest = drafter_io.load_drafter(cfg.init_from, objective.kind,
                                                       target=signature)
  except CheckpointError as e:
    raise CheckpointError(f'config.init_from: {e}') from None
  if drafter_io.ids_digest(ids_N) != drafter_io.ids_digest(vocab_ids_N):
    size = 'the full vocabulary' if ids_N is None else f'{len(ids_N)} draft ids'
    raise CheckpointError(
        f'config.init_from: {where} was trained over another draft vocabulary ({size}) than '
        f'config.draft_vocab={cfg.draft_vocab!r}, draft_vocab_size={cfg.draft_vocab_size}')
  layers = manifest.get('hidden_layers')
  if objective.kind == 'eagle' and layers != list(objective.hidden_layers):
    raise CheckpointError(f'config.init_from: {where} reads target layers {layers}, this run '
                          f'{list(objective.hidden_layers)} (config.eagle.hidden_layers)')
  want, got = _leaf_shapes(params), _leaf_shapes(weights)
  if want != got:
    diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    first = diff[0]
    raise CheckpointError(
        f'config.init_from: {where} has other weights than this run\'s {objective.kind} '
        f'drafter: {first} is {got.get(first, "missing")} there and {want.get(first, "missing")} '
        f'here ({len(diff)} of {len(want)} differ; check config.{objective.kind} and num_heads)')
  by_path = {jax.tree_util.keystr(path): x
             for path, x in jax.tree_util.tree_flatten_with_path(weights)[0]}
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  start = jax.tree.unflatten(jax.tree.structure(params),
                             [jnp.asarray(by_path[jax.tree_util.keystr(path)], x.dtype)
                              for path, x in leaves])
  origin = {'path': str(where), 'command': manifest.get('command', ''),
            'steps': manifest.get('steps'),
            **{k: manifest[k] for k in ('heldout_mean_accepted_tokens',
                                        'heldout_served_accepted_tokens') if k in manifest}}
  return start, origin


@functools.partial(jax.jit, static_argnames=('objective', 'tx'), donate_argnums=(0, 1))
def _train_step(params, opt_state, frozen, features_BxLxF, tokens_BxL, lengths_B, starts_B,
                soft=None, *, objective, tx):
  def loss_fn(p):
    return objective.loss(p, frozen, features_BxLxF, tokens_BxL, lengths_B, starts_B,
                          **_soft(soft))

  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, loss, metrics['accuracy_K']


@functools.partial(jax.jit, static_argnames=('objective',))
def _eval_step(params, frozen, features_BxLxF, tokens_BxL, lengths_B, starts_B, soft=None, *,
               objective):
  loss, metrics = objective.loss(params, frozen, features_BxLxF, tokens_BxL, lengths_B, starts_B,
                                 **_soft(soft))
  run, counted = medusa_objective.accepted_run(metrics['correct_BxLxK'], lengths_B, starts_B)
  return loss, run, counted, metrics['correct_BxLxK']


def _soft(soft) -> dict:
  """The objective's soft-label argument: only EAGLE's objective takes one."""
  return {} if soft is None else {'soft': soft}


def evaluate(objective, params, frozen, features, data: distill_data.Sequences, batch: int
             ) -> dict[str, float]:
  """Held-out loss and mean accepted tokens per call of a greedy chain: 1 + the mean run
  over every position, and walked in served order (`medusa_objective.served_order`:
  what decoding commits per call, the lower and more honest of the two).
  `features` is the features array or a `Teacher` (which also holds soft labels)."""
  teacher = features if isinstance(features, Teacher) else Teacher(features, None)
  losses, runs, counted, served_tokens, served_calls = [], 0, 0, 0, 0
  for start in range(0, len(data.tokens_NxL) - batch + 1, batch):
    part = slice(start, start + batch)
    feats, soft = teacher.rows(part)
    loss, run, n, correct_BxLxK = _eval_step(
        params, frozen, feats, data.tokens_NxL[part], data.lengths_N[part],
        data.starts_N[part], soft, objective=objective)
    losses.append(float(loss))
    runs, counted = runs + int(run), counted + int(n)
    tokens, calls = medusa_objective.served_order(correct_BxLxK, data.lengths_N[part],
                                                  data.starts_N[part])
    served_tokens, served_calls = served_tokens + tokens, served_calls + calls
  return {'heldout_loss': float(np.mean(losses)) if losses else float('nan'),
          'heldout_mean_accepted_tokens': 1.0 + runs / max(counted, 1),
          'heldout_served_accepted_tokens': served_tokens / max(served_calls, 1)}


def _metrics_file(path: str, resumed_step: int) -> None:
  """Keeps only the lines of steps the restored state had reached (no duplicates)."""
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8') as f:
    kept = [line for line in f if line.strip() and json.loads(line)['step'] <= resumed_step]
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(kept)


def _plot(path: str, metrics_path: str) -> None:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.info('matplotlib is not installed: no training curve (pip install -e .[report])')
    return
  with open(metrics_path, encoding='utf-8') as f:
    lines = [json.loads(line) for line in f if line.strip()]
  train = [r for r in lines if 'loss' in r]
  held = [r for r in lines if 'heldout_mean_accepted_tokens' in r]
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  ax.plot([r['step'] for r in train], [r['loss'] for r in train], label='training loss')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  if held:
    ax2 = ax.twinx()
    ax2.plot([r['step'] for r in held], [r['heldout_mean_accepted_tokens'] for r in held],
             'o-', color='tab:orange', label='held-out mean accepted tokens (every position)')
    served = [r for r in held if 'heldout_served_accepted_tokens' in r]
    if served:
      ax2.plot([r['step'] for r in served], [r['heldout_served_accepted_tokens'] for r in served],
               's--', color='tab:green', label='held out, in served order')
    ax2.set_ylabel('mean accepted tokens (held out)')
  fig.legend(loc='upper right')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def train(cfg: TrainConfig, command: str = '') -> dict[str, Any]:
  """Runs (or resumes) the training; returns the final held-out figures."""
  os.makedirs(cfg.output_dir, exist_ok=True)
  target, target_params, target_sha = load_target(cfg.target)
  vocab = target.config.vocab_size
  signature = drafter_io.target_signature(target.config, target_sha)
  # The drafter and its starting weights before the data: a bad init_from is refused at once.
  vocab_ids = _draft_vocab(cfg, vocab)
  ids = None if vocab_ids is None else jnp.asarray(vocab_ids)
  objective = make_objective(cfg, target.config)
  frozen = objective.frozen(target_params, ids)
  tx = optimizer(cfg)
  params, init_origin = initial_weights(
      cfg, objective, objective.init(jax.random.key(cfg.seed), target_params), vocab_ids,
      signature)
  opt_state = tx.init(params)

  prompt_ids, prompts_sha = _data_prompts(cfg)
  recipe = distill_data.Recipe(target=cfg.target, target_sha256=target_sha,
                               **{**cfg.data, 'prompts_sha256': prompts_sha})
  data_dir = cfg.data_dir or os.path.join(cfg.output_dir, 'data')
  distill_data.generate(target, generation_params(cfg.target, target_params), recipe, data_dir,
                        prompt_ids)
  train_shards = range(recipe.num_shards - cfg.heldout_shards)
  data = distill_data.load(data_dir, train_shards)
  held = distill_data.load(
      data_dir, range(recipe.num_shards - cfg.heldout_shards, recipe.num_shards))
  tokens = data.tokens_NxL
  soft_labels = getattr(objective, 'soft_labels', 0)
  # Kept on disk under output_dir/teacher, so that resuming a killed run reads them back.
  target_key = f'{cfg.target}:{target_sha}'
  teacher = teacher_pass(target, target_params, tokens, objective.hidden_layers, cfg.batch_size,
                         ' (training)', frozen.get('head_NxD'), soft_labels,
                         os.path.join(cfg.output_dir, 'teacher', 'training'), target_key)
  held_teacher = teacher_pass(target, target_params, held.tokens_NxL, objective.hidden_layers,
                              cfg.batch_size, ' (held out)', frozen.get('head_NxD'), soft_labels,
                              os.path.join(cfg.output_dir, 'teacher', 'heldout'), target_key)

  manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(cfg.output_dir, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                           save_interval_steps=cfg.checkpoint_every))
  step = 0
  metrics_path = os.path.join(cfg.output_dir, 'metrics.jsonl')
  if manager.latest_step() is not None:
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.StandardRestore(
        {'heads': params, 'opt_state': opt_state}))
    params, opt_state = restored['heads'], restored['opt_state']
    logging.info('resumed from the checkpoint of step %d', step)
  _metrics_file(metrics_path, step)
  if step == 0 and init_origin is not None:   # where a continued drafter starts, on this data
    figures = evaluate(objective, params, frozen, held_teacher, held, cfg.batch_size)
    logging.info('step 0 (from %s)  held out: loss %.4f, mean accepted tokens %.3f over every '
                 'position, %.3f in served order', init_origin['path'], figures['heldout_loss'],
                 figures['heldout_mean_accepted_tokens'],
                 figures['heldout_served_accepted_tokens'])
    with open(metrics_path, 'w', encoding='utf-8') as f:
      f.write(json.dumps({'step': 0, **figures}) + '\n')

  tokens_per_step = cfg.batch_size * tokens.shape[1]
  start, first = time.monotonic(), step
  with open(metrics_path, 'a', encoding='utf-8') as metrics_file:
    while step < cfg.steps:
      idx = batch_indices(cfg.seed, step, cfg.batch_size, len(tokens))
      feats, soft = teacher.rows(idx)
      params, opt_state, loss, accuracy_K = _train_step(
          params, opt_state, frozen, feats, tokens[idx], data.lengths_N[idx],
          data.starts_N[idx], soft, objective=objective, tx=tx)
      step += 1
      record = None
      if step % cfg.log_every == 0 or step == cfg.steps:
        # The values first: steps are dispatched ahead of the device, and a clock read
        # before the loss is ready counts only the dispatching (the first window of the
        # first shipped drafter's run claimed 3,097 tokens/s where it ran about 325).
        loss_value, accuracy_values = float(loss), [round(float(a), 4) for a in accuracy_K]
        spent = time.monotonic() - start
        rate = (step - first) * tokens_per_step / max(spent, 1e-9)
        left = spent / (step - first) * (cfg.steps - step)
        record = {'step': step, 'loss': loss_value, 'accuracy_K': accuracy_values,
                  'tokens_per_s': round(rate, 1)}
        logging.info('step %d/%d  loss %.4f  head accuracy %s  %.0f tokens/s  ~%.0f s left',
                     step, cfg.steps, record['loss'], record['accuracy_K'], rate, left)
      if step % cfg.eval_every == 0 or step == cfg.steps:
        figures = evaluate(objective, params, frozen, held_teacher, held, cfg.batch_size)
        record = {**(record or {'step': step}), **figures}
        logging.info('step %d  held out: loss %.4f, mean accepted tokens %.3f over every '
                     'position, %.3f in served order', step, figures['heldout_loss'],
                     figures['heldout_mean_accepted_tokens'],
                     figures['heldout_served_accepted_tokens'])
      if record:
        metrics_file.write(json.dumps(record) + '\n')
        metrics_file.flush()
      manager.save(step, args=ocp.args.StandardSave({'heads': params, 'opt_state': opt_state}),
                   force=step == cfg.steps)
      if record and 'heldout_mean_accepted_tokens' in record:
        _plot(os.path.join(cfg.output_dir, 'curve.png'), metrics_path)
  manager.wait_until_finished()
  manager.close()

  # The held-out figures are those of the weights as exported (rounded to export_dtype).
  exported = jax.tree.map(lambda x: x.astype(cfg.export_dtype), params)
  final = evaluate(objective, jax.tree.map(lambda x: x.astype(jnp.float32), exported), frozen,
                   held_teacher, held, cfg.batch_size)
  drafter_io.save_drafter(
      os.path.join(cfg.output_dir, 'drafter'), objective.kind, exported,
      target=signature, vocab_ids_N=vocab_ids,
      provenance={'command': command or ' '.join(sys.argv), 'train_config': dataclasses.asdict(cfg),
                  'data_recipe': dataclasses.asdict(recipe), 'steps': step,
                  'hidden_layers': list(objective.hidden_layers),
                  **({'init_from': init_origin} if init_origin else {}),
                  **({'student_layers': objective.layers} if objective.kind == 'distilled'
                     else {}), **final})
  return final
