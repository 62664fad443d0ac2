"""The distilled draft model: its student starts as the target cut short, its loss is
zero exactly when it matches the target and TV is one minus the acceptance rate; the
draft_model drafter serves it through a draft vocabulary with greedy parity and exact
sampling (with a negative control); a directory for another target is refused.

test_training trains one (the loss falls, resume, trained beats untrained, end to end).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints import CheckpointError
from specjax.checkpoints import drafter_io
from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.drafters import make_drafter
from specjax.experiments import loading
from specjax.models.config import tiny_config
from specjax.models.language_model import LanguageModel
from specjax.training import distilled_objective
from specjax.training import medusa_objective

import test_acceptance as acc
import toy_models
from test_speculative import MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS
from test_speculative import eos_id, greedy_reference, spec_generate

CFG = TARGET.config
SUBSET = np.arange(0, CFG.vocab_size, 2, dtype=np.int32)


def _student(layers=2, perturb=0.0):
  weights = distilled_objective.student_init(TARGET_PARAMS, layers)
  if perturb:   # a student that is not the target cut short: drafts that differ
    leaves, tree = jax.tree.flatten(weights)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    weights = jax.tree.unflatten(tree, [x + perturb * jax.random.normal(k, x.shape)
                                        for x, k in zip(leaves, keys)])
  model = LanguageModel(distilled_objective.student_config(CFG, layers))
  return model, distilled_objective.student_params(weights, TARGET_PARAMS['embedding_VxD'])


def test_the_student_starts_as_the_target_cut_short():
  model, params = _student(layers=2)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, CFG.vocab_size, (2, 9)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
  mine = model.forward(params, tokens, positions, model.init_cache(2, 12))
  cut = TARGET.forward(TARGET_PARAMS, tokens, positions, TARGET.init_cache(2, 12), num_layers=2)
  np.testing.assert_allclose(mine.logits_BxRxV, cut.logits_BxRxV, rtol=1e-5, atol=1e-5)
  assert set(params) == {'embedding_VxD', 'final_norm', 'layer_0', 'layer_1'}
  with pytest.raises(ValueError, match='1 .. 3 layers'):
    distilled_objective.student_config(CFG, 4)


# ----------------------------------------------------------------- the loss

def _objective(loss_kind, layers=2):
  return distilled_objective.Objective(CFG, layers, loss_kind)


def _batch():
  rng = np.random.default_rng(4)
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (2, 10)), jnp.int32)
  return tokens, jnp.array([10, 7], jnp.int32)


@pytest.mark.parametrize('loss_kind', ['tv', 'kl'])
def test_the_loss_is_zero_for_a_student_that_is_the_teacher(loss_kind):
  """Features made by the student itself stand for a teacher it matches exactly: loss 0;
  the target's real features give a positive loss."""
  goal = _objective(loss_kind)
  weights = goal.init(None, TARGET_PARAMS)
  frozen = goal.frozen(TARGET_PARAMS, jnp.asarray(SUBSET))
  tokens, lengths = _batch()
  model, params = _student()
  positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
  own = model.forward(params, tokens, positions, model.init_cache(2, 10), logits=False)
  loss, _ = goal.loss(weights, frozen, own.hidden_BxTxD, tokens, lengths)
  assert abs(float(loss)) < 1e-5
  real = TARGET.forward(TARGET_PARAMS, tokens, positions, TARGET.init_cache(2, 10), logits=False)
  loss, _ = goal.loss(weights, frozen, real.hidden_BxTxD, tokens, lengths)
  assert float(loss) > 1e-3


