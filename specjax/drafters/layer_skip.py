"""Self-speculation by layer skipping (Draft & Verify, SWIFT): the target minus a set of layers.

The draft runs every layer of the target except those in `skip` (each skipped
layer is the identity and neither reads nor writes its cache), then the final
norm and the full or a reduced head; it shares the target's weights and the
KV cache of the layers it runs, as `early_exit` does (`self_draft.py`). Which
layers to skip is found by a search on calibration prompts
(`python -m specjax.drafters.search_layer_skip`); its result for the embedded
target is shipped in `data/` with the command that found it, and is the
default when `skip` is empty.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from specjax.drafters import base
from specjax.drafters import early_exit
from specjax.drafters import self_draft
from specjax.models.language_model import LanguageModel

SEARCHED_FILE = pathlib.Path(__file__).parent / 'data' / 'gemma3-270m-layer-skip.json'


@dataclasses.dataclass(frozen=True)
class Settings:
  """skip: target layers (0-based) the draft leaves out; () = the searched set
    shipped for the embedded target (data/gemma3-270m-layer-skip.json).
  min_confidence, draft_vocab, draft_vocab_size: as for `early_exit`."""

  skip: tuple = ()
  min_confidence: float = 0.0
  draft_vocab: str = 'embedded'
  draft_vocab_size: int = 32768

  def __post_init__(self):
    if any(not isinstance(i, int) or isinstance(i, bool) for i in self.skip):
      raise ValueError(f'skip must be layer numbers, got {self.skip!r}')
    if len(set(self.skip)) != len(self.skip):
      raise ValueError(f'skip names a layer twice: {self.skip!r}')
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')
    if self.draft_vocab_size < 0:
      raise ValueError(f'draft_vocab_size must be >= 0 (0 = the whole file), got '
                       f'{self.draft_vocab_size}')


def searched(path: pathlib.Path = SEARCHED_FILE) -> dict:
  """The search result: {'skip': [...], 'model': {...}, 'command': ..., ...}."""
  return json.loads(path.read_text(encoding='utf-8'))


def skip_set(settings: Settings, num_layers: int, model_fields: dict | None = None
             ) -> tuple[int, ...]:
  """The layers to skip, checked against the target's `num_layers`.

  An empty `skip` takes the shipped search result, which must have been found
  for a model of these `model_fields` (num_layers, embed_dim, vocab_size).
  """
  skip = tuple(settings.skip)
  if not skip:
    found = searched()
    if model_fields is not None and any(found['model'].get(k) != v
                                        for k, v in model_fields.items()):
      raise ValueError(f'config.layer_skip.skip is empty, and the shipped search result '
                       f'({SEARCHED_FILE.name}) is for another model ({found["model"]}): '
                       'name the layers to skip, or run specjax.drafters.search_layer_skip')
    skip = tuple(found['skip'])
  bad = [i for i in skip if not 0 <= i < num_layers]
  if bad:
    raise ValueError(f'config.layer_skip.skip names layer(s) {bad} the target lacks: it has '
                     f'{num_layers} layers, 0 .. {num_layers - 1}')
  if len(skip) >= num_layers:
    raise ValueError(f'config.layer_skip.skip leaves out all {num_layers} layers: keep one')
  return tuple(sorted(skip))


def make(target: LanguageModel, settings: Settings = Settings(), *, target_params=None,
         tokenizer: str | None = None) -> base.Drafter:
  cfg = target.config
  skip = skip_set(settings, cfg.num_layers, dict(num_layers=cfg.num_layers,
                                                 embed_dim=cfg.embed_dim,
                                                 vocab_size=cfg.vocab_size))
  vocab = early_exit.load_vocab('layer_skip', settings, target, tokenizer)
  return self_draft.make(target, name='layer_skip', skip_layers=skip,
                         min_confidence=settings.min_confidence, vocab=vocab,
                         target_params=target_params)
