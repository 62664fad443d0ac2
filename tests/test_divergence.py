"""The report that tells a float tie from a bug when greedy outputs differ."""

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import autoregressive, divergence
from specjax.models import config as config_lib
from specjax.models import gemma
from specjax.models.language_model import LanguageModel


def test_first_difference():
  assert divergence.first_difference([1, 2, 3], [1, 2, 3]) is None
  assert divergence.first_difference([1, 2, 3], [1, 5, 3]) == 1
  assert divergence.first_difference([1, 2, 3], [1, 2]) == 2


def test_explain_reports_the_position_and_the_target_margin():
  cfg = config_lib.tiny_config()
  params = jax.tree.map(lambda x: x * 1.5, gemma.init_params(cfg, jax.random.key(0)))
  model = LanguageModel(cfg)
  prompt = [4, 9, 1, 7]
  baseline = autoregressive.generate(model, params, [prompt], max_new_tokens=6).new_tokens[0]
  assert divergence.explain(model, params, prompt, baseline, list(baseline)) is None
  tampered = baseline[:3] + [(baseline[3] + 1) % cfg.vocab_size] + baseline[4:]
  found = divergence.explain(model, params, prompt, baseline, tampered)
  assert (found.position, found.baseline_token, found.speculative_token) == (
      3, baseline[3], tampered[3])
  context = prompt + baseline[:3]
  logits, _ = _logits_cache(model.forward(params, jnp.asarray([context]), jnp.arange(len(context))[None],
                            model.init_cache(1, len(context))))
  top = np.sort(np.asarray(logits[0, -1]))[::-1]
  np.testing.assert_allclose(found.logit_margin, top[0] - top[1], rtol=1e-5)
  assert found.logit_margin > 0


def _logits_cache(out):
  """(logits, cache) of a ForwardOutput."""
  return out.logits_BxRxV, out.cache
