"""Gemma's tokenizer: a SentencePiece BPE model, from a `tokenizer.model` or a GGUF file.

The tokenization itself is the sentencepiece library's; this module only builds
the `ModelProto` it runs. A GGUF file carries the vocabulary as llama.cpp
metadata (pieces, scores, token types, special ids), from which we rebuild the
proto that Gemma's `tokenizer.model` holds, so a GGUF checkpoint needs no
second download.

Ids match the Hugging Face tokenizer's, which treats every special piece typed
in the text (`<start_of_turn>`, `<bos>`, `<unused7>`) as one token. Plain
SentencePiece only does that for user-defined pieces and drops control pieces
when decoding, so `Tokenizer` retypes control pieces as user-defined (and
Gemma's space runs as BPE pieces, see `_merge_space_runs_as_hugging_face_does`).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from absl import logging
from google.protobuf import message as protobuf_message
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

from specjax.checkpoints import gguf_loader
from specjax.checkpoints import weight_cache

Piece = sp_pb2.ModelProto.SentencePiece

# llama.cpp's `tokenizer.ggml.token_type` codes (gguf.TokenType).
_GGUF_PIECE_TYPES = {
    1: Piece.NORMAL,
    2: Piece.UNKNOWN,
    3: Piece.CONTROL,
    4: Piece.USER_DEFINED,
    5: Piece.UNUSED,
    6: Piece.BYTE,
}

# Bump when `_proto_from_gguf_metadata` changes, so stale cached protos are not reused.
_CACHE_VERSION = 2  # 2: named by the GGUF's sha256 and the proto's own, in the cache dir
_CACHE_SUBDIR = 'tokenizers'


class Tokenizer:
  """Text <-> ids with Gemma's vocabulary; `encode` adds BOS only when asked."""

  def __init__(self, proto: sp_pb2.ModelProto):
    spec = proto.trainer_spec
    self.bos_id, self.eos_id, self.pad_id, self.unk_id = (
        spec.bos_id, spec.eos_id, spec.pad_id, spec.unk_id)
    if not 0 <= self.unk_id < len(proto.pieces):
      raise ValueError(f'unk_id {self.unk_id} is outside the {len(proto.pieces)} pieces')
    self._unk_piece = proto.pieces[self.unk_id].piece
    runnable = sp_pb2.ModelProto()
    runnable.CopyFrom(proto)
    for piece in runnable.pieces:
      if piece.type == Piece.CONTROL:
        piece.type = Piece.USER_DEFINED
    _merge_space_runs_as_hugging_face_does(runnable)
    # Decoding the unknown id gives its piece, as Hugging Face does, not ' ⁇ '.
    runnable.trainer_spec.unk_surface = self._unk_piece
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=runnable.SerializeToString())
    except RuntimeError as e:
      raise ValueError(f'SentencePiece rejected the model: {e}') from e
    self.vocab_size = self._sp.vocab_size()
    self.end_of_turn_id = self._id_or_none('<end_of_turn>')
    self.start_of_turn_id = self._id_or_none('<start_of_turn>')

  @classmethod
  def from_model_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
    """Loads a serialized SentencePiece `ModelProto` such as Gemma's `tokenizer.model`."""
    path = pathlib.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f'No SentencePiece tokenizer model at {path}')
    proto = sp_pb2.ModelProto()
    try:
      proto.ParseFromString(path.read_bytes())
    except protobuf_message.DecodeError as e:
      raise ValueError(f'{path} is not a SentencePiece model: {e}') from e
    if not proto.pieces:
      raise ValueError(f'{path} is not a SentencePiece model: it has no pieces')
    try:
      return cls(proto)
    except ValueError as e:
      raise ValueError(f'{path}: {e}') from e

  @classmethod
  def from_gguf(cls, path: str | os.PathLike[str], cache: bool = True,
                cache_dir: str | os.PathLike[str] | None = None) -> Tokenizer:
    """Builds the tokenizer a GGUF checkpoint describes.

    Parsing the GGUF's 262k-piece metadata takes ~10 s while building the proto
    takes ~0.3 s, so with `cache` the proto is saved in the weight cache
    directory (`weight_cache.resolve_cache_dir(cache_dir)/tokenizers/`), named
    by the GGUF's sha256, so a changed file misses however its size and mtime
    look, and by the proto's own digest, so a damaged copy is noticed, logged
    and rebuilt rather than used.
    """
    path = pathlib.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f'No GGUF file at {path}')
    if cache:
      folder = weight_cache.resolve_cache_dir(cache_dir) / _CACHE_SUBDIR
      prefix = f'{weight_cache.file_sha256(path, cache_dir)}.v{_CACHE_VERSION}'
      proto = _read_cached_proto(folder, prefix)
      if proto is not None:
        return cls(proto)
    proto = _proto_from_gguf_metadata(gguf_loader.read_gguf_metadata(path), source=str(path))
    if cache:
      data = proto.SerializeToString()
      _write_atomically(folder / f'{prefix}.{_digest(data)}.model', data)
    return cls(proto)

  @classmethod
  def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
    """Builds the tokenizer from GGUF key/value metadata already read by a checkpoint loader."""
    return cls(_proto_from_gguf_metadata(metadata))

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    # SentencePiece never matches the unknown piece's text, which Hugging Face
    # reads as one token; identity normalization without a dummy prefix makes
    # encoding the parts separately equal to encoding the whole.
    if add_bos and self.bos_id < 0:
      raise ValueError('This vocabulary has no BOS token')
    ids = [self.bos_id] if add_bos else []
    for i, part in enumerate(text.split(self._unk_piece)):
      if i:
        ids.append(self.unk_id)
      ids.extend(self._sp.encode(part))
    return ids

  def decode(self, ids: Iterable[int], stop_at_eos: bool = False) -> str:
    """Renders every id, special ones included; `stop_at_eos` drops EOS and what follows."""
    ids = [int(i) for i in ids]
    if stop_at_eos and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    for i in ids:
      if not 0 <= i < self.vocab_size:
        raise ValueError(f'Token id {i} is outside the vocabulary [0, {self.vocab_size})')
    return self._sp.decode(ids)

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def piece_to_id(self, piece: str) -> int:
    """The piece's id, or `unk_id` when the vocabulary lacks it (SentencePiece's convention)."""
    return self._sp.piece_to_id(piece)

  def apply_chat_template(self, user_text: str) -> str:
    """One user turn and the model's turn opening, in Gemma's chat format.

    The text is stripped as Gemma's Hugging Face template (`| trim`) does; BOS
    is not included, `encode(..., add_bos=True)` adds it.
    """
    return f'<start_of_turn>user\n{user_text.strip()}<end_of_turn>\n<start_of_turn>model\n'

  def _id_or_none(self, piece: str) -> int | None:
    token_id = self._sp.piece_to_id(piece)
    return None if token_id == self.unk_id and piece != self._unk_piece else token_id


