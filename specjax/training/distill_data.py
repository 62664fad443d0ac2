"""Self-distillation data: the target's own generations, written in resumable shards.

A drafter is trained to predict what the target will say, so its data is the
target's text. No corpus is downloaded and nothing comes from Spec-Bench: each
sequence starts from BOS, its first `start_tokens` are sampled from the target
at temperature 1 (so sequences differ; `start_top_p` < 1 keeps them to the
nucleus, where a 270M model's tail would start rows in a jumble of scripts),
and the rest is the target's greedy
continuation (what greedy verification accepts) or, for a share
`sampled_fraction` of the shards, its sampled continuation at temperature 1
(what sampled verification accepts). A share `prompted_fraction` of the rows
starts from a raw-text prompt instead of BOS alone (`prompts`: 'calibration' is
specjax/prompts/calibration.jsonl, hand-written starts of code, news, dialogue,
questions, maths and translation; 'instructions' is instructions.jsonl, hand-written
requests and questions; none from Spec-Bench), so the data holds the kinds of text
the target is asked to continue, not only what it writes unprompted; each row's
`starts_N` is the first position the target wrote, and the objectives score only
tokens the target wrote.

Shard i is fully determined by (seed, i): rerunning a killed generation skips
finished shards and writes the missing ones, so the data never holds a
duplicate or a gap. A shard is `shard_00000.npz` (tokens_NxL int32, lengths_N, starts_N)
plus `shard_00000.json` (its provenance), each written to a temporary name and
renamed, the JSON last: a shard counts as finished only when both exist.
Features are not stored: they depend on which layers a drafter reads, and the
trainer computes them in one teacher-forced target pass per run (minutes for
this data on 2 CPU cores), holding them in memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

from absl import logging
import numpy as np

from specjax import sampling as sampling_lib
from specjax.decoding import autoregressive
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How a data directory was made; stored in every shard's provenance."""

  target: str                 # the checkpoint name or path, for people
  target_sha256: str          # what the data is tied to
  num_shards: int
  sequences_per_shard: int
  seq_len: int                # tokens per sequence, BOS and start included
  start_tokens: int = 8       # sampled at temperature 1 after BOS
  sampled_fraction: float = 0.25  # share of shards whose continuation is sampled
  seed: int = 0
  bos_id: int = 2
  eos_ids: tuple[int, ...] = (1, 106)   # Gemma's <eos> and <end_of_turn>: a sequence ends there
  prompts: str = ''           # '' (BOS only) or a prompt set: 'calibration', 'instructions'
                              # (specjax/prompts/<name>.jsonl)
  prompts_sha256: str = ''    # of the prompts file, filled in by whoever tokenizes it
  prompted_fraction: float = 0.0  # share of rows that start from a prompt
  start_top_p: float = 1.0    # nucleus of the sampled starts (1: the whole distribution)

  def __post_init__(self):
    for name in ('num_shards', 'sequences_per_shard'):
      if getattr(self, name) < 1:
        raise ValueError(f'data.{name} must be >= 1, got {getattr(self, name)}')
    if not 2 <= self.start_tokens + 1 < self.seq_len:
      raise ValueError(f'data.start_tokens ({self.start_tokens}) + BOS must leave room in '
                       f'data.seq_len ({self.seq_len})')
    if not 0.0 <= self.sampled_fraction <= 1.0:
      raise ValueError(f'data.sampled_fraction must be in [0, 1], got {self.sampled_fraction}')
    if not 0.0 < self.start_top_p <= 1.0:
      raise ValueError(f'data.start_top_p must be in (0, 1], got {self.start_top_p}')
    if not 0.0 <= self.prompted_fraction <= 1.0:
      raise ValueError(f'data.prompted_fraction must be in [0, 1], got {self.prompted_fraction}')
    if self.prompts not in ('', *PROMPT_SETS):
      raise ValueError(f"data.prompts is {self.prompts!r}; known: '' (BOS only), "
                       f"{', '.join(PROMPT_SETS)}")
    if self.prompted_fraction > 0 and not self.prompts:
      raise ValueError(f'data.prompted_fraction is {self.prompted_fraction}, so data.prompts must '
                       f'name a prompt set ({", ".join(PROMPT_SETS)}), got {self.prompts!r}')

  def is_sampled(self, shard: int) -> bool:
    """Shards are greedy or sampled by a fixed interleaving, so any prefix of the
    shards keeps roughly the mix."""
    return int((shard + 1) * self.sampled_fraction) > int(shard * self.sampled_fraction)

  def prompt_of(self, row: int, num_prompts: int) -> int | None:
    """Which prompt global row `row` starts from (None: BOS alone). Rows are
    prompted by a fixed interleaving inside every shard, and prompted rows take
    the prompts in turn, so every shard, greedy or sampled, holds both kinds."""
    f = self.prompted_fraction
    if int((row + 1) * f) == int(row * f):
      return None
    return int(row * f) % num_prompts


