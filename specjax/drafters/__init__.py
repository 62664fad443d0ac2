"""Drafters: n-gram prompt lookup, a smaller draft model, the target cut short
(its early layers, or all but a skipped set), and drafters trained on its hidden
states: Medusa heads and an EAGLE-3-style feature-space layer; and a hybrid
of n-gram lookup with one of the network drafters.

Each drafter module owns its `Settings` (one nested config entry, e.g.
`c.ngram = dict(max_n=3, min_n=1)`), checked by `settings_for` where the
drafter is built, so a new drafter adds its keys in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specjax.drafters import draft_model as draft_model_lib
from specjax.drafters import eagle as eagle_lib
from specjax.drafters import early_exit as early_exit_lib
from specjax.drafters import hybrid as hybrid_lib
from specjax.drafters import layer_skip as layer_skip_lib
from specjax.drafters import medusa as medusa_lib
from specjax.drafters import ngram as ngram_lib
from specjax.drafters.base import Drafter, Proposal, TargetView, TreeProposal, settings_from
from specjax.models.language_model import LanguageModel

SETTINGS = {
    'ngram': ngram_lib.Settings,
    'draft_model': draft_model_lib.Settings,
    'early_exit': early_exit_lib.Settings,
    'layer_skip': layer_skip_lib.Settings,
    'medusa': medusa_lib.Settings,
    'eagle': eagle_lib.Settings,
    'hybrid': hybrid_lib.Settings,
}
DRAFTER_NAMES = tuple(SETTINGS)
# Drafters that fill branching token trees (`Drafter.propose_tree`); the others
# verify chain-shaped trees only.
TREE_DRAFTERS = ('ngram', 'draft_model', 'medusa', 'eagle', 'hybrid')   # hybrid: over one of them
# Drafters whose weights `python -m specjax.train` makes (`checkpoints.drafter_io`).
TRAINED_DRAFTERS = ('medusa', 'eagle')


def network_drafter(name: str, settings: Any = None) -> str:
  """The drafter whose weights and settings `name` runs: the hybrid's fallback
  (`config.hybrid.drafter`), else `name` itself."""
  if name != 'hybrid':
    return name
  if settings is None or isinstance(settings, Mapping) or hasattr(settings, 'to_dict'):
    settings = settings_for(name, settings)
  return settings.drafter


def settings_for(name: str, values: Mapping[str, Any] | None = None):
  """The drafter's settings from its nested config entry (checked: unknown key,
  wrong type or value out of range is a ValueError naming config.<name>.<key>)."""
  if name not in SETTINGS:
    raise ValueError(f'unknown drafter {name!r}; known drafters: {", ".join(DRAFTER_NAMES)}')
  return settings_from(SETTINGS[name], values, name)


def make_drafter(name: str, *, target: LanguageModel, settings: Any = None,
                 draft_model: tuple[LanguageModel, object] | None = None,
                 target_params=None, tokenizer: str | None = None,
                 trained: tuple[object, object, dict] | None = None,
                 fallback_settings: Any = None) -> Drafter:
  """Builds a drafter by name; `settings` is its Settings or a mapping of them,
  `draft_model` is (model, params) or (model, params, draft vocabulary ids)
  for 'draft_model' (`experiments.loading.load_draft_model`). The self-drafters take
  `target_params` (a reduced head is gathered from them) and `tokenizer`, the
  fingerprint a draft vocabulary file must carry (None: not checked).
  `trained` is (weights, draft vocabulary ids or None, manifest) for 'medusa'
  and 'eagle', as `checkpoints.drafter_io.load_drafter` returns them. For
  'hybrid' they (and `fallback_settings`, the fallback's own entry) build the
  network drafter it falls back to."""
  if settings is None or isinstance(settings, Mapping) or hasattr(settings, 'to_dict'):
    settings = settings_for(name, settings)
  if name == 'hybrid':
    fallback = make_drafter(settings.drafter, target=target, settings=fallback_settings,
                            draft_model=draft_model, target_params=target_params,
                            tokenizer=tokenizer, trained=trained)
    return hybrid_lib.make(settings, fallback)
  if name == 'ngram':
    return ngram_lib.make(settings)
  if name == 'early_exit':
    return early_exit_lib.make(target, settings, target_params=target_params,
                               tokenizer=tokenizer)
  if name == 'layer_skip':
    return layer_skip_lib.make(target, settings, target_params=target_params,
                               tokenizer=tokenizer)
  if name == 'draft_model':
    if draft_model is None:
      raise ValueError("the 'draft_model' drafter needs a draft model checkpoint "
                       '(config key draft_model.checkpoint)')
    model, params, *vocab_ids = draft_model
    if model.config.vocab_size != target.config.vocab_size:
      raise ValueError(
          f'draft model vocabulary ({model.config.vocab_size} tokens) differs from the '
          f"target's ({target.config.vocab_size}): a drafter must share the target's vocabulary")
    return draft_model_lib.make(model, params, settings,
                                vocab_ids_N=vocab_ids[0] if vocab_ids else None)
  if name in TRAINED_DRAFTERS:
    if trained is None:
      raise ValueError(f"the {name!r} drafter needs trained weights (config key "
                       f'{name}.checkpoint, a directory `python -m specjax.train` wrote)')
    weights, vocab_ids, manifest = trained
    if name == 'medusa':
      return medusa_lib.make(target, weights, settings, vocab_ids_N=vocab_ids,
                             target_params=target_params)
    return eagle_lib.make(target, weights, tuple(manifest['hidden_layers']), settings,
                          vocab_ids_N=vocab_ids, target_params=target_params,
                          trained_length=manifest.get('data_recipe', {}).get('seq_len'))
  raise ValueError(f'unknown drafter {name!r}; known drafters: {", ".join(DRAFTER_NAMES)}')


__all__ = ['DRAFTER_NAMES', 'Drafter', 'Proposal', 'SETTINGS', 'TREE_DRAFTERS', 'TargetView',
           'TreeProposal', 'make_drafter', 'network_drafter',
           'settings_for']
