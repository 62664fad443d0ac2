"""Decoding methods as runners: one batch of token-id prompts in, tokens and time out.

The baseline is `specjax.decoding.autoregressive.generate`; each drafter runs
through `specjax.decoding.speculative.generate`. A runner also names the
compiled-program bucket a batch falls in, so the experiment can compile each
bucket once, untimed, before the batches it times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from specjax import drafters
from specjax.decoding import autoregressive
from specjax.decoding import batch as batch_lib
from specjax.decoding import speculative
from specjax.experiments import loading
from specjax.experiments import preflight
from specjax.experiments.config import BASELINE, ExperimentConfig


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
  run: Callable[[Sequence[Sequence[int]], Sequence[int]], BatchResult]   # (prompts, row_ids)
  bucket: Callable[[Sequence[Sequence[int]]], tuple]                     # prompts -> shape key


def make_runner(method: str, model, params, config: ExperimentConfig,
                eos_ids: Sequence[int]) -> Runner:
  if method == BASELINE:
    return _autoregressive(model, params, config, eos_ids)
  return _speculative(method, model, params, config, eos_ids)


def _bucket_fn(model, config: ExperimentConfig, extra_slots: int):
  """The shapes `batch.pack` gives a batch: they select the compiled program."""
  max_slots = min(config.max_cache_len, model.config.max_position)

  def bucket(prompts):
    packed = batch_lib.pack(prompts, max_new_tokens=config.max_new_tokens,
                            extra_slots=extra_slots, max_slots=max_slots,
                            rows_multiple=model.data_parallelism)
    return packed.tokens_BxS.shape, packed.prefill_len
  return bucket


def _autoregressive(model, params, config: ExperimentConfig, eos_ids) -> Runner:
  def run(prompts, row_ids):
    out = autoregressive.generate(
        model, params, prompts, max_new_tokens=config.max_new_tokens, sampling=config.sampling,
        eos_ids=eos_ids, seed=config.seed, row_ids=row_ids, max_cache_len=config.max_cache_len)
    return BatchResult(out.new_tokens, out.wall_s, [{} for _ in prompts])
  return Runner(run, _bucket_fn(model, config, preflight.verify_slots(config, BASELINE)))


def _speculative(name, model, params, config: ExperimentConfig, eos_ids) -> Runner:
  drafter = drafters.make_drafter(
      name, target=model, ngram_max=config.ngram_max, ngram_min=config.ngram_min,
      draft_model=loading.load_draft_model(config, model) if name == 'draft_model' else None,
      early_exit_layers=config.early_exit_layers)

  def run(prompts, row_ids):
    out = speculative.generate(
        model, params, drafter, prompts, gamma=config.gamma,
        max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_ids=eos_ids,
        seed=config.seed, row_ids=row_ids, max_cache_len=config.max_cache_len)
    stats = [dict(gamma=config.gamma, target_calls=out.target_calls[i],
                  drafted_tokens=out.drafted_tokens[i], accepted_tokens=out.accepted_tokens[i],
                  acceptance_by_position=out.accepted_at_position[i])
             for i in range(len(prompts))]
    return BatchResult(out.new_tokens, out.wall_s, stats)
  return Runner(run, _bucket_fn(model, config, preflight.verify_slots(config, name)))
