r"""Builds a reduced draft vocabulary from the target's own outputs on calibration prompts.

  python -m specjax.drafters.build_draft_vocab \
      --out=specjax/drafters/data/gemma3-270m-draft-vocab.npz

The target (the embedded Gemma 3 270M by default) continues each calibration
prompt (specjax/prompts/calibration.jsonl: hand-written raw-text starts of
code, prose, news, dialogue, maths, translation by example, lists, Q&A; none
from Spec-Bench) greedily and `--samples` times sampled, and continues BOS
alone `--bos_rows` times sampled. Tokens are ranked by how often the target
produced them; ties and the never-produced tail by how often they appear in
the calibration prompts, then by id (Gemma's BPE ids follow merge order, a
rough corpus-frequency order), special and byte pieces (`<...>`) last. The
file holds the top `--size` ids, the tokenizer's fingerprint and the
provenance (this command, the prompt file's sha256, the token counts).
"""

from __future__ import annotations

import collections
import re
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from specjax import checkpoints
from specjax import compile_cache
from specjax import sampling as sampling_lib
from specjax.checkpoints import embedded
from specjax.decoding import autoregressive
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.experiments import loading
from specjax.experiments import prompts as prompts_lib
from specjax.models import language_model

_MODEL = flags.DEFINE_string('model', 'embedded:gemma3-270m', 'The target checkpoint.')
_OUT = flags.DEFINE_string('out', None, 'The .npz to write.', required=True)
_SIZE = flags.DEFINE_integer('size', 65536, 'Ids kept (every prefix is a smaller vocabulary).')
_NEW = flags.DEFINE_integer('max_new_tokens', 96, 'Tokens generated per row.')
_SAMPLES = flags.DEFINE_integer('samples', 2, 'Sampled continuations per prompt.')
_BOS_ROWS = flags.DEFINE_integer('bos_rows', 32, 'Sampled continuations of BOS alone.')
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Rows per compiled call.')
_TEMPERATURE = flags.DEFINE_float('temperature', 1.0, 'Of the sampled continuations.')


def generate_rows(model, params, prompts, *, max_new_tokens, sampling, seed, batch_size):
  out = []
  for start in range(0, len(prompts), batch_size):
    chunk = prompts[start:start + batch_size]
    gen = autoregressive.generate(model, params, chunk, max_new_tokens=max_new_tokens,
                                  sampling=sampling, seed=seed,
                                  row_ids=range(start, start + len(chunk)))
    out.extend(gen.new_tokens)
    logging.info('generated %d / %d rows', start + len(chunk), len(prompts))
  return out


def rank(output_counts: collections.Counter, prompt_counts: collections.Counter,
         pieces: list[str]) -> np.ndarray:
  """Every id, most produced first; then by prompt count, plain pieces before `<...>`, id."""
  special = np.array([bool(re.fullmatch(r'<.*>', p)) for p in pieces])
  ids = np.arange(len(pieces))
  out = np.array([output_counts.get(i, 0) for i in ids])
  inp = np.array([prompt_counts.get(i, 0) for i in ids])
  order = np.lexsort((ids, special, -inp, -out))   # last key is the primary one
  return order.astype(np.int32)


def main(argv):
  del argv
  compile_cache.enable()
  start = time.time()
  model_config, params = checkpoints.load_checkpoint(_MODEL.value)
  model = language_model.single_device(model_config)
  params = jax.device_put(params)
  source = (str(embedded.default_gguf_path()) if _MODEL.value.startswith('embedded:')
            else _MODEL.value)
  tokenizer = loading.load_tokenizer(source)
  prompts, prompts_sha = prompts_lib.prompt_set('calibration')
  ids = [tokenizer.encode(p.text, add_bos=True) for p in prompts]
  sampled = sampling_lib.SamplingConfig(temperature=_TEMPERATURE.value)
  kwargs = dict(max_new_tokens=_NEW.value, batch_size=_BATCH.value)
  rows = generate_rows(model, params, ids, sampling=sampling_lib.SamplingConfig(), seed=0,
                       **kwargs)
  for s in range(_SAMPLES.value):
    rows += generate_rows(model, params, ids, sampling=sampled, seed=1 + s, **kwargs)
  rows += generate_rows(model, params, [[tokenizer.bos_id]] * _BOS_ROWS.value, sampling=sampled,
                        seed=100, **kwargs)
  output_counts = collections.Counter(t for row in rows for t in row)
  prompt_counts = collections.Counter(t for row in ids for t in row[1:])
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  ranked = rank(output_counts, prompt_counts, pieces)[:_SIZE.value]
  vocab = draft_vocab_lib.DraftVocab(
      ranked, model_config.vocab_size, draft_vocab_lib.tokenizer_fingerprint(tokenizer),
      provenance=dict(
          command='python -m specjax.drafters.build_draft_vocab ' + ' '.join(sys.argv[1:]),
          model=_MODEL.value, prompts=f'specjax/prompts/{prompts_lib.CALIBRATION}',
          prompts_sha256=prompts_sha, num_prompts=len(prompts),
          generated_tokens=sum(len(r) for r in rows), distinct_generated=len(output_counts),
          top_counts=[[int(i), c] for i, c in output_counts.most_common(50)]))
  draft_vocab_lib.save(vocab, _OUT.value)
  print(f'{_OUT.value}: {vocab.size} ids; {vocab.provenance["generated_tokens"]} generated '
        f'tokens, {len(output_counts)} distinct; {time.time() - start:.0f} s')


if __name__ == '__main__':
  app.run(main)