PROMPT_SETS = tuple(prompts_lib.PROMPT_SETS)
NEW_FIELDS = {'prompts': '', 'prompts_sha256': '', 'prompted_fraction': 0.0,
              'start_top_p': 1.0}  # absent from recipes written before they existed


class Sequences(NamedTuple):
  """Loaded data: the token rows, each row's length, and the first position the
  target wrote (1 after BOS alone, 1 + the prompt's length after a prompt)."""

  tokens_NxL: np.ndarray
  lengths_N: np.ndarray
  starts_N: np.ndarray


def shard_paths(directory: str, shard: int) -> tuple[str, str]:
  stem = os.path.join(directory, f'shard_{shard:05d}')
  return stem + '.npz', stem + '.json'


def is_finished(directory: str, shard: int) -> bool:
  data, meta = shard_paths(directory, shard)
  return os.path.isfile(data) and os.path.isfile(meta)


def _atomic_write(path: str, write) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'wb') as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def make_shard(model, params, recipe: Recipe, shard: int,
               prompt_ids: Sequence[Sequence[int]] = ()) -> Sequences:
  """The shard's rows: BOS (and a prompt, for prompted rows), sampled starts, then
  the continuation. `prompt_ids` are the prompt set's token ids, without BOS."""
  n = recipe.sequences_per_shard
  row_ids = [shard * n + i for i in range(n)]
  heads = []
  for row in row_ids:
    which = recipe.prompt_of(row, len(prompt_ids)) if prompt_ids else None
    heads.append([recipe.bos_id] + ([] if which is None else list(prompt_ids[which])))
  longest = max(len(h) for h in heads)
  if longest + recipe.start_tokens >= recipe.seq_len:
    raise ValueError(f'a prompt of {longest - 1} tokens and data.start_tokens '
                     f'({recipe.start_tokens}) leave no room in data.seq_len ({recipe.seq_len})')
  t1 = sampling_lib.SamplingConfig(temperature=1.0)
  seed = recipe.seed * 1_000_003 + shard
  starts = autoregressive.generate(
      model, params, heads, max_new_tokens=recipe.start_tokens,
      sampling=dataclasses.replace(t1, top_p=recipe.start_top_p), seed=seed, row_ids=row_ids)
  prompts = [h + list(s) for h, s in zip(heads, starts.new_tokens)]
  # The budget is the BOS-only rows'; a prompted row's surplus is cut at seq_len.
  rest = recipe.seq_len - 1 - recipe.start_tokens
  sampling = t1 if recipe.is_sampled(shard) else sampling_lib.SamplingConfig()
  out = autoregressive.generate(model, params, prompts, max_new_tokens=rest, sampling=sampling,
                                seed=seed + 1, row_ids=row_ids, eos_ids=recipe.eos_ids)
  tokens_NxL = np.zeros((n, recipe.seq_len), np.int32)
  lengths_N = np.zeros((n,), np.int32)
  for i, (prompt, new) in enumerate(zip(prompts, out.new_tokens)):
    seq = (prompt + list(new))[:recipe.seq_len]
    tokens_NxL[i, :len(seq)] = seq
    lengths_N[i] = len(seq)
  return Sequences(tokens_NxL, lengths_N, np.asarray([len(h) for h in heads], np.int32))


