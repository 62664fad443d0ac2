"""Training drafters: the loss falls, a killed run resumes on the same trajectory,
killed data generation leaves no gap or duplicate, trained heads beat untrained ones,
and checkpoints for another target are refused.

The target is tests/toy_models.tiny_gemma (varied greedy text), patched in for the
checkpoint name; the recipe is configs/train_medusa.py's, shrunk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints import CheckpointError
from specjax.checkpoints import drafter_io
from specjax.drafters import draft_vocab
from specjax.drafters import medusa
from specjax.experiments import prompts as prompts_lib
from specjax.experiments import loading
from specjax.experiments.config import ConfigError, TINY_RANDOM
from specjax.models import gemma
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.training import distill_data
from specjax.training import medusa_objective as objective
from specjax.training import trainer

import config_files
import toy_models
from specjax.models.config import tiny_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET, TARGET_PARAMS = toy_models.tiny_gemma()
GENERATION_PARAMS = trainer.generation_params   # the fixture below patches it for toy targets


@pytest.fixture(autouse=True)
def tiny_target(monkeypatch):
  monkeypatch.setattr(trainer, 'load_target', lambda name: (TARGET, TARGET_PARAMS, 'sha-tiny'))
  # A toy target has no checkpoint, so no int8 forms: it writes its data as it is.
  monkeypatch.setattr(trainer, 'generation_params', lambda name, params: params)


def config(tmp_path, **overrides) -> trainer.TrainConfig:
  values = dict(target='tiny', drafter='medusa', num_heads=3, draft_vocab='', draft_vocab_size=1,
                data=dict(num_shards=3, sequences_per_shard=8, seq_len=24, start_tokens=3,
                          sampled_fraction=0.34, seed=0, bos_id=2, eos_ids=()),
                heldout_shards=1, batch_size=4, steps=8, learning_rate=3e-3, warmup_steps=2,
                final_learning_rate=3e-4, weight_decay=0.0, clip_norm=1.0, checkpoint_every=4,
                keep=2, eval_every=4, log_every=1, seed=0, output_dir=str(tmp_path / 'run'))
  values.update(overrides)
  return trainer.TrainConfig(**values)


def recipe(**overrides) -> distill_data.Recipe:
  values = dict(target='tiny', target_sha256='sha-tiny', num_shards=3, sequences_per_shard=4,
                seq_len=16, start_tokens=3, sampled_fraction=0.5, seed=1, bos_id=2, eos_ids=())
  values.update(overrides)
  return distill_data.Recipe(**values)


# ------------------------------------------------------------------ the loss

@pytest.mark.parametrize('drafter,loss', [('medusa', ''), ('eagle', ''), ('distilled', 'tv'),
                                          ('distilled', 'kl')])
def test_training_steps_lower_the_loss_on_a_fixed_batch(drafter, loss):
  tokens, lengths, _ = distill_data.make_shard(TARGET, TARGET_PARAMS, recipe(), 0)
  cfg = config(pathlib.Path('/unused'), drafter=drafter, steps=40, warmup_steps=1,
               eagle=dict(steps=3, mlp_width=32),
               distilled=dict(layers=1, loss=loss) if loss else {})
  goal = trainer.make_objective(cfg, TARGET.config)
  tx = trainer.optimizer(cfg)
  params = goal.init(jax.random.key(0), TARGET_PARAMS)
  opt_state = tx.init(params)
  frozen = goal.frozen(TARGET_PARAMS, None)
  features = trainer.target_features(TARGET, TARGET_PARAMS, tokens, goal.hidden_layers, 4)
  losses = []
  for _ in range(30):
    params, opt_state, loss, _ = trainer._train_step(  # pylint: disable=protected-access
        params, opt_state, frozen, jnp.asarray(features), jnp.asarray(tokens),
        jnp.asarray(lengths), None, objective=goal, tx=tx)
    losses.append(float(loss))
  assert losses[-1] < 0.7 * losses[0], losses


def test_soft_labels_are_the_targets_likeliest_draft_tokens_at_each_position():
  """The teacher pass's soft labels are the top J of the target's own next-token
  distribution over the draft vocabulary's rows, renormalized: computed here from a
  full forward's logits over the whole vocabulary."""
  tokens, _, _ = distill_data.make_shard(TARGET, TARGET_PARAMS, recipe(), 0)
  ids_N = jnp.asarray(np.random.default_rng(0).permutation(TARGET.config.vocab_size)[:40])
  head_NxD = medusa.head_matrix(TARGET_PARAMS, ids_N)
  teacher = trainer.teacher_pass(TARGET, TARGET_PARAMS, tokens, (1,), 3, head_NxD=head_NxD,
                                 soft_labels=5)
  np.testing.assert_array_equal(
      teacher.features_NxLxF, trainer.target_features(TARGET, TARGET_PARAMS, tokens, (1,), 3))
  # Batches of 3 over 4 sequences (the last one padded) fill the rows one call over all gives,
  # to float32 rounding: XLA blocks a product by its batch, and on a Zen 4 EPYC a feature of
  # 4.69 moved 1.05e-5 between batch 3 and 4 (a misplaced row moves features by their size).
  np.testing.assert_allclose(
      teacher.features_NxLxF,
      trainer.target_features(TARGET, TARGET_PARAMS, tokens, (1,), len(tokens)),
      rtol=1e-5, atol=1e-5)
  batch, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  logits_BxLxV = TARGET.forward(TARGET_PARAMS, jnp.asarray(tokens), positions,
                                TARGET.init_cache(batch, length)).logits_BxRxV
  probs_BxLxN = jax.nn.softmax(logits_BxLxV[..., ids_N], axis=-1)
  top_BxLxJ = np.argsort(-np.asarray(probs_BxLxN), axis=-1, kind='stable')[..., :5]
  np.testing.assert_array_equal(teacher.soft.rows_BxLxJ, top_BxLxJ)
  expected = np.take_along_axis(np.asarray(probs_BxLxN), top_BxLxJ, axis=-1)
  np.testing.assert_allclose(teacher.soft.probs_BxLxJ,
                             expected / expected.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
  assert teacher.soft.probs_BxLxJ.shape == (batch, length, 5)


def test_an_eagle_layer_trained_on_soft_labels_lowers_its_loss_and_needs_them():
  tokens, lengths, _ = distill_data.make_shard(TARGET, TARGET_PARAMS, recipe(), 0)
  cfg = config(pathlib.Path('/unused'), drafter='eagle', steps=40, warmup_steps=1,
               eagle=dict(steps=3, mlp_width=32, soft_labels=4))
  goal = trainer.make_objective(cfg, TARGET.config)
  tx = trainer.optimizer(cfg)
  params = goal.init(jax.random.key(0), TARGET_PARAMS)
  opt_state = tx.init(params)
  frozen = goal.frozen(TARGET_PARAMS, None)
  teacher = trainer.teacher_pass(TARGET, TARGET_PARAMS, tokens, goal.hidden_layers, 4,
                                 head_NxD=frozen['head_NxD'], soft_labels=4)
  features, soft = teacher.rows(slice(None))
  losses = []
  for _ in range(30):
    params, opt_state, loss, _ = trainer._train_step(  # pylint: disable=protected-access
        params, opt_state, frozen, jnp.asarray(features), jnp.asarray(tokens),
        jnp.asarray(lengths), None, soft, objective=goal, tx=tx)
    losses.append(float(loss))
  assert losses[-1] < 0.7 * losses[0], losses
  with pytest.raises(ValueError, match='scores on 4 soft labels, and was given none'):
    goal.loss(params, frozen, jnp.asarray(features), jnp.asarray(tokens), jnp.asarray(lengths))


def test_labels_are_the_tokens_two_and_more_ahead_inside_the_sequence_and_vocabulary():
  tokens = jnp.asarray([[5, 6, 7, 8, 9, 0]])
  index_V = objective.draft_index(jnp.asarray([7, 8, 9, 6]), 16)   # 5 is not in it
  rows, valid = objective.labels(tokens, jnp.asarray([5]), index_V, num_heads=2)
  # Position 0: head 0 -> token 7 (row 0), head 1 -> token 8 (row 1).
  assert rows[0, 0].tolist() == [0, 1] and valid[0, 0].tolist() == [True, True]
  # Position 2: head 0 -> token 9 (inside), head 1 -> position 5, past the length 5.
  assert valid[0, 2].tolist() == [True, False]
  assert valid[0, 3].tolist() == [False, False]
  # A row whose tokens 0..2 are a prompt's: tokens 2 and before are no label.
  _, valid = objective.labels(tokens, jnp.asarray([6]), index_V, num_heads=2,
                              starts_B=jnp.asarray([3]))
  assert valid[0, :, 0].tolist() == [False, True, True, False, False, False]  # 0: not drafted
  correct = jnp.ones((1, 6, 2), bool)
  assert objective.accepted_run(correct, jnp.asarray([6]))[1] == 3   # positions 0, 1, 2
  assert objective.accepted_run(correct, jnp.asarray([6]), jnp.asarray([3]))[1] == 2


def test_served_order_walks_the_chains_as_decoding_does():
  """A streak the drafter gets right is one call in decoding, not one per position."""
  correct = np.zeros((1, 10, 2), bool)
  correct[0, 0:3] = True               # runs of 2 at positions 0, 1 and 2
  correct[0, 3] = [True, False]        # a run of 1
  correct[0, 5] = [False, True]        # a miss first: a run of 0
  # Decoding: t=0 commits 3 (t -> 3), t=3 commits 2 (-> 5), t=5 and t=6 commit 1 each;
  # a chain at t=7 would pass the row's end (7 + 2 + 1 = 10).
  assert objective.served_order(correct, np.array([10]), None) == (7, 4)
  # Every position 0..6 counted once: runs 2, 2, 2, 1, 0, 0, 0.
  run, counted = objective.accepted_run(jnp.asarray(correct), jnp.asarray([10]))
  assert (int(run), int(counted)) == (7, 7)
  # After a 4-token prompt the first chain reads position 3: 2 + 1 + 1 tokens in 3 calls.
  assert objective.served_order(correct, np.array([10]), np.array([4])) == (4, 3)


# ------------------------------------------------------ the teacher pass on disk

def _counting_teacher_step(monkeypatch, dies_at: int = 0) -> list:
  real, calls = trainer._teacher_step, []  # pylint: disable=protected-access

  def step(*args, **kwargs):
    if isinstance(args[1], jax.core.Tracer):   # shapes only (jax.eval_shape): no pass
      return real(*args, **kwargs)
    calls.append(1)
    if len(calls) == dies_at:
      raise KeyboardInterrupt
    return real(*args, **kwargs)

  monkeypatch.setattr(trainer, '_teacher_step', step)
  return calls


def test_a_teacher_pass_on_disk_resumes_and_is_read_back_bit_for_bit(tmp_path, monkeypatch):
  """Killed after its record at batch 20, the pass goes on from row 40 (2 more calls,
  not 22); finished, it is read back with no call; its arrays, features and soft
  labels, are the bits of a pass held in memory."""
  tokens = np.random.default_rng(3).integers(0, TARGET.config.vocab_size, (43, 12), np.int32)
  head_NxD = medusa.head_matrix(TARGET_PARAMS, jnp.arange(30))
  args = (TARGET, TARGET_PARAMS, tokens, (0, 1), 2)
  soft = dict(head_NxD=head_NxD, soft_labels=4, target_key='tiny:sha')
  in_memory = trainer.teacher_pass(*args, head_NxD=head_NxD, soft_labels=4)
  store = str(tmp_path / 'teacher')

  calls = _counting_teacher_step(monkeypatch, dies_at=21)
  with pytest.raises(KeyboardInterrupt):
    trainer.teacher_pass(*args, store=store, **soft)
  assert json.load(open(os.path.join(store, 'progress.json')))['done'] == 40
  calls = _counting_teacher_step(monkeypatch)
  resumed = trainer.teacher_pass(*args, store=store, **soft)
  assert len(calls) == 2   # rows 40-41 and 42 (padded)
  calls = _counting_teacher_step(monkeypatch)
  read_back = trainer.teacher_pass(*args, store=store, **soft)
  assert not calls
  for got in (resumed, read_back):
    assert isinstance(got.features_NxLxF, np.memmap)
    np.testing.assert_array_equal(got.features_NxLxF, in_memory.features_NxLxF)
    np.testing.assert_array_equal(got.soft.rows_BxLxJ, in_memory.soft.rows_BxLxJ)
    np.testing.assert_array_equal(got.soft.probs_BxLxJ, in_memory.soft.probs_BxLxJ)


@pytest.mark.parametrize('change', ['tokens', 'layers', 'target', 'truncated', 'progress'])
def test_a_teacher_store_for_other_inputs_or_damaged_is_computed_again(tmp_path, monkeypatch,
                                                                       change):
  tokens = np.random.default_rng(4).integers(0, TARGET.config.vocab_size, (6, 10), np.int32)
  store = str(tmp_path / 'teacher')
  trainer.teacher_pass(TARGET, TARGET_PARAMS, tokens, (1,), 2, store=store, target_key='a')
  layers, key = (1,), 'a'
  if change == 'tokens':
    tokens = tokens[::-1].copy()
  elif change == 'layers':
    layers = (0, 1)
  elif change == 'target':
    key = 'b'
  elif change == 'truncated':
    path = os.path.join(store, 'features_NxLxF.npy')
    os.truncate(path, os.path.getsize(path) // 2)
  else:
    with open(os.path.join(store, 'progress.json'), 'w') as f:
      f.write('{"key": ')
  calls = _counting_teacher_step(monkeypatch)
  got = trainer.teacher_pass(TARGET, TARGET_PARAMS, tokens, layers, 2, store=store,
                             target_key=key)
  assert len(calls) == 3   # every batch again
  np.testing.assert_array_equal(
      got.features_NxLxF, trainer.target_features(TARGET, TARGET_PARAMS, tokens, layers, 2))


# ----------------------------------------------------------- resume, exactly

@pytest.mark.parametrize('drafter', ['medusa', 'eagle', 'distilled'])
def test_a_killed_run_resumes_on_the_same_trajectory(tmp_path, monkeypatch, drafter):
  small = dict(drafter=drafter, eagle=dict(steps=2, mlp_width=32))
  unbroken = config(tmp_path / 'a', **small)
  trainer.train(unbroken)
  reference = [json.loads(line) for line in open(os.path.join(unbroken.output_dir,
                                                              'metrics.jsonl'))]

  broken = config(tmp_path / 'b', **small)
  real_step, calls = trainer._train_step, []  # pylint: disable=protected-access

  def dies_at_step_6(*args, **kwargs):
    calls.append(1)
    if len(calls) == 6:   # after the checkpoint of step 4 was written
      raise KeyboardInterrupt
    return real_step(*args, **kwargs)

  monkeypatch.setattr(trainer, '_train_step', dies_at_step_6)
  with pytest.raises(KeyboardInterrupt):
    trainer.train(broken)
  monkeypatch.setattr(trainer, '_train_step', real_step)
  teacher_calls = _counting_teacher_step(monkeypatch)
  trainer.train(broken)   # the same command again
  assert not teacher_calls   # the target's features are read back from output_dir/teacher
  resumed = [json.loads(line) for line in open(os.path.join(broken.output_dir, 'metrics.jsonl'))]
  assert [r['step'] for r in resumed] == list(range(1, 9))   # no step lost or written twice
  for a, b in zip(reference, resumed):
    assert a['loss'] == b['loss'], (a, b)   # bit-identical losses
  signature = drafter_io.target_signature(TARGET.config, 'sha-tiny')
  heads_a, _, _ = drafter_io.load_drafter(os.path.join(unbroken.output_dir, 'drafter'), drafter,
                                          target=signature)
  heads_b, _, manifest = drafter_io.load_drafter(os.path.join(broken.output_dir, 'drafter'),
                                                 drafter, target=signature)
  for x, y in zip(jax.tree.leaves(heads_a), jax.tree.leaves(heads_b)):
    np.testing.assert_array_equal(x, y)
  assert manifest['steps'] == 8 and manifest['data_recipe']['num_shards'] == 3
  assert os.path.getsize(os.path.join(broken.output_dir, 'curve.png')) > 0


def test_the_progress_counts_the_steps_the_device_has_not_finished(tmp_path, monkeypatch):
  """Steps are dispatched ahead of the device: the throughput and time left are read
  once the loss is ready, or a window counts only the dispatching (the first window
  of a real run claimed ten times its speed). Here a step takes 0.5 s of a clock that
  only the device's work moves, and each record must say so."""
  clock, pending, step_seconds = [0.0], [], 0.5

  class DeviceLoss:
    """A loss the device is still computing: reading it waits for every step queued."""

    def __init__(self, value):
      self.value = value

    def __float__(self):
      clock[0] += step_seconds * len(pending)
      pending.clear()
      return float(self.value)

  real_step = trainer._train_step  # pylint: disable=protected-access

  def dispatched(*args, **kwargs):
    params, opt_state, loss, accuracy_K = real_step(*args, **kwargs)
    pending.append(1)
    return params, opt_state, DeviceLoss(loss), accuracy_K

  monkeypatch.setattr(trainer, '_train_step', dispatched)
  monkeypatch.setattr(trainer, 'time', type('DeviceClock', (), {
      'monotonic': staticmethod(lambda: clock[0])}))
  cfg = config(tmp_path, log_every=4)
  trainer.train(cfg)
  with open(os.path.join(cfg.output_dir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [r for r in map(json.loads, f) if 'tokens_per_s' in r]
  assert [r['step'] for r in records] == [4, 8]
  tokens_per_step = cfg.batch_size * cfg.data['seq_len']
  for record in records:
    assert record['tokens_per_s'] == pytest.approx(tokens_per_step / step_seconds, rel=1e-3)


def test_a_run_from_a_trained_drafter_starts_where_that_drafter_ended(tmp_path):
  """init_from continues a trained drafter on other data: its step 0 is the first run's
  exported weights (the same held-out figures on the same rows) and its first steps
  are far below a run from random weights; the manifest says where it started."""
  small = dict(drafter='eagle', eagle=dict(steps=2, mlp_width=32), export_dtype='float32')
  first = config(tmp_path / 'a', **small)
  ended = trainer.train(first)
  shared = dict(small, data_dir=os.path.join(first.output_dir, 'data'), steps=4)
  continued = config(tmp_path / 'b', init_from=os.path.join(first.output_dir, 'drafter'),
                     **shared)
  trainer.train(continued)
  fresh = config(tmp_path / 'c', **shared)
  trainer.train(fresh)
  lines = [json.loads(line) for line in open(os.path.join(continued.output_dir,
                                                            'metrics.jsonl'))]
  assert lines[0] == {'step': 0, **ended}   # bit for bit: the same weights on the same rows
  assert [r['step'] for r in lines] == [0, 1, 2, 3, 4]
  scratch = [json.loads(line) for line in open(os.path.join(fresh.output_dir, 'metrics.jsonl'))]
  assert 'heldout_loss' not in scratch[0] and scratch[0]['step'] == 1
  assert lines[1]['loss'] < 0.8 * scratch[0]['loss'], (lines[1], scratch[0])
  _, _, manifest = drafter_io.load_drafter(
      os.path.join(continued.output_dir, 'drafter'), 'eagle',
      target=drafter_io.target_signature(TARGET.config, 'sha-tiny'))
  assert manifest['init_from']['path'] == os.path.join(first.output_dir, 'drafter')
  assert manifest['init_from']['heldout_mean_accepted_tokens'] == (
      ended['heldout_mean_accepted_tokens'])


@pytest.fixture(scope='module')
def trained_eagle(tmp_path_factory):
  """A small EAGLE layer trained on the tiny target (reading layers 0, 1 and 3)."""
  cfg = config(tmp_path_factory.mktemp('trained'), drafter='eagle', steps=4,
               eagle=dict(steps=2, mlp_width=32, hidden_layers=(0, 1, 3)))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(trainer, 'load_target', lambda name: (TARGET, TARGET_PARAMS, 'sha-tiny'))
    patch.setattr(trainer, 'generation_params', lambda name, params: params)
    trainer.train(cfg)
  return cfg


@pytest.mark.parametrize('change,message', [
    (dict(eagle=dict(steps=2, mlp_width=48, hidden_layers=(0, 1, 3))),
     r"has other weights than this run's eagle drafter: .* is \(\d+, 32\) there and "
     r'\(\d+, 48\) here'),
    (dict(eagle=dict(steps=2, mlp_width=32, hidden_layers=(0, 2, 3))),
     r'reads target layers \[0, 1, 3\], this run \[0, 2, 3\]'),
    (dict(draft_vocab='ranked', draft_vocab_size=40), 'another draft vocabulary'),
    (dict(drafter='medusa'), "holds a 'eagle' drafter, not 'medusa'"),
    (dict(init_from='missing'), 'config.init_from: .*missing: not a specjax drafter checkpoint'),
    (dict(init_from='self'), 'the drafter this run writes: it would be overwritten'),
])
def test_a_drafter_to_start_from_that_does_not_fit_is_refused_before_any_work(
    tmp_path, trained_eagle, change, message):
  ranked = str(tmp_path / 'vocab.npz')
  draft_vocab.save(draft_vocab.DraftVocab(np.arange(TARGET.config.vocab_size, dtype=np.int32),
                                          TARGET.config.vocab_size, 'tok'), ranked)
  drafter_dir = os.path.join(trained_eagle.output_dir, 'drafter')
  paths = {'missing': str(tmp_path / 'missing'), 'ranked': ranked, 'self': drafter_dir}
  change = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in change.items()}
  values = dict(drafter='eagle', eagle=dict(steps=2, mlp_width=32, hidden_layers=(0, 1, 3)),
                init_from=drafter_dir, output_dir=str(tmp_path / 'b'))
  if change.get('init_from') == drafter_dir:
    values['output_dir'] = trained_eagle.output_dir
  values.update(change)
  before = {name: os.path.getmtime(os.path.join(drafter_dir, name))
            for name in os.listdir(drafter_dir)}
  with pytest.raises((CheckpointError, ValueError), match=message):
    trainer.train(config(tmp_path, **values))
  assert not os.path.exists(tmp_path / 'b' / 'data')   # refused before the data was made
  assert before == {name: os.path.getmtime(os.path.join(drafter_dir, name))
                    for name in os.listdir(drafter_dir)}   # nothing of it was rewritten


def test_batches_are_a_pure_function_of_the_step():
  first = [trainer.batch_indices(0, s, 3, 10) for s in range(7)]
  assert all(np.array_equal(a, trainer.batch_indices(0, s, 3, 10)) for s, a in enumerate(first))
  flat = np.concatenate(first)   # 21 draws: two whole epochs, each a permutation
  assert sorted(flat[:10].tolist()) == sorted(flat[10:20].tolist()) == list(range(10))
  assert flat[:10].tolist() != flat[10:20].tolist()   # reshuffled each epoch


# ----------------------------------------------------------------- the data

def test_killed_data_generation_resumes_without_gaps_or_duplicates(tmp_path):
  r = recipe()
  directory = str(tmp_path / 'data')
  assert distill_data.generate(TARGET, TARGET_PARAMS, r, directory) == [0, 1, 2]
  whole_tokens, whole_lengths, _ = distill_data.load(directory)
  # Killed while writing shard 1: its provenance never landed, a temporary file did.
  _, meta = distill_data.shard_paths(directory, 1)
  os.remove(meta)
  with open(os.path.join(directory, 'shard_00002.npz.tmp-999'), 'wb') as f:
    f.write(b'partial')
  assert distill_data.generate(TARGET, TARGET_PARAMS, r, directory) == [1]
  tokens, lengths, _ = distill_data.load(directory)
  np.testing.assert_array_equal(tokens, whole_tokens)
  np.testing.assert_array_equal(lengths, whole_lengths)
  assert len(tokens) == 3 * 4
  assert [r.is_sampled(s) for s in range(3)].count(True) in (1, 2)   # greedy and sampled
  with pytest.raises(ValueError, match='another recipe.*seed'):
    distill_data.generate(TARGET, TARGET_PARAMS, recipe(seed=2), directory)


def test_the_target_writes_its_data_as_served_with_its_int8_forms(tmp_path, monkeypatch):
  """A checkpoint whose matrices are int8 blocks (the 270M's formats) writes its data from
  its int8 forms (`trainer.generation_params`: greedy rows through the head's argmax
  kernel where it serves): the same tokens as from its float32 params, greedy and sampled
  shards alike, and each shard says which params wrote it."""
  cfg = tiny_config(vocab_size=96)
  params = toy_models.gguf_like_params(
      jax.tree.map(lambda x: x * 1.5, gemma.init_params(cfg, jax.random.key(4))))
  model = LanguageModel(cfg)
  # The forms made in memory, not kept in the weight cache under a made-up name.
  monkeypatch.setattr(loading, 'cached_forms', lambda name, p: q8_weights.all_forms(p))
  served = GENERATION_PARAMS('a-gguf-checkpoint', params)
  assert q8_weights.HEAD_FORM in served
  r = recipe(seq_len=20, sequences_per_shard=5)
  assert distill_data.generate(model, served, r, str(tmp_path / 'q8')) == [0, 1, 2]
  distill_data.generate(model, params, r, str(tmp_path / 'f32'))
  for name, field in zip(('tokens_NxL', 'lengths_N', 'starts_N'), range(3)):
    np.testing.assert_array_equal(distill_data.load(str(tmp_path / 'q8'))[field],
                                  distill_data.load(str(tmp_path / 'f32'))[field], err_msg=name)
  for directory, forms in (('q8', True), ('f32', False)):
    with open(distill_data.shard_paths(str(tmp_path / directory), 0)[1], encoding='utf-8') as f:
      assert json.load(f)['int8_forms'] is forms
  assert GENERATION_PARAMS(TINY_RANDOM, params) is params


def test_prompted_rows_start_from_the_prompts_and_mark_where_the_target_began(tmp_path):
  prompts = [[40, 41, 42], [50, 51], [60, 61, 62, 63]]
  r = recipe(prompts='calibration', prompts_sha256='sha-p', prompted_fraction=0.5,
             sequences_per_shard=8, seq_len=20)
  directory = str(tmp_path / 'data')
  assert distill_data.generate(TARGET, TARGET_PARAMS, r, directory, prompts) == [0, 1, 2]
  data = distill_data.load(directory)
  used = []
  for row, (tokens, start) in enumerate(zip(data.tokens_NxL.tolist(), data.starts_N.tolist())):
    which = r.prompt_of(row, len(prompts))
    head = [2] + ([] if which is None else prompts[which])
    assert tokens[:len(head)] == head and start == len(head), (row, tokens, start)
    used.append(which)
  assert used.count(None) == 12 and {0, 1, 2} <= set(used)   # half the rows, every prompt
  # The shards' provenance counts them; the recipe names the prompt set and its hash.
  meta = json.load(open(distill_data.shard_paths(directory, 0)[1]))
  assert meta['prompted_rows'] == 4 and meta['recipe']['prompts_sha256'] == 'sha-p'
  with pytest.raises(ValueError, match='no prompt was given'):
    distill_data.generate(TARGET, TARGET_PARAMS, r, str(tmp_path / 'other'))
  with pytest.raises(ValueError, match='prompt of 4 tokens.*no room'):
    distill_data.make_shard(TARGET, TARGET_PARAMS, recipe(
        prompts='calibration', prompted_fraction=1.0, seq_len=8, start_tokens=3), 0, prompts)


def test_data_made_before_prompts_existed_still_loads_and_matches_its_recipe(tmp_path):
  r = recipe(num_shards=2)
  directory = str(tmp_path / 'data')
  distill_data.generate(TARGET, TARGET_PARAMS, r, directory)
  path = os.path.join(directory, 'recipe.json')
  old = {k: v for k, v in json.load(open(path)).items() if k not in distill_data.NEW_FIELDS}
  json.dump(old, open(path, 'w'))
  for shard in range(2):   # shards as they were written: no starts_N
    data_path = distill_data.shard_paths(directory, shard)[0]
    with np.load(data_path) as f:
      arrays = {k: f[k] for k in ('tokens_NxL', 'lengths_N')}
    np.savez(open(data_path, 'wb'), **arrays)
  assert distill_data.generate(TARGET, TARGET_PARAMS, r, directory) == []
  assert distill_data.load(directory).starts_N.tolist() == [1] * 8
  with pytest.raises(ValueError, match='another recipe.*prompted_fraction'):
    distill_data.generate(TARGET, TARGET_PARAMS, recipe(
        num_shards=2, prompts='calibration', prompted_fraction=0.5), directory, [[5]])


def test_a_corrupt_or_missing_shard_is_named(tmp_path):
  directory = str(tmp_path / 'data')
  distill_data.generate(TARGET, TARGET_PARAMS, recipe(num_shards=2), directory)
  data, _ = distill_data.shard_paths(directory, 1)
  with open(data, 'wb') as f:
    f.write(b'not a zip')
  with pytest.raises(ValueError, match='shard_00001.npz: corrupt shard'):
    distill_data.load(directory)
  os.remove(data)
  with pytest.raises(ValueError, match='shard 1 is missing'):
    distill_data.load(directory)


# --------------------------------------------------- trained beats untrained

def test_trained_heads_beat_untrained_ones_on_held_out_text(tmp_path, monkeypatch):
  """On a target whose next tokens follow from its hidden state (a bigram with
  features), heads trained on its text draft far better than untrained heads (which
  repeat the target's own next-token guess one place too late) on shards held out."""
  vocab, width = 64, 16
  toy = toy_models.HiddenBigram(tiny_config(vocab_size=vocab, embed_dim=width))
  rng = np.random.default_rng(0)
  params = {'hidden_VxD': jnp.asarray(rng.normal(size=(vocab, width)), jnp.float32),
            'embedding_VxD': jnp.asarray(rng.normal(size=(vocab, width)) * 0.5, jnp.float32)}
  monkeypatch.setattr(trainer, 'load_target', lambda name: (toy, params, 'sha-toy'))
  cfg = config(tmp_path, steps=60, eval_every=60, log_every=20, checkpoint_every=60,
               learning_rate=1e-2, final_learning_rate=1e-3,
               data=dict(num_shards=5, sequences_per_shard=8, seq_len=32, start_tokens=3,
                         sampled_fraction=0.0, seed=3, bos_id=2, eos_ids=()))
  trained = trainer.train(cfg)
  held = distill_data.load(os.path.join(cfg.output_dir, 'data'), [4])
  assert len({tuple(row[:8]) for row in held.tokens_NxL.tolist()}) > 2   # varied held-out text
  goal = trainer.make_objective(cfg, toy.config)
  features = trainer.target_features(toy, params, held.tokens_NxL, goal.hidden_layers, 4)
  untrained = trainer.evaluate(goal, medusa.init_heads(3, width), goal.frozen(params, None),
                               features, held, 4)
  assert trained['heldout_mean_accepted_tokens'] > untrained['heldout_mean_accepted_tokens'] + 0.5
  assert trained['heldout_loss'] < untrained['heldout_loss']


def test_a_distilled_student_beats_the_target_cut_short_it_started_from(tmp_path):
  """The student starts as the target's first block (an early exit); trained on the
  target's text it drafts better on shards held out, and its loss there falls."""
  cfg = config(tmp_path, drafter='distilled', distilled=dict(layers=1, loss='tv'), steps=80,
               eval_every=80, log_every=20, checkpoint_every=80, learning_rate=1e-2,
               final_learning_rate=1e-3,
               data=dict(num_shards=5, sequences_per_shard=8, seq_len=32, start_tokens=3,
                         sampled_fraction=0.0, seed=3, bos_id=2, eos_ids=()))
  trained = trainer.train(cfg)
  held = distill_data.load(os.path.join(cfg.output_dir, 'data'), [4])
  goal = trainer.make_objective(cfg, TARGET.config)
  features = trainer.target_features(TARGET, TARGET_PARAMS, held.tokens_NxL, goal.hidden_layers,
                                     4)
  untrained = trainer.evaluate(goal, goal.init(None, TARGET_PARAMS),
                               goal.frozen(TARGET_PARAMS, None), features, held, 4)
  assert trained['heldout_mean_accepted_tokens'] > untrained['heldout_mean_accepted_tokens'] + 0.3
  assert trained['heldout_loss'] < 0.8 * untrained['heldout_loss']
  with pytest.raises(ValueError, match=r'config.distilled.layers: .*1 .. 3 layers.*got 4'):
    trainer.train(config(tmp_path / 'b', drafter='distilled', distilled=dict(layers=4)))


def test_heads_train_on_a_reduced_draft_vocabulary_and_ship_it(tmp_path):
  ranked = np.random.default_rng(0).permutation(TARGET.config.vocab_size).astype(np.int32)
  path = str(tmp_path / 'vocab.npz')
  draft_vocab.save(draft_vocab.DraftVocab(ranked, TARGET.config.vocab_size, 'tok'), path)
  cfg = config(tmp_path, draft_vocab=path, draft_vocab_size=40, steps=4, eval_every=4)
  trainer.train(cfg)
  _, ids, manifest = drafter_io.load_drafter(
      os.path.join(cfg.output_dir, 'drafter'), 'medusa',
      target=drafter_io.target_signature(TARGET.config, 'sha-tiny'))
  assert ids.tolist() == ranked[:40].tolist()
  assert manifest['train_config']['draft_vocab_size'] == 40
  other = str(tmp_path / 'other.npz')
  draft_vocab.save(draft_vocab.DraftVocab(np.arange(10, dtype=np.int32), 10, 'tok'), other)
  with pytest.raises(ValueError, match="config.draft_vocab is .*other.npz.*10-token"):
    trainer.train(config(tmp_path / 'b', draft_vocab=other, draft_vocab_size=5))


# ------------------------------------------------------------------ bad input

def test_a_drafter_checkpoint_for_another_target_or_damaged_is_refused(tmp_path):
  heads = medusa.init_heads(2, TARGET.config.embed_dim)
  signature = drafter_io.target_signature(TARGET.config, 'sha-a')
  where = tmp_path / 'heads'
  drafter_io.save_drafter(where, 'medusa', heads, target=signature, vocab_ids_N=np.arange(8))
  loaded, ids, _ = drafter_io.load_drafter(where, 'medusa', target=signature)
  assert ids.tolist() == list(range(8)) and loaded['w_KxDxD'].shape == (2, 32, 32)
  wider = drafter_io.target_signature(dataclasses.replace(TARGET.config, embed_dim=64), 'sha-a')
  with pytest.raises(CheckpointError, match='another target: its embed_dim is 32.*64'):
    drafter_io.load_drafter(where, 'medusa', target=wider)
  with pytest.raises(CheckpointError, match="another target: its sha256 is 'sha-a'"):
    drafter_io.load_drafter(where, 'medusa', target={**signature, 'sha256': 'sha-b'})
  with pytest.raises(CheckpointError, match="holds a 'medusa' drafter, not 'eagle'"):
    drafter_io.load_drafter(where, 'eagle', target=signature)
  np.save(where / 'vocab_ids.npy', np.arange(1, 9))
  with pytest.raises(CheckpointError, match='does not match the draft vocabulary'):
    drafter_io.load_drafter(where, 'medusa', target=signature)
  (where / 'drafter.json').write_text('{not json')
  with pytest.raises(CheckpointError, match='corrupt drafter manifest'):
    drafter_io.load_drafter(where, 'medusa', target=signature)
  with pytest.raises(CheckpointError, match='not a specjax drafter checkpoint'):
    drafter_io.load_drafter(tmp_path, 'medusa', target=signature)


@pytest.mark.parametrize('key,value,message', [
    ('drafter', 'hydra', "knows 'medusa', 'eagle'"),
    ('eagle', {'stepz': 2}, 'config.eagle has unknown key'),
    ('eagle', {'steps': 0}, 'config.eagle.steps must be >= 1'),
    ('eagle', {'mlp_width': 2.5}, 'config.eagle.mlp_width must be'),
    ('eagle', {'soft_labels': -1}, 'config.eagle.soft_labels must be in \\[0, draft_vocab_size'),
    ('eagle', {'soft_labels': 1.5}, 'config.eagle.soft_labels must be'),
    ('heldout_shards', 3, 'must leave training shards'),
    ('warmup_steps', 8, 'warmup_steps must be in'),
    ('num_heads', 0, 'num_heads must be >= 1'),
    ('distilled', {'layer': 1}, 'config.distilled has unknown key'),
    ('distilled', {'loss': 'mse'}, "config.distilled.loss must be one of kl, tv, got 'mse'"),
    ('distilled', {'layers': 1.5}, 'config.distilled.layers must be int'),
    ('data', {'num_shards': 3, 'sequences_per_shard': 8, 'seq_len': 24, 'shards': 2},
     "config.data: .*unexpected keyword argument 'shards'"),
    ('data', {'num_shards': 3, 'sequences_per_shard': 8, 'seq_len': 24, 'prompts': 'wiki'},
     "config.data.prompts is 'wiki'; known: '' \\(BOS only\\), calibration, instructions, "
     'requests'),
    ('data', {'num_shards': 3, 'sequences_per_shard': 8, 'seq_len': 24,
              'prompted_fraction': 0.5}, 'data.prompts must name a prompt set'),
    ('data', {'num_shards': 3, 'sequences_per_shard': 8, 'seq_len': 24,
              'prompted_fraction': 1.5}, 'prompted_fraction must be in'),
])
def test_bad_training_config_values_are_named(tmp_path, key, value, message):
  with pytest.raises(ValueError, match=message):
    config(tmp_path, **{key: value})


def test_the_training_prompt_sets_are_the_package_files_they_name():
  for name, file in prompts_lib.PROMPT_SETS.items():
    prompts, sha = prompts_lib.prompt_set(name)
    text = (importlib.resources.files('specjax.prompts') / file).read_bytes()
    assert sha == hashlib.sha256(text).hexdigest()   # the provenance a shard records
    assert len({p.id for p in prompts}) == len(prompts) == text.count(b'\n')
  kinds = {'writing', 'roleplay', 'reasoning', 'math', 'coding', 'extraction', 'stem',
           'humanities', 'translation', 'summarization', 'qa', 'math_reasoning', 'rag'}
  instructions, _ = prompts_lib.prompt_set('instructions')
  requests, _ = prompts_lib.prompt_set('requests')
  for prompts in (instructions, requests):
    assert len(prompts) == 128
    assert {p.category for p in prompts} == kinds
  # The requests are other prompts, not the instructions again.
  assert not {p.text for p in instructions} & {p.text for p in requests}
  with pytest.raises(ConfigError, match="unknown prompt set 'wiki'; known: calibration, "
                                        'instructions, requests'):
    prompts_lib.prompt_set('wiki')


@pytest.mark.parametrize('variant, prompts, tokens, continues', [
    ('instructions', 'instructions', 1 << 20, ''),
    ('requests', 'requests', 1 << 19, 'instructions'),
])
def test_the_continuing_recipes_are_valid_training_configs(variant, prompts, tokens, continues):
  train_eagle = config_files.load('train_eagle')
  cfg = trainer.TrainConfig.from_config(train_eagle.get_config(variant))
  assert cfg.drafter == 'eagle' and cfg.target == 'embedded:gemma3-270m'
  data = distill_data.Recipe(target=cfg.target, target_sha256='', **cfg.data)
  assert (data.prompts, data.prompted_fraction, data.seq_len) == (prompts, 0.75, 256)
  assert data.num_shards * data.sequences_per_shard * data.seq_len == tokens
  assert cfg.output_dir != train_eagle.get_config().output_dir
  # Each run starts from the drafter the run before it writes.
  before = train_eagle.get_config(continues) if continues else train_eagle.get_config()
  assert cfg.init_from == os.path.join(before.output_dir, 'drafter')
  assert cfg.data_dir != before.data_dir


def test_prompted_data_needs_a_target_with_a_tokenizer(tmp_path):
  cfg = config(tmp_path, target='tiny-random',
               data=dict(num_shards=3, sequences_per_shard=8, seq_len=24, start_tokens=3,
                         prompts='calibration', prompted_fraction=0.5))
  with pytest.raises(ValueError, match='data.prompts needs a target with a tokenizer'):
    trainer.train(cfg)


# ---------------------------------------------------- trained heads, end to end

@pytest.mark.parametrize('drafter', ['medusa', 'eagle', 'distilled'])
def test_the_tiny_recipe_trains_a_drafter_that_a_run_serves_exactly(tmp_path, monkeypatch,
                                                                    drafter):
  """configs/train_<drafter>.py:tiny, then `run_experiment` with drafters=(drafter,):
  greedy output identical to the baseline, and a checkpoint for another target refused."""
  from specjax import experiment  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import CheckpointError as Refused  # pylint: disable=g-import-not-at-top
  import test_experiment  # pylint: disable=g-import-not-at-top
  monkeypatch.undo()   # the real tiny-random target, as the experiment loads it
  train_config = config_files.load(f'train_{drafter}').get_config('tiny')
  train_config.output_dir = str(tmp_path / 'train')
  final = trainer.train(trainer.TrainConfig.from_config(train_config))
  assert final['heldout_mean_accepted_tokens'] >= 1.0
  weights_dir = str(tmp_path / 'train' / 'drafter')
  served = 'draft_model' if drafter == 'distilled' else drafter   # a distilled model drafts so
  config = test_experiment.tiny_config(tmp_path / 'run', drafters=(served,), gamma=3,
                                       **{served: dict(checkpoint=weights_dir,
                                                       min_confidence=0.0)})
  experiment.run_experiment(config)
  rows = test_experiment.read_rows(config)
  assert [r['method'] for r in rows].count(served) == 3
  assert all(r['identical_to_baseline'] for r in rows if r['method'] == served)
  # The same weights for a target of another vocabulary: refused before anything runs.
  manifest = json.loads(open(os.path.join(weights_dir, 'drafter.json')).read())
  manifest['target']['vocab_size'] += 1
  with open(os.path.join(weights_dir, 'drafter.json'), 'w') as f:
    json.dump(manifest, f)
  config.output_dir = str(tmp_path / 'run2')
  with pytest.raises(Refused, match='another target: its vocab_size is 261'):
    experiment.run_experiment(config)
