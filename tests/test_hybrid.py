"""The hybrid drafter: n-gram drafts where a row has a match (and, under
choose='history', while lookup's acceptance for the row is at least the
network's), the network drafter's elsewhere, the network run only in steps that
need it; greedy parity, exact sampling (with a negative control), trees, bad
settings."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.decoding import step_costs
from specjax.decoding import tree as tree_lib
from specjax.drafters import base
from specjax.drafters import eagle
from specjax.drafters import hybrid
from specjax.drafters import make_drafter
from specjax.drafters import medusa
from specjax.drafters import ngram as ngram_lib
from specjax.experiments.config import ConfigError, ExperimentConfig

import test_acceptance as acc
import test_eagle
import test_medusa
from test_speculative import DRAFTERS, MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS
from test_speculative import check_greedy_tree, eos_id, greedy_reference, plain_greedy
from test_speculative import spec_generate

EAGLE = eagle.make(TARGET, test_eagle.NET, test_eagle.LAYERS, vocab_ids_N=test_eagle.SUBSET,
                   target_params=TARGET_PARAMS)
SETTINGS = hybrid.Settings()   # choose='lookup': every match drafts, what the first tests check


def _recorded(fallback, settings=SETTINGS, sources=None):
  """The hybrid over `fallback`, recording every step's context and drafts, and
  every step in which the fallback drafted (and into `sources`, if given, which
  rows each step drafted by lookup)."""
  steps, network_calls = [], []

  def network_propose(**kwargs):
    proposal = fallback.propose(**kwargs)
    jax.debug.callback(lambda d: network_calls.append(np.asarray(d)), proposal.draft_BxG)
    return proposal

  drafter = hybrid.make(settings, dataclasses.replace(fallback, propose=network_propose))

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    jax.debug.callback(lambda *a: steps.append([np.asarray(x) for x in a]), proposal.draft_BxG,
                       kwargs['tokens_BxS'], kwargs['lengths_B'])
    if sources is not None:
      jax.debug.callback(lambda b: sources.append(np.asarray(b)), proposal.state.lookup_B)
    return proposal

  return dataclasses.replace(drafter, propose=propose), steps, network_calls


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
def test_greedy_hybrid_equals_greedy_autoregressive_and_drafts_from_the_right_drafter(adaptive):
  """Batch 4 of mixed lengths: the output is the reference; a row with an n-gram
  match carries n-gram lookup's drafts; the network drafts in exactly the steps
  where some row has no match, and both kinds of step happen."""
  drafter, steps, network_calls = _recorded(EAGLE)
  gamma = 3
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                      max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  needs_network, matched_rows = 0, 0
  for draft_BxG, tokens_BxS, lengths_B in steps:
    # A step drafts the width the loop chose for it (gamma, or fewer when adaptive).
    width = draft_BxG.shape[1]
    assert 1 <= width <= gamma
    lookup_BxG, matched_B = ngram_lib.propose_ngram(jnp.asarray(tokens_BxS),
                                                    jnp.asarray(lengths_B), width, 3, 1)
    matched_B = np.asarray(matched_B) > 0
    np.testing.assert_array_equal(draft_BxG[matched_B], np.asarray(lookup_BxG)[matched_B])
    needs_network += int(not matched_B.all())
    matched_rows += int(matched_B.sum())
  assert len(network_calls) == needs_network > 0
  assert matched_rows > 0
  assert sum(out.accepted_tokens) > 0


def test_a_plain_step_drafts_nothing():
  """The hybrid has its network's costly drafts: the loop picks the width first, so a
  step the policy makes plain runs neither lookup nor the network (drafting first ran
  the network in every step, and a never-drafting loop cost 1.47 decode steps a step)."""
  drafter, steps, network_calls = _recorded(EAGLE)
  assert drafter.costly_drafts
  never = draft_length.Policy(buckets=(0, 3), costs=(1.0, 50.0))
  out = speculative.generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3,
                             max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), policy=never)
  assert out.new_tokens == greedy_reference()
  assert steps == [] and network_calls == []
  assert sum(out.drafted_tokens) == 0


def test_an_unmatched_row_drafts_what_the_network_drafts():
  """One row, so every step is one kind: an unmatched step's drafts are the network's,
  and a matched step does not run the network at all."""
  drafter, steps, network_calls = _recorded(EAGLE)
  spec_generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[0]], gamma=3, max_new_tokens=MAX_NEW)
  unmatched = [d for d, t, n in steps
               if not np.asarray(ngram_lib.propose_ngram(jnp.asarray(t), jnp.asarray(n), 3, 3,
                                                         1)[1])[0]]
  assert 0 < len(unmatched) == len(network_calls) < len(steps), (len(unmatched), len(steps))
  for drafted, network in zip(unmatched, network_calls):
    np.testing.assert_array_equal(drafted, network)


def test_the_plan_gives_each_row_its_sources_acceptance_and_marks_the_network_rows():
  """Before the width is chosen: a row with a match is lookup's (its record, nothing to
  draft at a cost), a row without is the network's."""
  drafter = hybrid.make(SETTINGS, EAGLE)
  tokens_BxS = jnp.asarray([[5, 6, 7, 5, 6, 0, 0, 0], [5, 6, 7, 8, 9, 0, 0, 0]], jnp.int32)
  lengths_B = jnp.asarray([5, 5], jnp.int32)
  record = lambda accepted, rejected: draft_length.History(  # noqa: E731
      jnp.asarray(accepted, jnp.float32), jnp.asarray(rejected, jnp.float32))
  state = hybrid.State(network=None, lookup_B=jnp.zeros((2,), bool),
                       lookup_history=record([8.0, 8.0], [0.0, 0.0]),
                       network_history=record([0.0, 0.0], [8.0, 8.0]))
  plan = drafter.plan(params=drafter.params, state=state, tokens_BxS=tokens_BxS,
                      lengths_B=lengths_B)
  assert np.asarray(plan.costly_B).tolist() == [False, True]   # row 0 ends in '5 6', seen before
  policy = hybrid._HISTORY  # pylint: disable=protected-access
  want = [float(state.lookup_history.acceptance(policy)[0]),
          float(state.network_history.acceptance(policy)[1])]
  np.testing.assert_allclose(np.asarray(plan.acceptance_B), want)
  assert want[0] > 0.8 > 0.2 > want[1]


