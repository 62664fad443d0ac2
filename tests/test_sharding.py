"""The forward and both decoding loops on a ('data', 'model') = (2, 4) mesh of 8
simulated CPU devices give what one device gives."""

import json
import os
import subprocess
import sys

import pytest

from specjax import sharding
from specjax.models import config as config_lib
from specjax.models.language_model import LanguageModel


@pytest.fixture(scope='module')
def sharded_results():
  env = dict(os.environ)
  env['XLA_FLAGS'] = env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  script = os.path.join(os.path.dirname(__file__), 'sharded_main.py')
  proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout)


def test_eight_devices_were_used(sharded_results):
  assert sharded_results['devices'] == 8


@pytest.mark.parametrize('kv_heads', [1, 2, 4])
def test_sharded_forward_matches_one_device(sharded_results, kv_heads):
  logits_diff, cache_diff, logits_scale, hidden_diff = sharded_results[f'forward_kv{kv_heads}']
  assert logits_scale > 1.0  # the comparison is not between two zero tensors
  assert logits_diff < 1e-4
  assert cache_diff < 1e-4
  assert hidden_diff < 1e-4  # final-norm and per-layer hidden states, through shard_map


def test_sharded_autoregressive_greedy_matches_one_device(sharded_results):
  one, many = sharded_results['autoregressive']
  assert one == many


@pytest.mark.parametrize('model_size', [2, 4])
def test_sharded_forward_from_int8_forms_matches_one_device(sharded_results, model_size):
  max_diff, kernel_in_program, offsets_where_they_divide, amx_where_available = sharded_results[
      f'forward_q8_model{model_size}']
  assert kernel_in_program  # each device's part of each matrix, from its int8 blocks
  assert offsets_where_they_divide  # o's Q4_K-like blocks on 2 shards, not on 4
  assert amx_where_available  # each device's tiles of the layer matrices (test_q8_amx)
  assert max_diff < 1e-4


@pytest.mark.parametrize('model_size', [2, 4])
def test_sharded_greedy_argmax_matches_one_device(sharded_results, model_size):
  one, many, from_logits, kernel_in_program, available = sharded_results[
      f'greedy_q8_model{model_size}']
  assert many == one == from_logits
  assert kernel_in_program == available   # each shard's argmax, the largest of them kept


def test_sharded_greedy_argmax_from_the_screen_matches_the_logits(sharded_results):
  """A head 64 wide split over 2 model shards: each shard's screen finds its rows' best, the
  largest kept; the same as the argmax of the whole logits."""
  from_logits, many, screen_in_program, available = sharded_results['greedy_screen_model2']
  assert many == from_logits
  assert screen_in_program == available


@pytest.mark.parametrize('drafter', ['ngram', 'early_exit', 'draft_model', 'ngram_tree',
                                     'ngram_q8_model2', 'ngram_q8_model4'])
def test_sharded_speculative_greedy_matches_one_device(sharded_results, drafter):
  one, many, autoregressive = sharded_results[drafter]
  assert many == one
  assert one == autoregressive


def test_mesh_must_divide_heads():
  cfg = config_lib.tiny_config(num_heads=4, num_kv_heads=1)
  mesh = sharding.make_mesh(1, 1)
  LanguageModel(cfg, mesh=mesh)  # fine
  with pytest.raises(ValueError, match='num_heads=4 is not divisible by the model axis size 3'):
    sharding.check_divisible(cfg, 3)


def test_mesh_larger_than_devices_is_refused():
  with pytest.raises(ValueError, match='needs 64 devices'):
    sharding.make_mesh(8, 8)
