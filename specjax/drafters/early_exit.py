"""Self-speculation (LayerSkip-style): the target's first k layers draft.

The drafter is the target truncated after layer k, then the final norm and the
tied head, or a reduced draft vocabulary's rows of it (`draft_vocab`); it
shares the target's weights and the KV cache of those k layers
(`self_draft.py` holds the loop it shares with `layer_skip`).
"""

from __future__ import annotations

import dataclasses

from specjax.drafters import base
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.drafters import self_draft
from specjax.models.language_model import LanguageModel


@dataclasses.dataclass(frozen=True)
class Settings:
  """layers: target layers the drafter runs.
  min_confidence: drafts less likely than this under the drafter end its evidence.
  draft_vocab: '' = the full head; 'embedded' = the vocabulary shipped for the
    embedded target; else a .npz path (`specjax.drafters.build_draft_vocab`).
  draft_vocab_size: the first N (most frequent) ids of that file; 0 = all."""

  layers: int = 4
  min_confidence: float = 0.0
  draft_vocab: str = ''
  draft_vocab_size: int = 32768

  def __post_init__(self):
    if self.layers < 1:
      raise ValueError(f'layers must be >= 1, got {self.layers}')
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')
    if self.draft_vocab_size < 0:
      raise ValueError(f'draft_vocab_size must be >= 0 (0 = the whole file), got '
                       f'{self.draft_vocab_size}')


def make(target: LanguageModel, settings: Settings = Settings(), *, target_params=None,
         tokenizer: str | None = None) -> base.Drafter:
  """`target_params` are needed with a draft vocabulary (its head is gathered from
  them); `tokenizer` is a fingerprint the vocabulary file must carry."""
  num_layers = settings.layers
  if not 1 <= num_layers < target.config.num_layers:
    raise ValueError(f'config.early_exit.layers must be in [1, {target.config.num_layers - 1}] '
                     f'for this target, got {num_layers}')
  vocab = load_vocab('early_exit', settings, target, tokenizer)
  return self_draft.make(target, name='early_exit', num_layers=num_layers,
                         min_confidence=settings.min_confidence, vocab=vocab,
                         target_params=target_params)


def load_vocab(name: str, settings, target: LanguageModel, tokenizer: str | None):
  """The drafter's reduced vocabulary, or None; errors name config.<name>.draft_vocab."""
  try:
    return draft_vocab_lib.resolve(settings.draft_vocab, settings.draft_vocab_size,
                                   vocab_size=target.config.vocab_size, tokenizer=tokenizer)
  except ValueError as e:
    raise ValueError(f'config.{name}.draft_vocab is {settings.draft_vocab!r}: {e}') from None
