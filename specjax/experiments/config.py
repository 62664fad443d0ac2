"""The experiment's settings as one frozen dataclass, checked once at the edge.

`configs/*.py` build an `ml_collections.ConfigDict`; nothing past
`ExperimentConfig.from_config` sees it. Every check raises a ConfigError (a
ValueError) that names the config key and its value, so a typo fails before a
model is loaded. Checks that need more than the values (devices, prompt
lengths) are in `preflight.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from specjax import drafters
from specjax.checkpoints import embedded
from specjax.decoding import draft_length
from specjax.decoding import tree as tree_lib
from specjax.sampling import SamplingConfig

DRAFTERS = drafters.DRAFTER_NAMES
BASELINE = 'autoregressive'
TINY_RANDOM = 'tiny-random'  # a random tiny model with a byte tokenizer, for tests only
EMBEDDED_PREFIX = 'embedded:'
EMBEDDED_MODELS = (embedded.EMBEDDED_NAME,)
TOO_LONG_CHOICES = ('error', 'skip')  # what to do with a prompt the KV cache cannot hold

# Keys that change what every method computes or how fast: rows written under
# other values of these cannot be reused.
SHARED_KEYS = ('model', 'tokenizer', 'prompts', 'max_new_tokens', 'temperature', 'top_k', 'top_p',
                'seed', 'batch_size', 'chat_template', 'max_cache_len', 'mesh_data', 'mesh_model')
# Every drafter's rows also depend on the loop's draft-length settings and on
# its own nested settings entry (named like the drafter).
_LOOP_KEYS = ('gamma', 'draft_length')
DRAFT_LENGTH_KEYS = {'adaptive': bool, 'buckets': tuple, 'costs': tuple, 'finish_softness': float,
                     'outcome_samples': int, 'pool_rows': bool}


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """One run; see configs/gemma.py for what each key means."""

  model: str
  tokenizer: str
  prompts: str
  limit: int
  per_category: int
  categories: tuple[str, ...]
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  batch_size: int
  output_dir: str
  resume: bool
  chat_template: bool | str     # True, False or 'auto': on when the checkpoint carries a template
  max_cache_len: int
  too_long: str
  mesh_data: int
  mesh_model: int
  drafters: tuple[str, ...]
  gamma: int
  draft_length: dict
  tree: str                     # '' = chains of gamma drafts; else a token tree (decoding/tree.py)
  ngram: dict
  draft_model: dict
  early_exit: dict
  layer_skip: dict
  medusa: dict
  eagle: dict
  hybrid: dict

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> ExperimentConfig:
    """From a ConfigDict or a plain dict holding every key of configs/gemma.py."""
    values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
      raise ConfigError(f'unknown config key(s) {", ".join(unknown)}; known: {", ".join(names)}')
    missing = [n for n in names if n not in values]
    if missing:
      raise ConfigError(f'config lacks key(s) {", ".join(missing)}; start from '
                       "configs/gemma.py's get_config()")
    for key in ('categories', 'drafters'):
      if isinstance(values[key], str):
        values[key] = (values[key],) if values[key] else ()
      values[key] = tuple(values[key])
    for key in ('draft_length',) + drafters.DRAFTER_NAMES:
      if hasattr(values[key], 'to_dict'):
        values[key] = values[key].to_dict()
    return cls(**values)

  def __post_init__(self):
    _check_types(self)
    for key in ('limit', 'per_category', 'top_k'):
      _check(getattr(self, key) >= 0, key, f'is {getattr(self, key)}: must be >= 0 (0 switches '
             'it off)')
    for key in ('max_new_tokens', 'batch_size', 'max_cache_len', 'mesh_data', 'mesh_model',
                'gamma'):
      _check(getattr(self, key) >= 1, key, f'is {getattr(self, key)}: must be >= 1')
    for name in drafters.DRAFTER_NAMES:  # every entry, so a typo fails even when unused
      try:
        drafters.settings_for(name, getattr(self, name))
      except ValueError as e:
        raise ConfigError(str(e)) from None
    self._check_draft_length()
    self._check_tree()
    try:
      self.sampling
    except ValueError as e:
      raise ConfigError(f'config: {e}') from None
    _check(self.output_dir != '', 'output_dir', "is '': must name a directory")
    _check(isinstance(self.chat_template, bool) or self.chat_template == 'auto', 'chat_template',
           f"is {self.chat_template!r}: must be True, False or 'auto'")
    _check(self.too_long in TOO_LONG_CHOICES, 'too_long',
           f'is {self.too_long!r}: must be one of {", ".join(TOO_LONG_CHOICES)}')
    _check(self.model == TINY_RANDOM or _is_checkpoint(self.model), 'model',
           f'is {self.model!r}: not {TINY_RANDOM!r}, not embedded:NAME and not an existing path')
    for key, value in (('model', self.model),
                       ('draft_model.checkpoint', self.draft_model.get('checkpoint', ''))):
      if value.startswith(EMBEDDED_PREFIX):
        _check(value in EMBEDDED_MODELS, key,
               f'names unknown embedded model {value!r}; known: {", ".join(EMBEDDED_MODELS)}')
    for key in ('tokenizer', 'prompts'):
      path = getattr(self, key)
      _check(not path or os.path.exists(path), key, f'is {path!r}, which does not exist')
    _check(not self.prompts or not os.path.isdir(self.prompts), 'prompts',
           f'is {self.prompts!r}, a directory: name a JSONL file')
    _check(not os.path.isdir(self.tokenizer)
           or os.path.isfile(os.path.join(self.tokenizer, 'tokenizer.model')), 'tokenizer',
           f'is {self.tokenizer!r}, a directory without a tokenizer.model: name a .gguf or '
           'tokenizer.model file')
    for name in self.drafters:
      _check(name in DRAFTERS, 'drafters',
             f'holds unknown drafter {name!r}; known: {", ".join(DRAFTERS)}')
    _check(len(set(self.drafters)) == len(self.drafters), 'drafters',
           f'is {self.drafters!r}: names a drafter twice')
    if 'hybrid' in self.drafters:
      try:
        drafters.settings_for('hybrid', self.hybrid)
      except ValueError as e:
        raise ConfigError(str(e)) from None
    from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
    if 'draft_model' in self.networks:   # a drafter, or the hybrid's fallback
      checkpoint = self.draft_model.get('checkpoint', '')
      _check(checkpoint != '', 'draft_model.checkpoint',
             "must name a checkpoint when drafters include 'draft_model' (or a hybrid "
             'falls back to it)')
      if checkpoint == 'embedded':   # the distilled drafter shipped for the embedded 270M
        where = drafter_io.resolve(checkpoint, 'distilled')
        _check(os.path.isfile(where / drafter_io.MANIFEST), 'draft_model.checkpoint',
               f"is 'embedded', but no distilled drafter is shipped ({where})")
      else:
        _check(_is_checkpoint(checkpoint), 'draft_model.checkpoint',
               f'is {checkpoint!r}: not embedded:NAME and not an existing path')
    for name in drafters.TRAINED_DRAFTERS:
      if name not in self.networks:
        continue
      checkpoint = getattr(self, name).get('checkpoint', '')
      _check(checkpoint != '', f'{name}.checkpoint',
             f"must name trained weights when drafters include {name!r} ('embedded' or a "
             'directory `python -m specjax.train` wrote)')
      where = drafter_io.resolve(checkpoint, name)
      _check(os.path.isfile(where / drafter_io.MANIFEST), f'{name}.checkpoint',
             f'is {checkpoint!r}, which holds no drafter.json ({where}): not a trained drafter '
             'directory' + (' (none is shipped for this kind)' if checkpoint == 'embedded'
                            else ''))

  def _check_draft_length(self):
    values = self.draft_length
    unknown = sorted(set(values) - set(DRAFT_LENGTH_KEYS))
    _check(not unknown, 'draft_length', f'has unknown setting(s) {", ".join(unknown)}; known: '
           f'{", ".join(DRAFT_LENGTH_KEYS)}')
    for key, kind in DRAFT_LENGTH_KEYS.items():
      value = values.get(key, kind())
      if kind is float:
        _check(isinstance(value, (int, float)) and not isinstance(value, bool),
               f'draft_length.{key}', f'must be a number, got {value!r}')
        continue
      _check(isinstance(value, (kind, list)) and (kind is bool) == isinstance(value, bool),
             f'draft_length.{key}',
             f'must be {"an" if kind is int else "a"} {kind.__name__}, got {value!r}')
    softness = values.get('finish_softness', draft_length.Policy.finish_softness)
    _check(softness > 0, 'draft_length.finish_softness',
           f'must be > 0 tokens (the smooth maximum over rows of remaining tokens), got {softness}')
    samples = values.get('outcome_samples', draft_length.Policy.outcome_samples)
    _check(isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0,
           'draft_length.outcome_samples',
           f'must be an int >= 0 (0: value a call at expected tokens), got {samples!r}')
    buckets = tuple(values.get('buckets', ()))
    costs = tuple(values.get('costs', ()))
    _check(all(isinstance(b, int) and 0 <= b <= self.gamma for b in buckets),
           'draft_length.buckets', f'must be draft counts in [0, gamma={self.gamma}], got {buckets}')
    _check(not buckets or (0 in buckets and self.gamma in buckets), 'draft_length.buckets',
           f'must include 0 (a plain step) and gamma={self.gamma}, got {buckets}')
    _check(not costs or len(costs) == len(buckets), 'draft_length.costs',
           'must be empty (measured) or one cost per bucket (set the buckets too)')

  def _check_tree(self):
    if not self.tree:
      return
    try:
      tree = self.token_tree
    except tree_lib.TreeError as e:
      raise ConfigError(f'config.tree is {self.tree!r}: {e}') from None
    chain_only = [d for d in self.drafters if d not in drafters.TREE_DRAFTERS
                  or self.network_of(d) not in drafters.TREE_DRAFTERS]
    _check(tree.is_chain or not chain_only, 'tree',
           f'is {self.tree!r}, a branching tree, but drafter(s) {", ".join(chain_only)} draft '
           f'chains only: give them a chain-<G> tree, or use {", ".join(drafters.TREE_DRAFTERS)}')

  @property
  def token_tree(self) -> tree_lib.Tree | None:
    """The static token tree every speculative step verifies, or None for chains."""
    return tree_lib.parse(self.tree) if self.tree else None

  @property
  def loop_gamma(self) -> int:
    """The drafts per call along a path: gamma, or with a tree its depth (gamma unused)."""
    tree = self.token_tree
    return self.gamma if tree is None else tree.max_depth

  def drafter_settings(self, name: str):
    return drafters.settings_for(name, getattr(self, name))

  def network_of(self, name: str) -> str:
    """The drafter whose weights and settings method `name` runs (the hybrid's fallback)."""
    return drafters.network_drafter(name, getattr(self, name)) if name in DRAFTERS else name

  @property
  def networks(self) -> tuple[str, ...]:
    """The drafters the methods run, hybrids' fallbacks included."""
    return tuple(dict.fromkeys(self.drafters + tuple(self.network_of(d) for d in self.drafters)))

  @property
  def sampling(self) -> SamplingConfig:
    return SamplingConfig(self.temperature, self.top_k, self.top_p)

  @property
  def methods(self) -> tuple[str, ...]:
    """The baseline first: every speculative row is compared with it."""
    return (BASELINE,) + self.drafters

  def fingerprint(self, method: str = BASELINE, checkpoints: Mapping[str, str] | None = None
                  ) -> str:
    """A short hash of the settings `method`'s rows depend on (resume keys).

    `checkpoints` maps 'model' / 'draft_model' to the content digest of the
    checkpoint it names: a path alone would let rows of an old file at that
    path stand for a new one.
    """
    keys = SHARED_KEYS + ((method,) + _LOOP_KEYS if method in DRAFTERS else ())
    if method in DRAFTERS and self.network_of(method) != method:   # the hybrid's fallback
      keys += (self.network_of(method),)
    if self.tree and method in DRAFTERS:   # only when set: rows made before the key still match
      keys += ('tree',)
    values = {k: getattr(self, k) for k in keys}
    values.update({f'{k}_sha256': v for k, v in (checkpoints or {}).items() if k in keys})
    return _hash(values)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _is_checkpoint(value: str) -> bool:
  return value.startswith(EMBEDDED_PREFIX) or os.path.exists(value)


def _hash(values: dict[str, Any]) -> str:
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


class ConfigError(ValueError):
  """A bad config value or input file: the user's to fix, so reported without a traceback."""


def _check(ok: bool, key: str, message: str) -> None:
  if not ok:
    raise ConfigError(f'config.{key} {message}')


def _check_types(config: ExperimentConfig) -> None:
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    kind = {'int': int, 'float': (int, float), 'str': str, 'bool': bool,
            'dict': dict}.get(field.type)
    if field.type == 'bool | str':  # checked by value in __post_init__
      continue
    if kind is None:  # tuple[str, ...]
      ok = all(isinstance(v, str) for v in value)
      kind_name = 'a tuple of names'
    else:
      ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
      kind_name = f'an {field.type}' if field.type == 'int' else f'a {field.type}'
    _check(ok, field.name, f'must be {kind_name}, got {value!r}')
