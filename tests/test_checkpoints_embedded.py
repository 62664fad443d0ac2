"""The embedded Gemma 3 270M GGUF, loaded through the weight cache.

The first run converts the file into the default cache (~/.cache/specjax or
$SPECJAX_CACHE_DIR; ~15-35 s on a CPU); later runs map the cached arrays in
well under a second.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from specjax import checkpoints
from specjax.checkpoints import embedded
from specjax.checkpoints import weight_cache
from specjax.models import gemma
from specjax.models import kv_cache
from specjax.models.config import MODEL_CONFIGS


@pytest.fixture(scope='module')
def target():
  return checkpoints.load_checkpoint(embedded.EMBEDDED_NAME)


def test_embedded_target_is_gemma3_270m(target):
  config, params = target
  assert config == MODEL_CONFIGS['gemma3-270m']
  assert params['embedding_VxD'].shape == (262_144, 640)
  assert params['layer_0']['attn']['q_NHxD'].shape == (4 * 256, 640)
  assert params['layer_17']['mlp']['down_DxF'].shape == (640, 2048)
  assert params['embedding_VxD'].dtype == np.float32
  # GGUF norms hold (1 + w): a final-norm scale of all ~0 would mean the shift was lost.
  assert np.abs(params['final_norm']['scale']).mean() > 1.0


def test_embedded_target_completes_a_pattern(target):
  """Greedy next token of a primed sentence: only correct weights in the right layout get it."""
  config, params = target
  metadata = weight_cache.read_gguf_metadata_cached(embedded.default_gguf_path())
  vocab = metadata['tokenizer.ggml.tokens']
  assert len(vocab) == config.vocab_size
  assert metadata['tokenizer.ggml.bos_token_id'] == 2
  ids = {piece: i for i, piece in enumerate(vocab)}
  pieces = ['The', '▁capital', '▁of', '▁France', '▁is', '▁Paris', '.',
            '▁The', '▁capital', '▁of', '▁Germany', '▁is']
  tokens_BxT = jnp.array([[metadata['tokenizer.ggml.bos_token_id']] + [ids[p] for p in pieces]])
  positions_BxT = jnp.arange(tokens_BxT.shape[1])[None]
  logits_BxTxV = gemma.Transformer(config).apply(
      {'params': params}, tokens_BxT, positions_BxT,
      kv_cache.init(config, 1, tokens_BxT.shape[1])).logits_BxRxV
  assert vocab[int(jnp.argmax(logits_BxTxV[0, -1]))] == '▁Berlin'
