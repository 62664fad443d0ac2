"""A reduced draft vocabulary (FR-Spec, EAGLE-3): the N tokens a draft head may propose.

Most of a small target's decode step is its tied V-wide head (63% of Gemma 3
270M's weights). A drafter that scores only the N most frequent tokens pays
N / V of that. The target still verifies over the whole vocabulary, so greedy
output is unchanged; under sampling the drafter's q is zero outside the subset
(it is what the draft was drawn from, scattered into V), and the exact rule
stays exact.

A vocabulary is a ranked list of token ids (most frequent first, so every
prefix is itself a vocabulary: one file serves N = 8k ... 64k), the target's
vocabulary size, and a fingerprint of the tokenizer it was counted with,
checked on load: ids are meaningless under another tokenizer. The fingerprint
is the first 16 hex digits of sha256 over "<id>\\t<piece>\\n" for every id in
order (`tokenizer_fingerprint`). Files are .npz: `ids` (int32), `vocab_size`,
`tokenizer` (the fingerprint) and `provenance` (JSON: the command, prompts and
counts that made it).

Shape letters: B batch, D width, N draft-vocabulary size, V full vocabulary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.models import gemma
from specjax.models import q8_weights
from specjax.models.config import GemmaConfig

Array = jax.Array

DATA_DIR = pathlib.Path(__file__).parent / 'data'
# The ranked vocabulary shipped for the embedded target (`draft_vocab='embedded'`).
EMBEDDED_FILE = DATA_DIR / 'gemma3-270m-draft-vocab.npz'


@dataclasses.dataclass(frozen=True, eq=False)
class DraftVocab:
  """ids_N: token ids, most frequent first. vocab_size: the target's V.
  tokenizer: the fingerprint of the tokenizer the ids belong to."""

  ids_N: np.ndarray
  vocab_size: int
  tokenizer: str
  provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    ids = np.asarray(self.ids_N)
    if ids.ndim != 1 or ids.size == 0:
      raise ValueError(f'a draft vocabulary needs a non-empty list of ids, got shape {ids.shape}')
    if ids.min() < 0 or ids.max() >= self.vocab_size:
      raise ValueError(f'draft vocabulary ids must be in [0, {self.vocab_size}), got '
                       f'[{ids.min()}, {ids.max()}]')
    if len(np.unique(ids)) != ids.size:
      raise ValueError('draft vocabulary ids must be distinct')

  @property
  def size(self) -> int:
    return int(np.asarray(self.ids_N).size)

  def first(self, n: int) -> DraftVocab:
    """The n most frequent ids (all of them when n is 0 or at least the size)."""
    if n < 0:
      raise ValueError(f'a draft vocabulary size must be >= 0 (0 = all), got {n}')
    if n == 0 or n >= self.size:
      return self
    return dataclasses.replace(self, ids_N=np.asarray(self.ids_N)[:n])

  def coverage(self, token_ids) -> float:
    """The share of `token_ids` inside this vocabulary."""
    tokens = np.asarray(token_ids).reshape(-1)
    return float(np.isin(tokens, np.asarray(self.ids_N)).mean()) if tokens.size else 0.0


def tokenizer_fingerprint(tokenizer) -> str:
  """sha256 of every piece in id order ("<id>\\t<piece>\\n"), first 16 hex digits.

  A tokenizer without `id_to_piece` (the tests' byte tokenizer) is hashed by
  what `decode` makes of each id.
  """
  piece = getattr(tokenizer, 'id_to_piece', None) or (lambda i: tokenizer.decode([i]))
  digest = hashlib.sha256()
  for i in range(tokenizer.vocab_size):
    digest.update(f'{i}\t{piece(i)}\n'.encode('utf-8', 'surrogatepass'))
  return digest.hexdigest()[:16]


def save(vocab: DraftVocab, path: str | os.PathLike[str]) -> None:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'wb') as f:
    np.savez_compressed(f, ids=np.asarray(vocab.ids_N, np.int32),
                        vocab_size=np.int64(vocab.vocab_size), tokenizer=np.str_(vocab.tokenizer),
                        provenance=np.str_(json.dumps(vocab.provenance, sort_keys=True)))


def load(path: str | os.PathLike[str]) -> DraftVocab:
  """Reads a .npz written by `save`; a missing or malformed file is a ValueError naming it."""
  try:
    with np.load(path, allow_pickle=False) as data:
      return DraftVocab(data['ids'].astype(np.int32), int(data['vocab_size']),
                        str(data['tokenizer']), json.loads(str(data['provenance'])))
  except (OSError, KeyError, ValueError) as e:
    raise ValueError(f'{path} is not a readable draft vocabulary file ({e})') from None


def resolve_path(name: str) -> pathlib.Path | None:
  """'' -> None (the full head), 'embedded' -> the shipped file, else the path itself."""
  if not name:
    return None
  return EMBEDDED_FILE if name == 'embedded' else pathlib.Path(name)


def resolve(name: str, size: int, *, vocab_size: int, tokenizer: str | None = None
            ) -> DraftVocab | None:
  """The draft vocabulary a drafter's settings name, its first `size` ids, checked
  against the target's vocabulary size and (when given) the tokenizer's fingerprint."""
  path = resolve_path(name)
  if path is None:
    return None
  vocab = load(path)
  if vocab.vocab_size != vocab_size:
    raise ValueError(f'draft vocabulary {path} was made for a {vocab.vocab_size}-token '
                     f'vocabulary; the target has {vocab_size}')
  if tokenizer is not None and vocab.tokenizer != tokenizer:
    raise ValueError(f'draft vocabulary {path} belongs to another tokenizer: its fingerprint is '
                     f'{vocab.tokenizer}, this tokenizer\'s is {tokenizer}')
  return vocab.first(size)


# ------------------------------------------------------------------ the head


def checked_ids(vocab_ids_N, vocab_size: int, who: str) -> np.ndarray | None:
  """A drafter's draft vocabulary as int32 ids (None: the full vocabulary), or a
  ValueError naming `who` when they are not ids of the target's vocabulary."""
  if vocab_ids_N is None:
    return None
  ids = np.asarray(vocab_ids_N, np.int32)
  if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f'{who} vocabulary must be ids in [0, {vocab_size}), got shape {ids.shape}')
  return ids


