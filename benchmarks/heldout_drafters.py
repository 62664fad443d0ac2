"""Trained drafters side by side on the same held-out rows, as the trainer measures them.

Each drafter checkpoint (a directory, or 'embedded' for the shipped one of its kind)
is scored on the same shards of a self-distillation data directory: a greedy chain
of the checkpoint's trained depth, teacher-forced (the target's features of the true
prefix), mean accepted tokens per call = 1 + the mean run of exact matches, and the
held-out loss. This is the trainer's own held-out figure (`trainer.evaluate`), but
on rows chosen here, so that drafters trained on different data, each with its own
held-out shards, are compared on one set. Rows a drafter was trained on make its
figure meaningless: give shards that none of them saw.

  .venv/bin/python benchmarks/heldout_drafters.py --kind=eagle \
      --drafters=embedded,results/train_eagle-1m/drafter \
      --data_dir=results/distill-gemma3-270m-prompted-1m --shards=252-255

"In served order" reads the same chains as decoding meets them
(`medusa_objective.served_order`): a chain starts after the prompt, commits its
run of matches plus one token from the target, and the next chain starts after
those, so a streak the drafter gets right counts once, not at each of its
positions, and this sits below the mean over every position. With
`--draft_vocab_size=N` the chains score only the first N draft ids (what
`eagle.draft_vocab_size` serves), and with `--window=W` the layer attends to the
last W positions only (`eagle.window`).

  .venv/bin/python benchmarks/heldout_drafters.py --kind=eagle --drafters=embedded \
      --data_dir=results/distill-gemma3-270m-instructions-1m --shards=124-127 \
      --draft_vocab_size=4096 --window=128

Deterministic: no timing, so the machine's load does not matter.
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from specjax.checkpoints import drafter_io
from specjax.training import distill_data
from specjax.training import trainer

flags.DEFINE_string('kind', 'eagle', 'drafter kind: eagle, medusa or distilled')
flags.DEFINE_list('drafters', ['embedded'], "checkpoint directories ('embedded': the shipped one)")
flags.DEFINE_string('data_dir', None, 'a self-distillation data directory (python -m specjax.train)')
flags.DEFINE_string('shards', None, "held-out shards: 'a-b' (inclusive) or 'a,b,c'")
flags.DEFINE_string('target', 'embedded:gemma3-270m', 'the frozen target')
flags.DEFINE_integer('batch', 8, 'rows per teacher and evaluation call')
flags.DEFINE_integer('draft_vocab_size', 0, 'score only the first N draft ids (0: all of them)')
flags.DEFINE_integer('window', 0, 'EAGLE: attend to the last W positions only (0: every one)')
FLAGS = flags.FLAGS


def first_ids(frozen, keep: int):
  """The frozen tables cut to the first `keep` draft ids (the head's first rows); a label
  outside them is a miss, as it is for a drafter served with draft_vocab_size=keep."""
  index_V = frozen['index_V']
  return {**frozen, 'index_V': jnp.where(index_V < keep, index_V, -1),
          'head_NxD': frozen['head_NxD'][:keep]}


def parse_shards(text: str) -> list[int]:
  if '-' in text:
    first, last = (int(x) for x in text.split('-'))
    return list(range(first, last + 1))
  return [int(x) for x in text.split(',')]


def main(argv):
  del argv
  with open(os.path.join(FLAGS.data_dir, 'recipe.json'), encoding='utf-8') as f:
    recipe = json.load(f)
  target, target_params, target_sha = trainer.load_target(FLAGS.target)
  if recipe.get('target_sha256') and recipe['target_sha256'] != target_sha:
    raise SystemExit(f'{FLAGS.data_dir} was made by another target than {FLAGS.target}')
  shards = parse_shards(FLAGS.shards)
  held = distill_data.load(FLAGS.data_dir, shards)
  signature = drafter_io.target_signature(target.config, target_sha)
  print(f'held-out rows: {len(held.tokens_NxL)} of {FLAGS.data_dir}, shards {FLAGS.shards} '
        f'(scored tokens: {int((held.lengths_N - held.starts_N).sum())})')
  served = []
  if FLAGS.draft_vocab_size:
    served.append(f'the first {FLAGS.draft_vocab_size} draft ids')
  if FLAGS.window:
    served.append(f'a window of {FLAGS.window}')
  print('chains scored ' + (' and '.join(served) if served else 'as trained'))
  print('| drafter | trained steps | its data | held-out mean accepted tokens | in served order | '
        'held-out loss |')
  print('|---|---|---|---|---|---|')
  for directory in FLAGS.drafters:
    weights, vocab_ids, manifest = drafter_io.load_drafter(directory, FLAGS.kind,
                                                           target=signature)
    cfg = trainer.TrainConfig(**manifest['train_config'])
    trained_on = manifest['data_recipe']
    same_rows = all(recipe.get(k) == v for k, v in trained_on.items() if k != 'num_shards')
    if same_rows and any(s < trained_on['num_shards'] - cfg.heldout_shards for s in shards):
      print(f'| {directory} | note: shards {FLAGS.shards} overlap its training shards |')
    objective = trainer.make_objective(cfg, target.config)
    if FLAGS.window:
      if FLAGS.kind != 'eagle':
        raise SystemExit('--window is an EAGLE setting')
      objective = dataclasses.replace(objective, window=FLAGS.window)
    ids = None if vocab_ids is None else jnp.asarray(vocab_ids)
    frozen = objective.frozen(target_params, ids)
    teacher = trainer.teacher_pass(target, target_params, held.tokens_NxL,
                                   objective.hidden_layers, FLAGS.batch, ' (held out)',
                                   frozen.get('head_NxD'), getattr(objective, 'soft_labels', 0))
    if FLAGS.draft_vocab_size:
      frozen = first_ids(frozen, FLAGS.draft_vocab_size)
    params = jax.tree.map(jnp.asarray, weights)
    figures = trainer.evaluate(objective, params, frozen, teacher, held, FLAGS.batch)
    data = (f"{trained_on['num_shards'] - cfg.heldout_shards} x "
            f"{trained_on['sequences_per_shard']} x {trained_on['seq_len']}")
    print(f"| {directory} | {manifest.get('steps')} | {data} | "
          f"{figures['heldout_mean_accepted_tokens']:.3f} | "
          f"{figures['heldout_served_accepted_tokens']:.3f} | "
          f"{figures['heldout_loss']:.4f} |")


if __name__ == '__main__':
  flags.mark_flags_as_required(['data_dir', 'shards'])
  app.run(main)
