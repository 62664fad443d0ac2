"""Drafters: n-gram prompt lookup, a smaller draft model, the target's early layers."""

from __future__ import annotations

from specjax.drafters import draft_model as draft_model_lib
from specjax.drafters import early_exit as early_exit_lib
from specjax.drafters import ngram as ngram_lib
from specjax.drafters.base import Drafter
from specjax.models.language_model import LanguageModel

DRAFTER_NAMES = ('ngram', 'draft_model', 'early_exit')


def make_drafter(name: str, *, target: LanguageModel, ngram_max: int = 3, ngram_min: int = 1,
                 draft_model: tuple[LanguageModel, object] | None = None,
                 early_exit_layers: int = 4) -> Drafter:
  """Builds a drafter by name; `draft_model` is (model, params) for 'draft_model'."""
  if name == 'ngram':
    return ngram_lib.make(ngram_max, ngram_min)
  if name == 'early_exit':
    return early_exit_lib.make(target, early_exit_layers)
  if name == 'draft_model':
    if draft_model is None:
      raise ValueError("the 'draft_model' drafter needs a draft model checkpoint "
                       '(config key draft_model)')
    model, params = draft_model
    if model.config.vocab_size != target.config.vocab_size:
      raise ValueError(
          f'draft model vocabulary ({model.config.vocab_size} tokens) differs from the '
          f"target's ({target.config.vocab_size}): a drafter must share the target's vocabulary")
    return draft_model_lib.make(model, params)
  raise ValueError(f'unknown drafter {name!r}; known drafters: {", ".join(DRAFTER_NAMES)}')


__all__ = ['DRAFTER_NAMES', 'Drafter', 'make_drafter']
