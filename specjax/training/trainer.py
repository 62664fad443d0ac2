"""Training a drafter against a frozen target: optax, Orbax, resumable, with progress.

`train(cfg)` runs the whole recipe: self-distillation data (made if missing,
`distill_data`), the heads, AdamW with linear warm-up and cosine decay and
gradient clipping, and an Orbax checkpoint every `checkpoint_every` steps of
the heads and the optimizer state (the last `keep` kept). A killed run
restarts from its last checkpoint on the same trajectory: the batch of step s
is a pure function of (seed, s), so the resumed losses equal those of an
unbroken run. The target is loaded once and never updated (its params are not
an argument of the gradient).

Progress goes to the absl log (loss, per-head accuracy, tokens/s, time left);
every logged step is a line of `metrics.jsonl`, held-out figures every
`eval_every` steps (mean accepted tokens of a greedy chain, teacher-forced on
held-out shards), and `curve.png` is redrawn at each evaluation when
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
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from specjax import checkpoints
from specjax.checkpoints import drafter_io
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.drafters import medusa
from specjax.experiments import tiny
from specjax.experiments.config import TINY_RANDOM
from specjax.models import language_model
from specjax.training import distill_data
from specjax.training import medusa_objective as objective


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run; see configs/train_medusa.py for what each key means."""

  target: str
  drafter: str
  num_heads: int
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

  @classmethod
  def from_config(cls, config) -> TrainConfig:
    values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown, missing = sorted(set(values) - names), sorted(names - set(values))
    if unknown or missing:
      raise ValueError(f'train config: unknown key(s) {unknown}, missing key(s) {missing}')
    return cls(**values)

  def __post_init__(self):
    if self.drafter != 'medusa':
      raise ValueError(f"config.drafter is {self.drafter!r}: the trainer knows 'medusa'")
    for key in ('num_heads', 'draft_vocab_size', 'batch_size', 'steps', 'checkpoint_every',
                'keep', 'eval_every', 'log_every', 'heldout_shards'):
      if getattr(self, key) < 1:
        raise ValueError(f'config.{key} must be >= 1, got {getattr(self, key)}')
    if self.heldout_shards >= self.data.get('num_shards', 0):
      raise ValueError(f'config.heldout_shards ({self.heldout_shards}) must leave training '
                       f'shards out of config.data.num_shards ({self.data.get("num_shards")})')
    if not self.learning_rate > 0 or self.final_learning_rate < 0 or self.clip_norm <= 0:
      raise ValueError('config.learning_rate and config.clip_norm must be > 0 and '
                       'config.final_learning_rate >= 0')
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f'config.warmup_steps must be in [0, steps), got {self.warmup_steps}')


def load_target(name: str):
  """(LanguageModel, params, sha256) of the frozen target."""
  if name == TINY_RANDOM:
    config, params, _ = tiny.load(0)
    return language_model.single_device(config), params, ''
  config, params = checkpoints.load_checkpoint(name)
  return language_model.single_device(config), params, checkpoints.content_digest(name)


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


def _draft_vocab(cfg: TrainConfig, vocab: int) -> np.ndarray | None:
  """The heads' draft vocabulary (`drafters.draft_vocab`): its first draft_vocab_size ids,
  checked against the target's vocabulary and, for a GGUF target, its tokenizer."""
  if not cfg.draft_vocab:
    return None
  tokenizer = None
  if cfg.target != TINY_RANDOM:
    from specjax.experiments import loading  # pylint: disable=g-import-not-at-top
    from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
    source = (str(embedded.default_gguf_path()) if cfg.target.startswith('embedded:')
              else cfg.target)
    if source.endswith('.gguf'):
      tokenizer = draft_vocab_lib.tokenizer_fingerprint(loading.load_tokenizer(source))
  try:
    chosen = draft_vocab_lib.resolve(cfg.draft_vocab, cfg.draft_vocab_size, vocab_size=vocab,
                                     tokenizer=tokenizer)
  except ValueError as e:
    raise ValueError(f'config.draft_vocab is {cfg.draft_vocab!r}: {e}') from None
  return np.asarray(chosen.ids_N, np.int32)


@functools.partial(jax.jit, static_argnames=('target', 'tx', 'softcap'), donate_argnums=(0, 1))
def _train_step(heads, opt_state, target_params, head_NxD, index_V, tokens_BxL, lengths_B, *,
                target, tx, softcap):
  hidden = objective.target_features(target, target_params, tokens_BxL)
  rows, valid = objective.labels(tokens_BxL, lengths_B, index_V, heads['w_KxDxD'].shape[0])

  def loss_fn(h):
    return objective.loss(h, head_NxD, hidden, rows, valid, softcap)

  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(heads)
  updates, opt_state = tx.update(grads, opt_state, heads)
  heads = optax.apply_updates(heads, updates)
  return heads, opt_state, loss, metrics['accuracy_K']


@functools.partial(jax.jit, static_argnames=('target', 'softcap'))
def _eval_step(heads, target_params, head_NxD, index_V, tokens_BxL, lengths_B, *, target,
               softcap):
  hidden = objective.target_features(target, target_params, tokens_BxL)
  rows, valid = objective.labels(tokens_BxL, lengths_B, index_V, heads['w_KxDxD'].shape[0])
  loss, metrics = objective.loss(heads, head_NxD, hidden, rows, valid, softcap)
  run, counted = objective.accepted_run(metrics['correct_BxLxK'], lengths_B)
  return loss, run, counted