@pytest.mark.parametrize('draft_costs', [(0.0, 1.5), ()], ids=['drafting-known', 'control'])
def test_a_step_that_only_copies_is_weighed_without_the_networks_drafting_cost(draft_costs):
  """A call of 3 drafts costs 2 decode steps, 1.5 of them the network's drafting: at the
  prior's acceptance (0.5) a call is worth 1.875 tokens, so it pays only where the row
  copies (0.5 steps). The hybrid copies in every step with a match and takes a plain
  step without one, never running the network. Control: with the drafting part unknown
  every call is priced at 2 steps, and nothing is drafted."""
  drafter, steps, network_calls = _recorded(EAGLE)
  policy = draft_length.Policy((0, 3), (1.0, 2.0), draft_costs=draft_costs)
  out = speculative.generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[0]], gamma=3,
                             max_new_tokens=MAX_NEW, policy=policy)
  assert out.new_tokens == [plain_greedy()[0]]
  assert network_calls == []
  if draft_costs:
    assert steps and out.plain_calls[0] > 0 and sum(out.drafted_tokens) > 0
    for _, tokens_BxS, lengths_B in steps:   # every drafted step had a match
      assert np.asarray(ngram_lib.propose_ngram(jnp.asarray(tokens_BxS), jnp.asarray(lengths_B),
                                                3, 3, 1)[1])[0] > 0
  else:
    assert steps == [] and sum(out.drafted_tokens) == 0


def test_a_hybrids_drafting_is_timed_on_its_network():
  """`step_costs` times drafting from a prompt with no n-gram match, so the hybrid's
  measured drafting cost is its network's (a zero prompt matched everywhere, and the
  hybrid's drafts were measured as free)."""
  drafter, _, network_calls = _recorded(EAGLE)
  step_costs.seconds_per_draft(drafter, TARGET, TARGET_PARAMS, 2, batch=1, num_slots=32)
  assert network_calls


def test_medusa_as_the_fallback():
  medusa_drafter = medusa.make(TARGET, test_medusa.HEADS, target_params=TARGET_PARAMS)
  drafter = hybrid.make(hybrid.Settings(drafter='medusa'), medusa_drafter)
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3, max_new_tokens=MAX_NEW,
                      eos_ids=(eos_id(),))
  assert out.new_tokens == greedy_reference()
  assert sum(out.accepted_tokens) > 0


