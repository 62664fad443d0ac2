"""Decoding methods as runners: one batch of token-id prompts in, tokens and time out.

The baseline is `specjax.decoding.autoregressive.generate`; each drafter runs
through `specjax.decoding.speculative.generate`. A runner also names the
compiled-program bucket a batch falls in, so the experiment can compile each
bucket once, in an untimed warm-up run of one token per row, before the
batches it times.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from specjax import drafters
from absl import logging

from specjax.decoding import autoregressive
from specjax.decoding import batch as batch_lib
from specjax.decoding import draft_length
from specjax.decoding import program
from specjax.decoding import speculative
from specjax.decoding import step_costs
from specjax.experiments import loading
from specjax.experiments import preflight
from specjax.experiments.config import BASELINE, ConfigError, ExperimentConfig


@dataclasses.dataclass
class BatchResult:
  new_tokens: list[list[int]]
  wall_s: float
  # Per row, the speculative counters: target_calls (the prefill included),
  # drafted_tokens, accepted_tokens, acceptance_by_position (acceptances of
  # draft position i); empty for the baseline.
  stats: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Runner:
  # (batch, warm_up=False) -> its result; warm_up compiles and generates one token per row
  run: Callable[..., BatchResult]
  # (prompts, row_ids, run_longest) -> the batch to run, its cache sized for the run's
  # longest prompt too (`batch.pack`)
  pack: Callable[..., batch_lib.PromptBatch]


def make_runner(method: str, model, params, config: ExperimentConfig,
                eos_ids: Sequence[int]) -> Runner:
  if method == BASELINE:
    return _autoregressive(model, params, config, eos_ids)
  return _speculative(method, model, params, config, eos_ids)


def _packer(model, config: ExperimentConfig, extra_slots: int):
  """Packs a batch once: its shapes select the compiled program, and the runner
  runs the same PromptBatch."""
  def pack(prompts, row_ids=None, run_longest=0):
    return program.pack(model, prompts, max_new_tokens=config.max_new_tokens,
                        extra_slots=extra_slots, row_ids=row_ids,
                        max_cache_len=config.max_cache_len, run_longest=run_longest,
                        min_prefill=batch_lib.PREFILL_MIN)
  return pack


def _autoregressive(model, params, config: ExperimentConfig, eos_ids) -> Runner:
  def run(packed, warm_up=False):
    out = autoregressive.generate(
        model, params, packed, max_new_tokens=config.max_new_tokens, sampling=config.sampling,
        eos_ids=eos_ids, seed=config.seed, warm_up=warm_up)
    return BatchResult(out.new_tokens, out.wall_s, [{} for _ in out.new_tokens])
  return Runner(run, _packer(model, config, preflight.verify_slots(config, BASELINE)))


def _speculative(name, model, params, config: ExperimentConfig, eos_ids) -> Runner:
  network = config.network_of(name)   # the hybrid's fallback, else name
  trained = (loading.load_trained_drafter(config, model, network)
             if network in drafters.TRAINED_DRAFTERS else None)
  if network == 'medusa':
    _check_medusa_depth(config, trained[0])
  drafter = drafters.make_drafter(
      name, target=model, settings=config.drafter_settings(name),
      draft_model=(loading.load_draft_model(config, model, params)
                   if network == 'draft_model' else None),
      trained=trained,
      fallback_settings=config.drafter_settings(network) if network != name else None,
      target_params=params)  # the tokenizer was checked against a draft vocabulary in preflight
  policy_for = functools.cache(functools.partial(_policy, model, params, config, drafter))

  def run(packed, warm_up=False):
    tree = config.token_tree
    out = speculative.generate(
        model, params, drafter, packed, gamma=config.loop_gamma,
        max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_ids=eos_ids,
        seed=config.seed, tree=tree, warm_up=warm_up,
        policy=None if tree is not None else policy_for(packed.tokens_BxS.shape))
    stats = [dict(gamma=config.loop_gamma, target_calls=out.target_calls[i],
                  plain_calls=out.plain_calls[i], drafted_tokens=out.drafted_tokens[i],
                  accepted_tokens=out.accepted_tokens[i],
                  acceptance_by_position=out.accepted_at_position[i],
                  **({'tree': str(tree)} if tree is not None else {}))
             for i in range(len(out.new_tokens))]
    return BatchResult(out.new_tokens, out.wall_s, stats)
  return Runner(run, _packer(model, config, preflight.verify_slots(config, name)))


def _check_medusa_depth(config: ExperimentConfig, heads) -> None:
  """Head k drafts the k-th token ahead, so K heads draft at most K per call: say so
  before any run starts, not when the loop is traced."""
  num_heads = len(heads['w_KxDxD'])
  if config.loop_gamma > num_heads:
    fix = (f'the tree {config.tree!r} is {config.loop_gamma} deep: give a tree at most '
           f'{num_heads} deep' if config.tree else
           f'gamma is {config.loop_gamma}: give --config.gamma={num_heads} (or fewer)')
    raise ConfigError(f'the medusa checkpoint {config.medusa["checkpoint"]!r} has {num_heads} '
                      f'heads, so it drafts at most {num_heads} tokens per call, but {fix}')


def _policy(model, params, config: ExperimentConfig, drafter, shape_BxS: tuple[int, int]
            ) -> draft_length.Policy:
  """The draft-length policy for one batch shape: costs measured on this device at
  this batch size and cache length (drafting included for a drafter whose drafts
  are costly) unless the config gives them."""
  settings = config.draft_length
  if not settings.get('adaptive', True):
    return draft_length.fixed(config.gamma)
  buckets = tuple(settings.get('buckets', ())) or draft_length.default_buckets(config.gamma)
  costs, draft_costs = tuple(settings.get('costs', ())), ()
  if not costs:
    batch, num_slots = shape_BxS
    costs, draft_costs = step_costs.measure_parts(model, params, buckets, batch=batch,
                                                  num_slots=num_slots, drafter=drafter,
                                                  sampling=config.sampling)
    logging.info('%s step costs for batch %d, %d slots, drafts %s: %s%s', drafter.name, batch,
                 num_slots, buckets, ', '.join(f'{c:.2f}' for c in costs),
                 f' (drafting included: {", ".join(f"{d:.2f}" for d in draft_costs)})'
                 if drafter.costly_drafts else '')
  return speculative.make_policy(
      config.gamma, shape_BxS[0], buckets=buckets, costs=costs, draft_costs=draft_costs,
      finish_softness=settings.get('finish_softness', draft_length.Policy.finish_softness),
      outcome_samples=settings.get('outcome_samples', draft_length.Policy.outcome_samples),
      pool_rows=settings.get('pool_rows', draft_length.Policy.pool_rows))