def evaluate(heads, target, target_params, head_NxD, index_V, tokens, lengths, batch: int
             ) -> dict[str, float]:
  """Held-out loss and mean accepted tokens per call of a greedy chain (1 + mean run)."""
  losses, runs, counted = [], 0, 0
  for start in range(0, len(tokens) - batch + 1, batch):
    loss, run, n = _eval_step(heads, target_params, head_NxD, index_V,
                              tokens[start:start + batch], lengths[start:start + batch],
                              target=target, softcap=target.config.final_logit_softcap)
    losses.append(float(loss))
    runs, counted = runs + int(run), counted + int(n)
  return {'heldout_loss': float(np.mean(losses)) if losses else float('nan'),
          'heldout_mean_accepted_tokens': 1.0 + runs / max(counted, 1)}


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
             'o-', color='tab:orange', label='held-out mean accepted tokens')
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
  recipe = distill_data.Recipe(target=cfg.target, target_sha256=target_sha, **cfg.data)
  data_dir = os.path.join(cfg.output_dir, 'data')
  distill_data.generate(target, target_params, recipe, data_dir)
  train_shards = range(recipe.num_shards - cfg.heldout_shards)
  tokens, lengths = distill_data.load(data_dir, train_shards)
  held_tokens, held_lengths = distill_data.load(
      data_dir, range(recipe.num_shards - cfg.heldout_shards, recipe.num_shards))

  vocab_ids = _draft_vocab(cfg, vocab)
  ids = None if vocab_ids is None else jnp.asarray(vocab_ids)
  head_NxD = medusa.head_matrix(target_params, ids)
  index_V = objective.draft_index(ids, vocab)
  tx = optimizer(cfg)
  heads = medusa.init_heads(cfg.num_heads, target.config.embed_dim)
  opt_state = tx.init(heads)

  manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(cfg.output_dir, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                           save_interval_steps=cfg.checkpoint_every))
  step = 0
  metrics_path = os.path.join(cfg.output_dir, 'metrics.jsonl')
  if manager.latest_step() is not None:
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.StandardRestore(
        {'heads': heads, 'opt_state': opt_state}))
    heads, opt_state = restored['heads'], restored['opt_state']
    logging.info('resumed from the checkpoint of step %d', step)
  _metrics_file(metrics_path, step)

  softcap = target.config.final_logit_softcap
  tokens_per_step = cfg.batch_size * tokens.shape[1]
  start, first = time.monotonic(), step
  with open(metrics_path, 'a', encoding='utf-8') as metrics_file:
    while step < cfg.steps:
      idx = batch_indices(cfg.seed, step, cfg.batch_size, len(tokens))
      heads, opt_state, loss, accuracy_K = _train_step(
          heads, opt_state, target_params, head_NxD, index_V, tokens[idx], lengths[idx],
          target=target, tx=tx, softcap=softcap)
      step += 1
      record = None
      if step % cfg.log_every == 0 or step == cfg.steps:
        spent = time.monotonic() - start
        rate = (step - first) * tokens_per_step / max(spent, 1e-9)
        left = spent / (step - first) * (cfg.steps - step)
        record = {'step': step, 'loss': float(loss),
                  'accuracy_K': [round(float(a), 4) for a in accuracy_K],
                  'tokens_per_s': round(rate, 1)}
        logging.info('step %d/%d  loss %.4f  head accuracy %s  %.0f tokens/s  ~%.0f s left',
                     step, cfg.steps, record['loss'], record['accuracy_K'], rate, left)
      if step % cfg.eval_every == 0 or step == cfg.steps:
        figures = evaluate(heads, target, target_params, head_NxD, index_V, held_tokens,
                           held_lengths, cfg.batch_size)
        record = {**(record or {'step': step}), **figures}
        logging.info('step %d  held out: loss %.4f, mean accepted tokens %.3f', step,
                     figures['heldout_loss'], figures['heldout_mean_accepted_tokens'])
      if record:
        metrics_file.write(json.dumps(record) + '\n')
        metrics_file.flush()
      manager.save(step, args=ocp.args.StandardSave({'heads': heads, 'opt_state': opt_state}),
                   force=step == cfg.steps)
      if record and 'heldout_mean_accepted_tokens' in record:
        _plot(os.path.join(cfg.output_dir, 'curve.png'), metrics_path)
  manager.wait_until_finished()
  manager.close()

  final = evaluate(heads, target, target_params, head_NxD, index_V, held_tokens, held_lengths,
                   cfg.batch_size)
  drafter_io.save_drafter(
      os.path.join(cfg.output_dir, 'drafter'), 'medusa', heads,
      target=drafter_io.target_signature(target.config, target_sha), vocab_ids_N=vocab_ids,
      provenance={'command': command or ' '.join(sys.argv), 'train_config': dataclasses.asdict(cfg),
                  'data_recipe': dataclasses.asdict(recipe), 'steps': step, **final})
  return final