def test_a_draft_model_as_the_fallback_feeds_its_cache_what_lookup_drafted():
  """The draft model's cache must hold every committed token, lookup's drafts
  included. With the target itself as the draft model and its cache kept right,
  its drafts are never rejected: each step it drafts commits all gamma of them
  and a bonus token (but the last step, which the token budget may cut), also
  right after lookup steps. One row, so the network never runs in a lookup step
  and only `update` can give it lookup's tokens; this prompt's lookup steps
  commit past anything the network wrote (feeding only the last two committed
  tokens, as a plain draft model may, leaves a stale slot here and a rejection)."""
  gamma = 3
  target_as_draft = make_drafter('draft_model', target=TARGET,
                                 draft_model=(TARGET, TARGET_PARAMS))
  drafter, steps, network_calls = _recorded(target_as_draft)
  out = spec_generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[2]], gamma=gamma,
                      max_new_tokens=MAX_NEW)
  assert out.new_tokens == plain_greedy()[2:3]
  matched = [bool(np.asarray(ngram_lib.propose_ngram(jnp.asarray(t), jnp.asarray(n), gamma, 3,
                                                     1)[1])[0]) for _, t, n in steps]
  assert len(network_calls) == matched.count(False) > 0
  after_lookup = 0
  for i in range(len(steps) - 1):
    if not matched[i]:
      committed = int(steps[i + 1][2][0]) - int(steps[i][2][0])
      assert committed == gamma + 1, (i, committed)
      after_lookup += i > 0 and matched[i - 1]
  assert after_lookup > 0


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
def test_greedy_hybrid_choosing_by_history_equals_greedy_autoregressive(adaptive):
  """Batch 4 of mixed lengths under choose='history': the output is the reference,
  and a matched row drafts either lookup's copy or the network's drafts."""
  drafter, steps, network_calls = _recorded(EAGLE, hybrid.Settings())
  gamma = 3
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                      max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  assert network_calls and sum(out.accepted_tokens) > 0


def _one_row(choose: str):
  """The hybrid over the target itself as its draft model (its drafts are never
  rejected), on one prompt, every step verifying gamma drafts: the output, the
  steps, the steps that ran the network, and whether each step drafted by lookup."""
  target_as_draft = make_drafter('draft_model', target=TARGET,
                                 draft_model=(TARGET, TARGET_PARAMS))
  sources = []
  drafter, steps, network_calls = _recorded(
      target_as_draft, hybrid.Settings(drafter='draft_model', choose=choose), sources)
  out = spec_generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[2]], gamma=3,
                      max_new_tokens=MAX_NEW, adaptive=False)
  return out, steps, network_calls, [bool(b[0]) for b in sources]


def test_choosing_by_history_moves_a_row_whose_copies_fail_to_the_network():
  """A row's lookup drafts get rejected on this prompt, the network's never do.
  Under 'lookup' the row copies at every match; under 'history' it moves to the
  network once lookup's acceptance falls below the network's, so it runs the
  network in more steps, accepts more drafts and needs fewer target calls, with
  the same output. Some step has a match and still drafts from the network:
  the choice, not only the match, picked the source; and every step drafts
  from the source it recorded."""
  lookup_out, lookup_steps, lookup_net, _ = _one_row('lookup')
  history_out, history_steps, history_net, by_lookup = _one_row('history')
  assert lookup_out.new_tokens == history_out.new_tokens == plain_greedy()[2:3]
  assert sum(lookup_out.drafted_tokens) > sum(lookup_out.accepted_tokens)   # copies fail
  assert len(history_net) > len(lookup_net)
  assert sum(history_out.accepted_tokens) > sum(lookup_out.accepted_tokens)
  assert len(history_steps) < len(lookup_steps)
  assert len(by_lookup) == len(history_steps) and by_lookup.count(False) == len(history_net)
  net = iter(history_net)
  matched_network_steps = 0
  for (drafted, tokens_BxS, lengths_B), lookup in zip(history_steps, by_lookup):
    copy_BxG, matched_B = ngram_lib.propose_ngram(jnp.asarray(tokens_BxS),
                                                  jnp.asarray(lengths_B), 3, 3, 1)
    matched = bool(np.asarray(matched_B)[0])
    assert matched or not lookup
    np.testing.assert_array_equal(drafted, np.asarray(copy_BxG) if lookup else next(net))
    matched_network_steps += int(matched and not lookup)
  assert matched_network_steps > 0