def test_tv_is_one_minus_the_acceptance_rate_over_the_draft_vocabulary():
  goal = _objective('tv')
  weights = goal.init(None, TARGET_PARAMS)
  frozen = goal.frozen(TARGET_PARAMS, jnp.asarray(SUBSET))
  tokens, _ = _batch()
  lengths = jnp.array([10, 10], jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
  real = TARGET.forward(TARGET_PARAMS, tokens, positions, TARGET.init_cache(2, 10), logits=False)
  loss, _ = goal.loss(weights, frozen, real.hidden_BxTxD, tokens, lengths)
  model, params = _student()
  mine = model.forward(params, tokens, positions, model.init_cache(2, 10), logits=False)
  head = np.asarray(frozen['head_NxD'], np.float64)
  p = jax.nn.softmax(np.asarray(real.hidden_BxTxD, np.float64) @ head.T, axis=-1)
  q = jax.nn.softmax(np.asarray(mine.hidden_BxTxD, np.float64) @ head.T, axis=-1)
  acceptance = np.minimum(p, q).sum(-1).mean()
  assert float(loss) == pytest.approx(1.0 - acceptance, abs=1e-4)


def test_the_held_out_chain_is_the_students_greedy_drafts_after_the_pending_token():
  """correct_BxLxK[t, k] is the argmax at position t + 1 + k checked against token
  t + k + 2, which is what decoding drafts while every draft so far was right."""
  goal = distilled_objective.Objective(CFG, 2, 'tv', steps=3)
  weights = goal.init(None, TARGET_PARAMS)
  frozen = goal.frozen(TARGET_PARAMS, None)
  tokens, lengths = _batch()
  positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
  real = TARGET.forward(TARGET_PARAMS, tokens, positions, TARGET.init_cache(2, 10), logits=False)
  _, metrics = goal.loss(weights, frozen, real.hidden_BxTxD, tokens, lengths)
  model, params = _student()
  guess = np.asarray(jnp.argmax(model.forward(params, tokens, positions,
                                              model.init_cache(2, 10)).logits_BxRxV, -1))
  want = np.zeros((2, 10, 3), bool)
  for b in range(2):
    for t in range(10):
      for k in range(3):
        if t + k + 2 < int(lengths[b]):
          want[b, t, k] = guess[b, t + 1 + k] == int(tokens[b, t + k + 2])
  np.testing.assert_array_equal(metrics['correct_BxLxK'], want)
  rows, valid = medusa_objective.labels(tokens, lengths, frozen['index_V'], 3)
  assert np.asarray(valid).sum() > 0 and rows.shape == (2, 10, 3)


# ------------------------------------------------- served as a draft model

@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
@pytest.mark.parametrize('vocab_ids', [None, SUBSET], ids=['full', 'reduced'])
def test_greedy_distilled_drafts_equal_greedy_autoregressive(vocab_ids, adaptive):
  model, params = _student(perturb=0.05)
  drafter = make_drafter('draft_model', target=TARGET, draft_model=(model, params, vocab_ids))
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3, max_new_tokens=MAX_NEW,
                      eos_ids=(eos_id(),), adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  assert 0 < sum(out.accepted_tokens) < sum(out.drafted_tokens)


def test_a_reduced_draft_model_drafts_only_inside_its_vocabulary():
  model, params = _student(perturb=0.05)
  drafter = make_drafter('draft_model', target=TARGET, draft_model=(model, params, SUBSET))
  seen = []

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    jax.debug.callback(lambda d: seen.append(np.asarray(d)), proposal.draft_BxG)
    return proposal

  spec_generate(TARGET, TARGET_PARAMS, dataclasses.replace(drafter, propose=propose),
                PROMPTS[:2], gamma=3, max_new_tokens=MAX_NEW)
  drafted = np.concatenate([d.ravel() for d in seen])
  assert drafted.size > 0 and np.isin(drafted, SUBSET).all()


# -------------------------------------------------- exact sampling (chi-square)

D = 4
TOY = toy_models.HiddenBigram(tiny_config(vocab_size=acc.V, embed_dim=D))
_rng = np.random.default_rng(5)
TOY_PARAMS = {'hidden_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)), jnp.float32),
              'embedding_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)) * 0.8, jnp.float32)}
TOY_TABLE = np.asarray(TOY_PARAMS['hidden_VxD'] @ TOY_PARAMS['embedding_VxD'].T)
# The draft model: the same table, other hidden states (a student that is close, not equal).
DRAFT_PARAMS = {**TOY_PARAMS, 'hidden_VxD': TOY_PARAMS['hidden_VxD']
                + jnp.asarray(_rng.normal(size=(acc.V, D)) * 0.7, jnp.float32)}
DRAFT_TABLE = np.asarray(DRAFT_PARAMS['hidden_VxD']) @ np.asarray(DRAFT_PARAMS['embedding_VxD']).T
TOY_SUBSET = np.array([0, 2, 3, 5], np.int32)


def _sample(drafter, seed):
  out = speculative.generate(TOY, TOY_PARAMS, drafter, [acc.PROMPT] * acc.NUM_SAMPLES, gamma=3,
                             policy=draft_length.fixed(3), max_new_tokens=acc.NUM_NEW,
                             sampling=acc.CONFIGS['t1'], seed=seed)
  p_value, impossible = acc.check_exact(out.new_tokens, acc.CONFIGS['t1'], table=TOY_TABLE)
  assert impossible == 0
  return p_value, np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)


def test_reduced_draft_model_sampling_is_exact():
  """q is zero outside the draft vocabulary, and the target's distribution still comes out."""
  drafter = make_drafter('draft_model', target=TOY, draft_model=(TOY, DRAFT_PARAMS, TOY_SUBSET))
  p_value, rate = _sample(drafter, seed=4)
  assert p_value > acc.P_VALUE_OK, p_value
  assert 0.03 < rate < 0.95, rate


def test_distribution_test_rejects_a_q_over_the_whole_vocabulary():
  """The mistake the scatter prevents: reporting q as the draft model's softmax over
  all of V, when the draft was drawn from its restriction to the draft vocabulary."""
  drafter = make_drafter('draft_model', target=TOY, draft_model=(TOY, DRAFT_PARAMS, TOY_SUBSET))

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    table = jnp.asarray(DRAFT_TABLE)
    tokens_BxS, lengths_B = kwargs['tokens_BxS'], kwargs['lengths_B']
    last_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    previous_BxG = jnp.concatenate([last_B[:, None], proposal.draft_BxG[:, :-1]], axis=1)
    return proposal.replace(q_BxGxV=jax.nn.softmax(table[previous_BxG], axis=-1))

  p_value, _ = _sample(dataclasses.replace(drafter, propose=propose), seed=4)
  assert p_value < acc.P_VALUE_WRONG, p_value


# ------------------------------------------------------------------ loading

def _save(tmp_path, layers=2, config=CFG):
  weights = distilled_objective.student_init(TARGET_PARAMS, layers)
  where = tmp_path / 'distilled'
  drafter_io.save_drafter(where, 'distilled', weights,
                          target=drafter_io.target_signature(config, ''),
                          vocab_ids_N=SUBSET, provenance={'student_layers': layers})
  return where


@dataclasses.dataclass
class _Config:
  draft_model: dict
  model: str = 'tiny-random'


def test_a_distilled_directory_loads_as_a_draft_model_sharing_the_embedding(tmp_path):
  where = _save(tmp_path)
  model, params, ids = loading.load_draft_model(_Config({'checkpoint': str(where)}), TARGET,
                                                TARGET_PARAMS)
  assert model.config.num_layers == 2 and ids.tolist() == SUBSET.tolist()
  assert params['embedding_VxD'] is TARGET_PARAMS['embedding_VxD']
  for mine, target in zip(jax.tree.leaves(params['layer_1']),
                          jax.tree.leaves(TARGET_PARAMS['layer_1'])):
    np.testing.assert_array_equal(mine, target)


def test_a_distilled_directory_for_another_target_or_damaged_is_refused(tmp_path):
  wider = dataclasses.replace(CFG, embed_dim=64)
  where = _save(tmp_path, config=wider)
  with pytest.raises(CheckpointError, match='another target: its embed_dim is 64'):
    loading.load_draft_model(_Config({'checkpoint': str(where)}), TARGET, TARGET_PARAMS)
  where = _save(tmp_path / 'b')
  (where / 'drafter.json').write_text('{"kind": "distilled", "target": ')
  with pytest.raises(CheckpointError, match='corrupt drafter manifest'):
    loading.load_draft_model(_Config({'checkpoint': str(where)}), TARGET, TARGET_PARAMS)
  where = _save(tmp_path / 'c')
  for file in (where / 'weights').rglob('*'):
    if file.is_file() and file.stat().st_size > 100:
      file.write_bytes(file.read_bytes()[:50])
  with pytest.raises(CheckpointError, match='corrupt drafter weights'):
    loading.load_draft_model(_Config({'checkpoint': str(where)}), TARGET, TARGET_PARAMS)
