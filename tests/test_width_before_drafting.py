"""A drafter whose drafts cost a network step drafts only the width the policy chose.

Under the adaptive draft length, `speculative._step` chooses the call's width
from acceptance history before such a drafter proposes, and a plain step
drafts nothing; a free drafter (n-gram) drafts gamma first and the width
follows its evidence. A spy records, on the host, the width of every
`propose` that actually ran inside the compiled loop (`jax.debug.callback`
runs only in the branch the step takes).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from specjax import sampling as sampling_lib
from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.decoding import step_costs
from specjax.drafters import eagle
from specjax.drafters import medusa

import test_eagle
import test_medusa
from test_speculative import MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS
from test_speculative import eos_id, greedy_reference
from test_speculative import DRAFTERS as _DRAFTERS

DRAFTERS = dict(_DRAFTERS,
                eagle=eagle.make(TARGET, test_eagle.NET, test_eagle.LAYERS,
                                 target_params=TARGET_PARAMS),
                medusa=medusa.make(TARGET, test_medusa.HEADS, target_params=TARGET_PARAMS))
COSTLY = ['draft_model', 'early_exit', 'self_draft', 'eagle', 'medusa']
GAMMA = 3
BUCKETS = draft_length.default_buckets(GAMMA)   # (0, 2, 3)


def spying(drafter, widths: list, **changes):
  """The drafter, each propose that runs appending its width to `widths`."""
  def propose(*, gamma, **kwargs):
    jax.debug.callback(lambda: widths.append(gamma))
    return drafter.propose(gamma=gamma, **kwargs)
  return dataclasses.replace(drafter, propose=propose, **changes)


def generate(drafter, prompts, costs):
  return speculative.generate(PADDED, TARGET_PARAMS, drafter, prompts, gamma=GAMMA,
                              max_new_tokens=MAX_NEW, eos_ids=(eos_id(),),
                              policy=draft_length.Policy(BUCKETS, costs))


@pytest.mark.parametrize('name', COSTLY)
def test_the_costly_drafters_declare_it(name):
  assert DRAFTERS[name].costly_drafts
  assert not DRAFTERS['ngram'].costly_drafts


@pytest.mark.parametrize('name', COSTLY)
def test_when_drafting_never_pays_nothing_is_drafted(name):
  widths = []
  out = generate(spying(DRAFTERS[name], widths), PROMPTS, costs=(1.0, 100.0, 100.0))
  assert out.new_tokens == greedy_reference()
  assert widths == []
  assert out.plain_calls == [c - 1 for c in out.target_calls]
  if name != 'early_exit':
    return
  # The control, for one drafter (the spy is the same for all): declared free, it
  # drafts gamma at every step and only then takes the plain step its evidence
  # does not pay for, and the spy sees every one of those drafts.
  free = []
  out = generate(spying(DRAFTERS[name], free, costly_drafts=False), PROMPTS,
                 costs=(1.0, 100.0, 100.0))
  assert out.new_tokens == greedy_reference()
  assert free == [GAMMA] * out.steps


@pytest.mark.parametrize('name', COSTLY)
def test_only_the_chosen_width_is_drafted(name):
  """Costs under which the width follows each row's acceptance history (drafting
  pays at the prior's acceptance 0.5 and not much below): every proposal has a
  bucket's width, one per call that verified drafts, and none in a plain step."""
  costs = (1.0, 1.7, 1.8)
  mixed = False
  widths = []
  spy = spying(DRAFTERS[name], widths)   # one drafter: one compiled program for every prompt
  for i, prompt in enumerate(PROMPTS):
    widths.clear()
    out = generate(spy, [prompt], costs)
    assert out.new_tokens == [greedy_reference()[i]]
    assert set(widths) <= set(BUCKETS[1:])
    assert len(widths) == out.target_calls[0] - 1 - out.plain_calls[0]
    assert out.drafted_tokens[0] <= sum(widths)
    mixed |= bool(widths) and out.plain_calls[0] > 0
    if name == 'self_draft':   # the target drafting for itself is always right: it always
      # drafts, gamma until fewer than gamma + 1 tokens are left to commit
      assert out.plain_calls == [0] and widths[0] == GAMMA and set(widths) <= {2, GAMMA}
      assert all(w == GAMMA for w in widths[:-2]), widths
  if name != 'self_draft':
    assert mixed, 'no prompt mixed plain steps and drafting: the costs test nothing'
  out = generate(DRAFTERS[name], PROMPTS, costs)   # batch 4 of mixed lengths
  assert out.new_tokens == greedy_reference()