def test_source_histories_count_only_the_calls_each_source_drafted():
  """update() credits the verified and accepted counts to the source that drafted
  the row, and a plain step (nothing verified) to neither; the network's own
  update still runs."""
  fallback = dataclasses.replace(DRAFTERS['draft_model'],
                                 update=lambda *, params, state, target: state + 1)
  drafter = hybrid.make(hybrid.Settings(drafter='draft_model'), fallback)
  fresh = draft_length.History.init(3)
  state = hybrid.State(network=jnp.int32(0), lookup_B=jnp.array([True, False, True]),
                       lookup_history=fresh, network_history=fresh)
  view = base.TargetView(tokens_BxS=jnp.zeros((3, 8), jnp.int32),
                         lengths_B=jnp.full((3,), 5, jnp.int32),
                         positions_BxT=jnp.zeros((3, 4), jnp.int32),
                         hidden_BxTxD=jnp.zeros((3, 4, 2)), layer_hidden_LxBxTxD=None,
                         num_accepted_B=jnp.array([1, 3, 0], jnp.int32),
                         num_verified_B=jnp.array([3, 3, 0], jnp.int32))
  new = drafter.update(params=None, state=state, target=view)
  assert int(new.network) == 1
  np.testing.assert_allclose(new.lookup_history.accepted_B, [1, 0, 0])
  np.testing.assert_allclose(new.lookup_history.rejected_B, [1, 0, 0])
  np.testing.assert_allclose(new.network_history.accepted_B, [0, 3, 0])
  np.testing.assert_allclose(new.network_history.rejected_B, [0, 0, 0])
  again = drafter.update(params=None, state=new, target=view)   # old counts decay
  np.testing.assert_allclose(again.lookup_history.accepted_B, [1.9, 0, 0], rtol=1e-6)


@pytest.mark.parametrize('fallback,spec,choose', [
    ('eagle', '-1,-1,-1,0,0,1,3,4', 'lookup'), ('eagle', 'eagle-25', 'lookup'),
    ('draft_model', '-1,-1,-1,0,0,1,3,4', 'lookup'), ('eagle', 'eagle-25', 'history')])
def test_greedy_hybrid_trees_equal_greedy_autoregressive(fallback, spec, choose):
  network = EAGLE if fallback == 'eagle' else DRAFTERS['draft_model']
  drafter = hybrid.make(hybrid.Settings(drafter=fallback, choose=choose), network)
  _, chain = check_greedy_tree(drafter, tree_lib.parse(spec))
  assert sum(chain.accepted_tokens) > 0


# -------------------------------------------------- exact sampling (chi-square)

def _toy_hybrid(choose='lookup'):
  fallback = eagle.make(test_eagle.TOY, test_eagle.TOY_NET, test_eagle.TOY_LAYERS,
                        target_params=test_eagle.TOY_PARAMS)
  return hybrid.make(hybrid.Settings(max_n=1, choose=choose), fallback)


def _sample_toy(drafter, seed):
  out = speculative.generate(test_eagle.TOY, test_eagle.TOY_PARAMS, drafter,
                             [acc.NGRAM_PROMPT] * acc.NUM_SAMPLES, gamma=3,
                             policy=draft_length.fixed(3), max_new_tokens=acc.NUM_NEW,
                             sampling=acc.CONFIGS['t1'], seed=seed)
  p_value, impossible = acc.check_exact(out.new_tokens, acc.CONFIGS['t1'],
                                        last_token=acc.NGRAM_PROMPT[-1],
                                        table=test_eagle.TOY_TABLE)
  assert impossible == 0
  return p_value, np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)


@pytest.mark.parametrize('choose', hybrid.CHOICES)
def test_hybrid_sampling_is_exact(choose):
  """Rows drafted by lookup (q one-hot) and by EAGLE (q its softmax) in one batch;
  under 'history' the source also depends on each row's past acceptances."""
  p_value, rate = _sample_toy(_toy_hybrid(choose), seed=3)
  assert p_value > acc.P_VALUE_OK, p_value
  assert 0.03 < rate < 0.95, rate


