"""Runs on 8 simulated CPU devices (set up by tests/test_sharding.py).

Prints one JSON object: for each check, whether the ('data', 'model') mesh
gave what one device gives. Kept out of the main test process because the
device count is fixed when JAX starts.
"""

import json
import os
import sys

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8')

import jax  # noqa: E402  (must follow XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from specjax import compile_cache  # noqa: E402
from specjax import sharding  # noqa: E402
from specjax import sampling
from specjax.cpu_kernels import q8_amx  # noqa: E402
from specjax.cpu_kernels import q8_argmax  # noqa: E402
from specjax.cpu_kernels import q8_matmul  # noqa: E402
from specjax.decoding import autoregressive, speculative  # noqa: E402
from specjax.decoding import tree as tree_lib  # noqa: E402
from specjax.drafters import make_drafter  # noqa: E402
from specjax.models import config as config_lib, gemma, q8_weights  # noqa: E402
from specjax.models.language_model import LanguageModel  # noqa: E402
from toy_models import gguf_like_params  # noqa: E402


def forward_max_diff(cfg, data, model_size):
  params = gemma.init_params(cfg, jax.random.key(1))
  one = LanguageModel(cfg)
  mesh = sharding.make_mesh(data, model_size)
  many = LanguageModel(cfg, mesh=mesh)
  batch, length = 2 * data, 12
  tokens = jax.random.randint(jax.random.key(2), (batch, length), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))

  def run(lm, p):
    return jax.jit(lambda p, t, pos: lm.forward(p, t, pos, lm.init_cache(batch, 16),
                                                hidden_layers=(0, cfg.num_layers - 1)))(
        p, tokens, positions)
  out_1 = run(one, params)
  out_n = run(many, sharding.shard_params(params, cfg, mesh))
  cache_diff = max(float(jnp.abs(a - b).max()) for a, b in
                   zip(jax.tree.leaves(out_1.cache), jax.tree.leaves(out_n.cache)))
  hidden_diff = max(float(jnp.abs(out_1.hidden_BxTxD - out_n.hidden_BxTxD).max()),
                    float(jnp.abs(out_1.layer_hidden_LxBxTxD - out_n.layer_hidden_LxBxTxD).max()))
  return (float(jnp.abs(out_1.logits_BxRxV - out_n.logits_BxRxV).max()), cache_diff,
          float(jnp.abs(out_1.logits_BxRxV).max()), hidden_diff)