def test_a_steps_cost_holds_drafting_for_costly_drafters_only(monkeypatch):
  # A call over w positions takes w seconds, drafting g tokens 0.5 g.
  monkeypatch.setattr(step_costs, '_best_of', lambda runs: {
      (kind, n): n if kind == 'call' else 0.5 * n for kind, n in runs})
  measure = lambda drafter: step_costs.measure(TARGET, TARGET_PARAMS, BUCKETS, batch=1,  # noqa: E731
                                               num_slots=64, drafter=drafter)
  assert measure(DRAFTERS['early_exit']) == (1.0, 3.0 + 1.0, 4.0 + 1.5)
  assert measure(DRAFTERS['ngram']) == (1.0, 3.0, 4.0)
  assert measure(None) == (1.0, 3.0, 4.0)
  parts = lambda drafter: step_costs.measure_parts(  # noqa: E731
      TARGET, TARGET_PARAMS, BUCKETS, batch=1, num_slots=64, drafter=drafter)
  assert parts(DRAFTERS['early_exit']) == ((1.0, 4.0, 5.5), (0.0, 1.0, 1.5))
  assert parts(DRAFTERS['ngram']) == ((1.0, 3.0, 4.0), (0.0, 0.0, 0.0))


def test_every_program_is_timed_once_per_round_and_its_best_round_kept(monkeypatch):
  """A slow spell of the machine must fall on every width alike: programs are
  compiled first, then timed in rounds that run each of them once, in turn."""
  clock, calls = [0.0], []

  class Run:
    def __init__(self, key, seconds):
      self.key, self.seconds = key, list(seconds)

    def __call__(self):
      calls.append(self.key)
      clock[0] += self.seconds.pop(0)
      return jnp.zeros(())

  monkeypatch.setattr(step_costs.time, 'perf_counter', lambda: clock[0])
  runs = {'a': Run('a', [9, 4, 2, 3]), 'b': Run('b', [9, 8, 6, 7])}
  best = step_costs._best_of(runs)  # pylint: disable=protected-access
  assert calls == ['a', 'b'] + ['a', 'b'] * step_costs._REPEATS  # pylint: disable=protected-access
  steps = step_costs._STEPS  # pylint: disable=protected-access
  assert best == {'a': 2 / steps, 'b': 6 / steps}


@pytest.mark.parametrize('name', COSTLY)
def test_drafting_is_timed_from_a_state_init_made(name):
  seconds = step_costs.seconds_per_draft(DRAFTERS[name], TARGET, TARGET_PARAMS, 2, batch=2,
                                         num_slots=32)
  assert 0 < seconds < 10 and math.isfinite(seconds)


@pytest.mark.parametrize('name', [None] + COSTLY)
def test_timed_programs_run_on_one_donated_carry_as_the_loop_does(name):
  """Each timed run donates its cache (and drafter state) to the next: a cache made inside
  the timed program pays fresh pages every run, and a few ms of them beside 4 calls made a
  wide call look cheaper than a decode step's multiple it is."""
  if name is None:
    program = step_costs._call_run(TARGET, TARGET_PARAMS, 3, batch=2, num_slots=32,  # pylint: disable=protected-access
                                   greedy=True)
  else:
    program = step_costs._draft_run(DRAFTERS[name], TARGET, TARGET_PARAMS, 2, batch=2,  # pylint: disable=protected-access
                                    num_slots=32, sampling=sampling_lib.SamplingConfig())
  program().block_until_ready()
  held = jax.tree.leaves(program.carry)
  assert held
  if name is None:   # the cache, and the tokens the last call predicted (the next call's input)
    assert program.carry[1].shape == (2, 3) and program.carry[1].dtype == jnp.int32
  program().block_until_ready()
  assert all(x.is_deleted() for x in held)
  assert not any(x.is_deleted() for x in jax.tree.leaves(program.carry))