def test_hybrid_over_a_draft_model_samples_exactly():
  """The draft-model fallback's q where lookup has no match, one-hot q where it has,
  at temperature 1 and with top-p."""
  drafter = hybrid.make(hybrid.Settings(drafter='draft_model', max_n=1), acc.DRAFT_MODEL)
  for config, seed in (('t1', 5), ('topp', 6)):
    out = acc.run_speculative(drafter, acc.CONFIGS[config], 3, prompt=acc.NGRAM_PROMPT,
                              seed=seed)
    p_value, impossible = acc.check_exact(out.new_tokens, acc.CONFIGS[config])
    assert impossible == 0 and p_value > acc.P_VALUE_OK, (config, p_value)
    rate = np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)
    assert 0.03 < rate < 0.95, rate


def test_distribution_test_rejects_a_hybrid_that_keeps_the_network_q_for_lookup_drafts(
    monkeypatch):
  """The mistake the one-hot q prevents: lookup drafts verified against the network's
  q, as if the network had drawn them."""
  monkeypatch.setattr(hybrid, '_lookup_q', lambda draft_BxG, network_q_BxGxV: network_q_BxGxV)
  p_value, _ = _sample_toy(_toy_hybrid(), seed=3)
  assert p_value < acc.P_VALUE_WRONG, p_value


# ------------------------------------------------------------------ bad input

def test_a_bad_fallback_is_refused():
  with pytest.raises(ValueError, match="drafter is 'ngram'.*eagle, medusa, draft_model"):
    hybrid.Settings(drafter='ngram')
  with pytest.raises(ValueError, match='config.hybrid.drafter'):
    make_drafter('hybrid', target=TARGET, settings={'drafter': 'ngram'})
  with pytest.raises(ValueError, match='config.hybrid.min_n / max_n'):
    make_drafter('hybrid', target=TARGET, settings={'max_n': 0})
  with pytest.raises(ValueError, match="config.hybrid.choose is 'best'; one of lookup, history"):
    make_drafter('hybrid', target=TARGET, settings={'choose': 'best'})
  with pytest.raises(ValueError, match='draft model checkpoint'):
    make_drafter('hybrid', target=TARGET, settings={'drafter': 'draft_model'})


def _experiment(**overrides):
  import importlib.util   # configs/gemma.py is a file, not a module
  spec = importlib.util.spec_from_file_location('gemma_config', 'configs/gemma.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.update(overrides)
  return ExperimentConfig.from_config(config)


def test_experiment_config_checks_the_fallback(tmp_path):
  with pytest.raises(ConfigError, match='config.hybrid.drafter'):
    _experiment(drafters=('hybrid',), hybrid=dict(drafter='ngram'),
                output_dir=str(tmp_path))
  with pytest.raises(ConfigError, match="config.draft_model.checkpoint must name a checkpoint"):
    _experiment(drafters=('hybrid',), hybrid=dict(drafter='draft_model'),
                output_dir=str(tmp_path))
  with pytest.raises(ConfigError, match='config.eagle.checkpoint must name trained weights'):
    _experiment(drafters=('hybrid',), eagle=dict(checkpoint=''), output_dir=str(tmp_path))
  with pytest.raises(ConfigError, match=r'drafter\(s\) hybrid draft chains only'):
    _experiment(drafters=('hybrid',), hybrid=dict(drafter='layer_skip'), tree='eagle-25',
                output_dir=str(tmp_path))
  config = _experiment(drafters=('hybrid',), output_dir=str(tmp_path))
  assert config.networks == ('hybrid', 'eagle')
  distilled = _experiment(drafters=('hybrid',), hybrid=dict(drafter='draft_model'),
                          draft_model=dict(checkpoint='embedded'), output_dir=str(tmp_path))
  assert distilled.networks == ('hybrid', 'draft_model')
  # A hybrid's rows depend on its fallback's settings.
  other = _experiment(drafters=('hybrid',), eagle=dict(checkpoint='embedded',
                                                       min_confidence=0.5),
                      output_dir=str(tmp_path))
  assert config.fingerprint('hybrid') != other.fingerprint('hybrid')
  assert config.fingerprint('ngram') == other.fingerprint('ngram')
