r"""Three paper tables for Gemma 3 270M, one sweep each, on Spec-Bench-format prompts.

The base is configs/gemma.py with the settings the tables share: raw text (the
embedded 270M is a base model), the first 2 prompts of each task, 64 new
tokens, a fixed draft length (Leviathan et al.'s and Chen et al.'s tables are
per gamma). Give the question file with --config.prompts (the built-in set has
one prompt per Spec-Bench task and works too). Each sweep, then its report:

  python -m specjax.sweep --config=configs/paper_tables.py:leviathan \
      --config.prompts=/path/to/spec_bench/question.jsonl
  python -m specjax.report results/paper_tables-leviathan-sweep --cost_ratio=ngram=0

  :leviathan   Leviathan et al. 2023, Table 2: every training-free drafter
               (ngram, early_exit, layer_skip) at gamma 2 and 4, temperature 0
               and 1 (pass the drafters' measured c with --cost_ratio to get
               the predicted column).
  :spec_bench  The Spec-Bench leaderboard: every drafter, greedy, gamma 4, the
               adaptive draft length specjax runs by default.
  :chen        Chen et al. 2023, Table 1: ms/token of autoregressive and
               speculative sampling, greedy and nucleus (T = 1, top-p 0.8).

`drafters=ngram` (or `ngram+early_exit`, ...) after the table narrows its drafters, and
`gamma=4` the Leviathan table's gammas.

A cell per (drafter, gamma, sampling); the baseline is shared by the cells of
one sampling setting. Output: results/paper_tables-<table>-sweep.
"""

import importlib.util
import os

_GEMMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'gemma.py')
_spec = importlib.util.spec_from_file_location('specjax_gemma_config', _GEMMA)
gemma = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemma)

TABLES = ('leviathan', 'spec_bench', 'chen')
# The default drafters: those that need nothing but the target. draft_model and
# medusa need a checkpoint: `:table,medusa.checkpoint=...` adds one to every table.
TRAINING_FREE = ('ngram', 'early_exit', 'layer_skip')
NUCLEUS = dict(temperature=1.0, top_p=0.8)


def _split(arg):
  table, _, rest = (arg or '').partition(',')
  if table not in TABLES:
    raise ValueError(f'configs/paper_tables.py needs a table: one of {", ".join(TABLES)} '
                     f"(e.g. --config=configs/paper_tables.py:leviathan), got {table!r}")
  return table, rest


def get_config(arg=None):
  table, rest = _split(arg)
  c = gemma.get_config(rest or None)
  overrides = dict(chat_template=False, per_category=2, max_new_tokens=64,
                   drafters=TRAINING_FREE, output_dir=f'results/paper_tables-{table}')
  if table != 'spec_bench':
    overrides['draft_length'] = dict(c.draft_length, adaptive=False)
  for key, value in gemma.parse_arg(rest, c).items():  # the arg's own keys win
    overrides.pop(key, None)
  c.update(overrides)
  return c


def get_sweep(arg=None):
  table, _ = _split(arg)
  config = get_config(arg)
  drafters = list(config.drafters)   # `:leviathan,drafters=ngram` narrows a table
  for name in ('draft_model', 'medusa'):
    if config[name].checkpoint and name not in drafters:
      drafters.append(name)
  cells = []
  gammas = (2, 4)
  if 'gamma' in gemma.parse_arg(_split(arg)[1], gemma.get_config()):
    gammas = (config.gamma,)   # `:leviathan,gamma=4` runs one gamma
  if table == 'leviathan':
    for temperature in (0.0, 1.0):
      for name in drafters:
        for gamma in gammas:
          cells.append(dict(drafters=(name,), gamma=gamma, temperature=temperature))
  elif table == 'spec_bench':
    cells = [dict(drafters=(name,), gamma=4) for name in drafters]
  else:
    for sampling in (dict(temperature=0.0), NUCLEUS):
      cells += [dict(drafters=(name,), gamma=4, **sampling) for name in drafters]
  return cells