def generate(model, params, recipe: Recipe, directory: str,
             prompt_ids: Sequence[Sequence[int]] = ()) -> list[int]:
  """Writes every missing shard of `recipe` into `directory`; returns the shards written.

  A directory made by another recipe is refused (mixing would silently change
  what the drafter learns).
  """
  os.makedirs(directory, exist_ok=True)
  recipe_path = os.path.join(directory, 'recipe.json')
  wanted = json.loads(json.dumps({'format_version': FORMAT_VERSION,
                                   **dataclasses.asdict(recipe)}))
  if recipe.prompted_fraction > 0 and not prompt_ids:
    raise ValueError(f'data.prompted_fraction is {recipe.prompted_fraction} but no prompt '
                     'was given')
  if os.path.exists(recipe_path):
    with open(recipe_path, encoding='utf-8') as f:
      found = {**NEW_FIELDS, **json.load(f)}
    if found != wanted:
      changed = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
      raise ValueError(f'{directory} holds data of another recipe (differs in '
                       f'{", ".join(changed)}): use a new data directory or the same settings')
  else:
    _atomic_write(recipe_path, lambda f: f.write(json.dumps(wanted, indent=1).encode()))
  todo = [s for s in range(recipe.num_shards) if not is_finished(directory, s)]
  if len(todo) < recipe.num_shards:
    logging.info('data: %d of %d shards already in %s', recipe.num_shards - len(todo),
                 recipe.num_shards, directory)
  start = time.monotonic()
  for done, shard in enumerate(todo, start=1):
    rows = make_shard(model, params, recipe, shard, prompt_ids)
    data_path, meta_path = shard_paths(directory, shard)
    _atomic_write(data_path, lambda f: np.savez(f, **rows._asdict()))
    meta = {'shard': shard, 'sampled': recipe.is_sampled(shard),
            'tokens': int(rows.lengths_N.sum()),
            'prompted_rows': int((rows.starts_N > 1).sum()),
            # the target as served (int8 blocks, trainer.generation_params) or float32 only
            'int8_forms': q8_weights.HEAD_FORM in params, 'recipe': wanted}
    _atomic_write(meta_path, lambda f: f.write(json.dumps(meta).encode()))
    spent = time.monotonic() - start
    logging.info('data: shard %d written (%d of %d this run, %.0f s spent, ~%.0f s left)',
                 shard, done, len(todo), spent, spent / done * (len(todo) - done))
  return todo


def load(directory: str, shards: Sequence[int] | None = None) -> Sequences:
  """The rows of the finished shards (all, or those named), in order."""
  with open(os.path.join(directory, 'recipe.json'), encoding='utf-8') as f:
    recipe = json.load(f)
  shards = range(recipe['num_shards']) if shards is None else shards
  parts = []
  for shard in shards:
    if not is_finished(directory, shard):
      raise ValueError(f'{directory}: shard {shard} is missing; rerun the data generation')
    data_path, _ = shard_paths(directory, shard)
    try:
      with np.load(data_path) as data:
        lengths_N = data['lengths_N']
        # Shards written before prompts existed start every row after BOS.
        starts_N = data['starts_N'] if 'starts_N' in data else np.ones_like(lengths_N)
        parts.append(Sequences(data['tokens_NxL'], lengths_N, starts_N))
    except (OSError, ValueError, KeyError) as e:
      raise ValueError(f'{data_path}: corrupt shard ({e}); delete it and rerun the data '
                       'generation') from None
  return Sequences(*(np.concatenate(column) for column in zip(*parts)))