def main():
  # The tests' compiled programs on disk, as conftest.py keeps them (keyed by the 8
  # devices too): a later suite reads these ~40 programs back instead of compiling them.
  compile_cache.enable(compile_cache.default_dir().with_name('jax-compile-tests'),
                       min_compile_time_s=0.1)
  results = {'devices': jax.device_count()}
  for kv in (1, 2, 4):
    cfg = config_lib.tiny_config(num_kv_heads=kv)
    results[f'forward_kv{kv}'] = forward_max_diff(cfg, data=2, model_size=4)

  cfg = config_lib.tiny_config()
  params = gemma.init_params(cfg, jax.random.key(3))
  params = jax.tree.map(lambda x: x * 1.5, params)
  mesh = sharding.make_mesh(2, 4)
  one, many = LanguageModel(cfg), LanguageModel(cfg, mesh=mesh)
  sharded_params = sharding.shard_params(params, cfg, mesh)
  prompts = [[5, 9, 3], [7, 1, 2, 8, 4, 6, 1, 2], [11], [3, 3, 5, 2, 9]]
  greedy = sampling.SamplingConfig()
  ref = autoregressive.generate(one, params, prompts, max_new_tokens=12, sampling=greedy)
  got = autoregressive.generate(many, sharded_params, prompts, max_new_tokens=12, sampling=greedy)
  results['autoregressive'] = [ref.new_tokens, got.new_tokens]
  draft_cfg = config_lib.tiny_config(num_layers=2)
  draft_params = gemma.init_params(draft_cfg, jax.random.key(4))
  for name in ('ngram', 'early_exit', 'draft_model'):
    settings = {'layers': 2} if name == 'early_exit' else None
    one_d = make_drafter(name, target=one, settings=settings,
                         draft_model=(LanguageModel(draft_cfg), draft_params))
    many_d = make_drafter(name, target=many, settings=settings,
                          draft_model=(LanguageModel(draft_cfg, mesh=mesh),
                                       sharding.shard_params(draft_params, draft_cfg, mesh)))
    a = speculative.generate(one, params, one_d, prompts, gamma=3, max_new_tokens=12)
    b = speculative.generate(many, sharded_params, many_d, prompts, gamma=3, max_new_tokens=12)
    results[name] = [a.new_tokens, b.new_tokens, ref.new_tokens]
  # A token tree: the [T, T] tree mask is replicated into shard_map.
  tree = tree_lib.parse('eagle-25')
  a = speculative.generate(one, params, make_drafter('ngram', target=one), prompts,
                           gamma=tree.max_depth, max_new_tokens=12, tree=tree)
  b = speculative.generate(many, sharded_params, make_drafter('ngram', target=many), prompts,
                           gamma=tree.max_depth, max_new_tokens=12, tree=tree)
  results['ngram_tree'] = [a.new_tokens, b.new_tokens, ref.new_tokens]
  # Matrices from their int8 blocks (models/q8_weights), split like the matrices: on 2 model
  # shards every matrix's (o, Q4_K-like: 2 blocks a row; down, Q6_K-like: 4), on 4 all but o's.
  plain = gguf_like_params(params)
  tokens = jnp.asarray([[5, 9, 3, 7, 1], [2, 8, 4, 6, 1]] * 2)
  positions = jnp.broadcast_to(jnp.arange(5), tokens.shape)
  ar = autoregressive.generate(one, plain, prompts, max_new_tokens=12, sampling=greedy)
  for data, model_size in ((4, 2), (2, 4)):
    q8_mesh = sharding.make_mesh(data, model_size)
    q8_many = LanguageModel(cfg, mesh=q8_mesh)
    q8_params = q8_weights.with_q8_weights(plain, model_shards=model_size)
    attn = q8_params['layer_0']['attn']
    assert q8_weights.HEAD_FORM in q8_params and 'q_NHxD_q8' in attn
    assert ('o_DxNH_q8offset' in attn) == (model_size == 2), sorted(attn)
    assert 'down_DxF_q8' in q8_params['layer_0']['mlp']
    sharded_q8 = sharding.shard_params(q8_params, cfg, q8_mesh)
    calls = [jax.jit(lambda p, lm=lm: lm.forward(p, tokens, positions, lm.init_cache(4, 16)
                                                 ).logits_BxRxV) for lm in (one, q8_many)]
    logits = [calls[0](plain), calls[1](sharded_q8)]
    program = calls[1].lower(sharded_q8).as_text()
    offset_targets = (q8_matmul.OFFSET_TARGET, q8_amx.OFFSET_TARGET)   # o's Q4_K-like blocks
    results[f'forward_q8_model{model_size}'] = [
        float(jnp.abs(logits[0] - logits[1]).max()), q8_matmul.TARGET in program,
        any(t in program for t in offset_targets) == (model_size == 2),
        (q8_amx.TARGET in program) == q8_amx.available()]
    # Greedy's argmax from the head's argmax kernel, each shard its own rows of the table.
    greedy_calls = [jax.jit(lambda p, lm=lm: lm.forward(p, tokens, positions, lm.init_cache(4, 16),
                                                        greedy=True).argmax_BxR)
                    for lm in (one, q8_many)]
    results[f'greedy_q8_model{model_size}'] = [
        np.asarray(greedy_calls[0](q8_params)).tolist(),
        np.asarray(greedy_calls[1](sharded_q8)).tolist(),
        np.asarray(jnp.argmax(logits[1], axis=-1)).tolist(),
        q8_argmax.TARGET in greedy_calls[1].lower(sharded_q8).as_text(), q8_argmax.available()]
    if model_size == 2:   # the same with a table 64 wide: the AMX screen where it serves
      wide_cfg = config_lib.tiny_config(embed_dim=64)
      wide = gguf_like_params(gemma.init_params(wide_cfg, jax.random.key(3)))
      wide_q8 = q8_weights.with_q8_weights(wide, model_shards=model_size)
      wide_one, wide_many = LanguageModel(wide_cfg), LanguageModel(wide_cfg, mesh=q8_mesh)
      wide_calls = [jax.jit(lambda p, lm=lm, g=g: lm.forward(p, tokens, positions,
                                                             lm.init_cache(4, 16), greedy=g))
                    for lm, g in ((wide_one, False), (wide_many, True))]
      wide_sharded = sharding.shard_params(wide_q8, wide_cfg, q8_mesh)
      results['greedy_screen_model2'] = [
          np.asarray(jnp.argmax(wide_calls[0](wide_q8).logits_BxRxV, axis=-1)).tolist(),
          np.asarray(wide_calls[1](wide_sharded).argmax_BxR).tolist(),
          q8_argmax.SCREEN_TARGET in wide_calls[1].lower(wide_sharded).as_text(),
          q8_argmax.screen_available()]
    a = speculative.generate(one, q8_params, make_drafter('ngram', target=one), prompts,
                             gamma=3, max_new_tokens=12)
    b = speculative.generate(q8_many, sharded_q8, make_drafter('ngram', target=q8_many), prompts,
                             gamma=3, max_new_tokens=12)
    results[f'ngram_q8_model{model_size}'] = [a.new_tokens, b.new_tokens, ar.new_tokens]
  json.dump(results, sys.stdout)


if __name__ == '__main__':
  main()
