"""The embedded Gemma 3 270M as the product serves it (its int8 forms), its tokenizer,
its shipped EAGLE drafter and the Spec-Bench prompts: what the loop benchmarks time;
and how they time it (interleaved rounds against autoregressive decoding)."""

from __future__ import annotations

import collections
import os
import sys

import jax
import numpy as np

from specjax import checkpoints
from specjax import compile_cache
from specjax.checkpoints import drafter_io
from specjax.checkpoints import embedded
from specjax.decoding import draft_length
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

TARGET = 'embedded:gemma3-270m'
SPEC_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared',
                          'data', 'spec_bench_question.jsonl')
# Drafting priced out: every step is plain (buckets 0, 2, 4; a call of drafts at 50+ decode
# steps), so a loop carries its drafter and never drafts.
PRICED_OUT = draft_length.Policy(buckets=(0, 2, 4), costs=(1.0, 50.0, 60.0))


def spec_bench_prompts(path: str):
  """The prompts of a Spec-Bench question file; exits with where to find it if absent."""
  if not os.path.exists(path):
    sys.exit(f'Spec-Bench prompts not found at {path} (see ../shared/data/README.md)')
  return prompts_lib.load_prompts(path)


def first_of_each_task(path: str, tasks: int):
  """The first prompt of each of the first `tasks` Spec-Bench tasks, in file order."""
  first = {}
  for p in spec_bench_prompts(path):
    first.setdefault(p.category, p)
  return list(first.values())[:tasks]


def start(path: str, tasks: int):
  """What an interleaved benchmark starts from: the compile cache on, the CPU printed,
  the served target, and the first prompt of each of `tasks` tasks, tokenized as one-row
  batches. Returns (prompts, model, params, token ids)."""
  compile_cache.enable()
  print(cpu_info.describe())
  chosen = first_of_each_task(path, tasks)
  model, params, tokenizer = target()
  return chosen, model, params, [[tokenizer.encode(p.text, add_bos=True)] for p in chosen]


def target() -> tuple[LanguageModel, dict, Tokenizer]:
  """(model, params with their int8 forms on the device, tokenizer)."""
  config, params = checkpoints.load_checkpoint(TARGET)
  params = jax.device_put(q8_weights.with_q8_weights(params))
  return LanguageModel(config), params, Tokenizer.from_gguf(embedded.default_gguf_path())


def shipped_eagle(model: LanguageModel, checkpoint: str = 'embedded'):
  """An EAGLE drafter's (weights, vocabulary ids, manifest), checked against the target: the
  shipped one, or a directory `specjax.train` wrote."""
  signature = drafter_io.target_signature(model.config, checkpoints.content_digest(TARGET))
  return drafter_io.load_drafter(checkpoint, 'eagle', target=signature)


def interleaved(runs: dict, repeats: int) -> tuple[dict, dict]:
  """Each run (name -> () -> (seconds, or an array of them, outputs, anything)) once
  untimed, which compiles it; exits if its outputs differ from those of the run named
  'autoregressive'; then `repeats` rounds that time every run once, in turn, so that a
  slow spell of the machine falls on all of them alike. Returns (first results, each
  run's seconds per round)."""
  first = {name: run() for name, run in runs.items()}
  for name, (_, outputs, _) in first.items():
    if outputs != first['autoregressive'][1]:
      sys.exit(f'{name}: the output differs from autoregressive decoding')
  seconds = collections.defaultdict(list)
  for _ in range(repeats):
    for name, run in runs.items():
      seconds[name].append(run()[0])
  return first, seconds


def over_autoregressive(seconds: dict, name: str) -> tuple[float, float]:
  """(median, fastest) of a run's times over autoregressive decoding's."""
  base, mine = seconds['autoregressive'], seconds[name]
  return float(np.median(mine) / np.median(base)), min(mine) / min(base)
