"""The embedded Gemma 3 270M as the product serves it (its int8 forms), its tokenizer,
its shipped EAGLE drafter and the Spec-Bench prompts: what the loop benchmarks time."""

from __future__ import annotations

import os
import sys

import jax

from specjax import checkpoints
from specjax.checkpoints import drafter_io
from specjax.checkpoints import embedded
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

TARGET = 'embedded:gemma3-270m'
SPEC_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared',
                          'data', 'spec_bench_question.jsonl')


def spec_bench_prompts(path: str):
  """The prompts of a Spec-Bench question file; exits with where to find it if absent."""
  if not os.path.exists(path):
    sys.exit(f'Spec-Bench prompts not found at {path} (see ../shared/data/README.md)')
  return prompts_lib.load_prompts(path)


def target() -> tuple[LanguageModel, dict, Tokenizer]:
  """(model, params with their int8 forms on the device, tokenizer)."""
  config, params = checkpoints.load_checkpoint(TARGET)
  params = jax.device_put(q8_weights.with_q8_weights(params))
  return LanguageModel(config), params, Tokenizer.from_gguf(embedded.default_gguf_path())


def shipped_eagle(model: LanguageModel):
  """The shipped EAGLE drafter's (weights, vocabulary ids, manifest), checked against the target."""
  signature = drafter_io.target_signature(model.config, checkpoints.content_digest(TARGET))
  return drafter_io.load_drafter('embedded', 'eagle', target=signature)