def _merge_space_runs_as_hugging_face_does(proto: sp_pb2.ModelProto) -> None:
  """Retypes Gemma's user-defined space runs ('▁▁' .. 31 x '▁') as BPE pieces.

  SentencePiece matches a user-defined piece whole, longest first, so 32 spaces
  become 31 + 1. Hugging Face cannot (its added token spells the run with '▁',
  which raw text lacks) and merges the run by BPE, ranking the runs in file
  order ahead of every normal piece: 32 spaces become 16 + 16. Scores in that
  order make SentencePiece's BPE merge them the same way.
  """
  top = max((p.score for p in proto.pieces if p.type == Piece.NORMAL), default=0.0)
  for i, piece in enumerate(proto.pieces):
    if piece.type == Piece.USER_DEFINED and len(piece.piece) > 1 and set(piece.piece) == {'▁'}:
      piece.type = Piece.NORMAL
      piece.score = top + len(proto.pieces) - i


def _proto_from_gguf_metadata(metadata: Mapping[str, Any], source: str = 'GGUF metadata'
                              ) -> sp_pb2.ModelProto:
  """The `ModelProto` that llama.cpp's SentencePiece ('llama') vocabulary was converted from.

  Normalizer and trainer settings are Gemma's `tokenizer.model` ones; only
  `add_dummy_prefix` comes from the metadata. A vocabulary that relies on a
  precompiled normalization table (Llama 2's nmt_nfkc) is not recoverable from
  GGUF, so such models may differ on characters NFKC would rewrite.
  """
  kind = metadata.get('tokenizer.ggml.model')
  if kind != 'llama':
    raise ValueError(f"{source}: tokenizer.ggml.model is {kind!r}, not 'llama' (SentencePiece)")
  try:
    tokens = list(metadata['tokenizer.ggml.tokens'])
    scores = list(metadata['tokenizer.ggml.scores'])
    types = list(metadata['tokenizer.ggml.token_type'])
  except KeyError as e:
    raise ValueError(f'{source}: missing {e.args[0]}') from e
  if not len(tokens) == len(scores) == len(types):
    raise ValueError(f'{source}: {len(tokens)} tokens, {len(scores)} scores, {len(types)} types')
  unk_id = metadata.get('tokenizer.ggml.unknown_token_id', types.index(2) if 2 in types else None)
  if unk_id is None:
    raise ValueError(f'{source}: no tokenizer.ggml.unknown_token_id and no unknown-typed token')
  special_ids = {
      'unk': int(unk_id),
      'bos': int(metadata.get('tokenizer.ggml.bos_token_id', -1)),
      'eos': int(metadata.get('tokenizer.ggml.eos_token_id', -1)),
      'pad': int(metadata.get('tokenizer.ggml.padding_token_id', -1)),
  }

  proto = sp_pb2.ModelProto()
  for i, (token, score, gguf_type) in enumerate(zip(tokens, scores, types)):
    piece = proto.pieces.add()
    piece.score = float(score)
    piece.type = _GGUF_PIECE_TYPES[int(gguf_type)]
    # SentencePiece wants exactly one unknown piece; Gemma's GGUF types its <unk> as control.
    if i == special_ids['unk']:
      piece.type = Piece.UNKNOWN
    elif piece.type == Piece.UNKNOWN:
      piece.type = Piece.CONTROL
    # llama.cpp writes user-defined pieces' '▁' as ' '; SentencePiece matches them
    # against text whose spaces are already escaped to '▁'.
    piece.piece = token.replace(' ', '▁') if piece.type == Piece.USER_DEFINED else token

  trainer = proto.trainer_spec
  trainer.model_type = sp_pb2.TrainerSpec.BPE
  trainer.vocab_size = len(tokens)
  trainer.byte_fallback = 6 in types
  trainer.split_digits = True
  trainer.allow_whitespace_only_pieces = True
  for name, token_id in special_ids.items():
    setattr(trainer, f'{name}_id', token_id)
    if token_id >= 0:
      setattr(trainer, f'{name}_piece', tokens[token_id])

  normalizer = proto.normalizer_spec
  normalizer.name = 'identity'
  normalizer.add_dummy_prefix = bool(metadata.get('tokenizer.ggml.add_space_prefix', False))
  normalizer.remove_extra_whitespaces = False
  normalizer.escape_whitespaces = True
  return proto


