"""Trained drafter weights: an Orbax tree plus `drafter.json`, tied to their target.

A drafter trained against one target is noise on another, so the directory
records what it was trained for (the target's width, vocabulary, layer count
and content sha256, and the draft vocabulary's ids digest) and `load_drafter`
refuses a mismatch with a message naming both sides. `drafter.json` also
carries the command and data recipe that made the weights, and their final
held-out figures, so a shipped file says how to remake it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from specjax.checkpoints.errors import CheckpointError

MANIFEST = 'drafter.json'
# checkpoint='embedded': the drafter of that kind shipped for the embedded Gemma 3 270M.
EMBEDDED = 'embedded'
SHIPPED_DIR = Path(__file__).resolve().parents[1] / 'drafters' / 'data'
WEIGHTS = 'weights'
FORMAT_VERSION = 1


def resolve(checkpoint: str, kind: str) -> Path:
  """A checkpoint setting as a directory: 'embedded' is the one shipped for the embedded 270M."""
  if checkpoint == EMBEDDED:
    return SHIPPED_DIR / f'gemma3-270m-{kind}'
  return Path(checkpoint).expanduser().resolve()


def ids_digest(vocab_ids_N) -> str:
  """The draft vocabulary's identity: sha256 of its int32 ids ('' for the full vocabulary)."""
  if vocab_ids_N is None:
    return ''
  return hashlib.sha256(np.asarray(vocab_ids_N, np.int32).tobytes()).hexdigest()


def target_signature(config, target_sha256: str) -> dict[str, Any]:
  return {'embed_dim': config.embed_dim, 'vocab_size': config.vocab_size,
          'num_layers': config.num_layers, 'sha256': target_sha256}


def save_drafter(directory: str | os.PathLike, kind: str, weights: Any, *, target: dict[str, Any],
                 vocab_ids_N=None, provenance: dict[str, Any] | None = None) -> Path:
  """Writes `weights` (a pytree of arrays) and the manifest; replaces an older save."""
  directory = Path(directory).expanduser().resolve()
  directory.mkdir(parents=True, exist_ok=True)
  host = jax.tree.map(np.asarray, weights)
  with ocp.PyTreeCheckpointer() as checkpointer:
    checkpointer.save(directory / WEIGHTS, host, force=True)
  if vocab_ids_N is not None:
    np.save(directory / 'vocab_ids.npy', np.asarray(vocab_ids_N, np.int32))
  manifest = {'format_version': FORMAT_VERSION, 'kind': kind, 'target': target,
              'vocab_ids_sha256': ids_digest(vocab_ids_N), **(provenance or {})}
  tmp = directory / (MANIFEST + '.tmp')
  tmp.write_text(json.dumps(manifest, indent=1) + '\n', encoding='utf-8')
  os.replace(tmp, directory / MANIFEST)
  return directory


def load_drafter(directory: str | os.PathLike, kind: str, *, target: dict[str, Any]
                 ) -> tuple[Any, np.ndarray | None, dict[str, Any]]:
  """(weights as float32 numpy, vocab ids or None, manifest) of a saved `kind` drafter.

  `target` is `target_signature` of the target it will draft for; a sha256 of
  '' skips the content check (a target given by config only, e.g. in tests).
  """
  shipped = str(directory) == 'embedded'
  directory = resolve(str(directory), kind)
  manifest_path = directory / MANIFEST
  if not manifest_path.is_file():
    raise CheckpointError(f'{directory}: not a specjax drafter checkpoint (no {MANIFEST})')
  try:
    manifest = json.loads(manifest_path.read_text(encoding='utf-8'))
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{manifest_path}: corrupt drafter manifest ({e})') from None
  if manifest.get('kind') != kind:
    raise CheckpointError(f'{directory} holds a {manifest.get("kind")!r} drafter, not {kind!r}')
  trained = manifest.get('target', {})
  for key in ('embed_dim', 'vocab_size', 'num_layers', 'sha256'):
    if key == 'sha256' and not (target.get(key) and trained.get(key)):
      continue
    if trained.get(key) != target.get(key):
      hint = (f"; checkpoint 'embedded' is the {kind} drafter shipped for "
              'embedded:gemma3-270m: for another target train one (python -m specjax.train) '
              'or leave it out (--config.drafters=ngram)' if shipped else '')
      raise CheckpointError(
          f'{directory} was trained for another target: its {key} is {trained.get(key)!r}, '
          f"this target's is {target.get(key)!r}{hint}")
  vocab_ids = None
  if (directory / 'vocab_ids.npy').is_file():
    vocab_ids = np.load(directory / 'vocab_ids.npy')
  if ids_digest(vocab_ids) != manifest.get('vocab_ids_sha256', ''):
    raise CheckpointError(f'{directory}: vocab_ids.npy does not match the draft vocabulary the '
                          'drafter was trained with (sha256 differs)')
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      weights = checkpointer.restore(directory / WEIGHTS)
  except Exception as e:  # tensorstore and Orbax raise many types on damaged files
    raise CheckpointError(f'{directory}: corrupt drafter weights: {type(e).__name__}: {e}') from e
  return jax.tree.map(lambda x: np.asarray(x, np.float32), weights), vocab_ids, manifest