def ranked(logits_BxN: Array, r: int, ids_N: Array | None) -> tuple[Array, Array]:
  """The r most likely tokens (full-vocabulary ids, int32) and their probabilities,
  best first: a tree node that is its parent's k-th child takes column k."""
  top_logits_BxR, top_BxR = jax.lax.top_k(logits_BxN, r)
  prob_BxR = jnp.exp(top_logits_BxR - jax.nn.logsumexp(logits_BxN, axis=-1)[:, None])
  token_BxR = top_BxR if ids_N is None else ids_N[top_BxR]
  return token_BxR.astype(jnp.int32), prob_BxR


def reduced_head(embedding_VxD: Array, ids_N) -> Array:
  """The rows of the tied table the draft head scores (gathered once, outside the loop)."""
  return jnp.take(embedding_VxD, jnp.asarray(ids_N, jnp.int32), axis=0)


def head_form(target_params, ids_N) -> tuple[Array, Array] | None:
  """The int8 form (`models/q8_weights`) of the rows a draft head scores (all of them for
  `ids_N` None), where the target's table has one, else None.

  A draft position scores its N rows once per draft: from 16,384 rows that is 42 MB of
  float32 a draft, against the 306 MB a decode step of the 270M reads from its int8 forms;
  from the rows' int8 form it is 12 MB. `gemma.linear` takes the form where the q8 kernel
  applies, and the float32 rows elsewhere."""
  if q8_weights.HEAD_FORM not in target_params:
    return None
  q_VxD, scale_VxB = target_params[q8_weights.HEAD_FORM], target_params[q8_weights.HEAD_SCALE]
  if ids_N is None:
    return q_VxD, scale_VxB
  ids_N = jnp.asarray(ids_N, jnp.int32)
  return jnp.take(q_VxD, ids_N, axis=0), jnp.take(scale_VxB, ids_N, axis=0)


def head_rows(target_params, ids_N) -> tuple[Array, tuple[Array, Array] | None]:
  """(float32 rows, their int8 form or None) of the tied table a draft head scores: rows
  `ids_N`, or the whole table for None."""
  table_VxD = target_params['embedding_VxD']
  rows_NxD = table_VxD if ids_N is None else reduced_head(table_VxD, ids_N)
  return rows_NxD, head_form(target_params, ids_N)


def head_logits(head_NxD: Array, hidden_BxD: Array, config: GemmaConfig,
                head_q8: tuple[Array, Array] | None = None) -> Array:
  """Float32 logits over the subset, soft-capped as the full head is; `head_q8`: the
  rows' int8 form (`head_form`), where there is one."""
  logits_BxN = gemma.linear(hidden_BxD[:, None], head_NxD, out_dtype=jnp.float32,
                            q8=head_q8)[:, 0]
  return gemma.softcap_logits(logits_BxN, config)


def draw(keys_B: Array, logits_BxN: Array, ids_N: Array | None, vocab_size: int,
         sampling: sampling_lib.SamplingConfig) -> tuple[Array, Array, Array | None]:
  """(draft ids in the full vocabulary, their subset indices, q over V or None).

  The draw (temperature, top-k, top-p) is over the subset; q is that
  distribution scattered into V, zero elsewhere: exactly what the draft was
  drawn from. `ids_N` None is the full vocabulary (index = id, q as drawn).
  """
  index_B, q_BxN = sampling_lib.draw(keys_B, logits_BxN, sampling)
  if ids_N is None:
    return index_B, index_B, q_BxN
  token_B = jnp.take(ids_N, index_B)
  if q_BxN is None:
    return token_B, index_B, None
  q_BxV = jnp.zeros((q_BxN.shape[0], vocab_size), q_BxN.dtype).at[:, ids_N].set(q_BxN)
  return token_B, index_B, q_BxV