def _digest(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()[:16]


def _read_cached_proto(folder: pathlib.Path, prefix: str) -> sp_pb2.ModelProto | None:
  """The saved proto `<prefix>.<digest>.model` whose bytes still hash to its digest, else None."""
  for path in sorted(folder.glob(f'{prefix}.*.model')):
    try:
      data = path.read_bytes()
    except OSError as e:
      logging.warning('Cannot read the cached tokenizer %s (%s); rebuilding it', path, e)
      continue
    if _digest(data) == path.name[len(prefix) + 1:-len('.model')]:
      proto = sp_pb2.ModelProto()
      try:
        proto.ParseFromString(data)
        return proto
      except protobuf_message.DecodeError:
        pass
    logging.warning('The cached tokenizer %s is damaged (its bytes do not match the digest in '
                    'its name); rebuilding it', path)
    path.unlink(missing_ok=True)
  return None


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
  """Writes via a temporary file so a concurrent reader never sees half a model.

  It is only a cache: an unwritable directory is logged, not raised.
  """
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}')
  except OSError as e:
    logging.warning('Not caching the tokenizer at %s: %s', path, e)
    return
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
  except OSError as e:
    logging.warning('Not caching the tokenizer at %s: %s', path, e)
    pathlib.Path(tmp).unlink(missing_ok=True)
