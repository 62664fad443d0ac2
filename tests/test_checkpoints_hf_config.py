"""GemmaConfig from Hugging Face config.json files as they are published.

Hugging Face leaves out whatever equals the transformers defaults and has
changed how it spells RoPE settings; each published form must still give the
named config of its model.
"""

from __future__ import annotations

import pytest

from specjax.checkpoints import hf_config
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import MODEL_CONFIGS


GEMMA3_1B_CONFIG = {
    'architectures': ['Gemma3ForCausalLM'], 'attn_logit_softcapping': None,
    'final_logit_softcapping': None, 'head_dim': 256, 'hidden_activation': 'gelu_pytorch_tanh',
    'hidden_size': 1152, 'intermediate_size': 6912, 'max_position_embeddings': 32768,
    'model_type': 'gemma3_text', 'num_attention_heads': 4, 'num_hidden_layers': 26,
    'num_key_value_heads': 1, 'query_pre_attn_scalar': 256, 'rms_norm_eps': 1e-06,
    'rope_local_base_freq': 10000, 'rope_scaling': None, 'rope_theta': 1000000,
    'sliding_window': 512, 'sliding_window_pattern': 6, 'vocab_size': 262144}
GEMMA2_2B_CONFIG = {
    'architectures': ['Gemma2ForCausalLM'], 'attn_logit_softcapping': 50.0,
    'final_logit_softcapping': 30.0, 'head_dim': 256, 'hidden_size': 2304,
    'intermediate_size': 9216, 'max_position_embeddings': 8192, 'model_type': 'gemma2',
    'num_attention_heads': 8, 'num_hidden_layers': 26, 'num_key_value_heads': 4,
    'query_pre_attn_scalar': 256, 'rms_norm_eps': 1e-06, 'rope_theta': 10000.0,
    'sliding_window': 4096, 'vocab_size': 256000}
# transformers 5 spells RoPE per layer kind and the pattern as layer_types.
GEMMA3_1B_CONFIG_V5 = {
    **{k: v for k, v in GEMMA3_1B_CONFIG.items() if k not in (
        'rope_theta', 'rope_local_base_freq', 'rope_scaling', 'sliding_window_pattern')},
    'rope_parameters': {'full_attention': {'rope_type': 'default', 'rope_theta': 1e6},
                        'sliding_attention': {'rope_type': 'default', 'rope_theta': 1e4}},
    'layer_types': ['full_attention' if (i + 1) % 6 == 0 else 'sliding_attention'
                    for i in range(26)]}


@pytest.mark.parametrize('hf, name', [(GEMMA3_1B_CONFIG, 'gemma3-1b'),
                                      (GEMMA2_2B_CONFIG, 'gemma2-2b'),
                                      (GEMMA3_1B_CONFIG_V5, 'gemma3-1b')])
def test_published_hf_configs_give_the_named_configs(hf, name):
  assert hf_config.config_from_hf(hf, 'config.json') == MODEL_CONFIGS[name]


def test_multimodal_text_config_falls_back_on_transformers_defaults():
  # Gemma 3 4B's config.json lists little more than the sizes of its text tower.
  hf = {'model_type': 'gemma3', 'text_config': {
      'hidden_size': 2560, 'intermediate_size': 10240, 'model_type': 'gemma3_text',
      'num_hidden_layers': 34, 'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},
      'sliding_window': 1024}}
  config = hf_config.config_from_hf(hf, 'config.json')
  assert (config.num_heads, config.num_kv_heads, config.head_dim) == (8, 4, 256)
  assert (config.vocab_size, config.global_every, config.max_position) == (262_208, 6, 131_072)
  assert (config.rope_base_global, config.rope_base_local) == (1e6, 1e4)
  with pytest.raises(CheckpointError, match='config.json.*llama'):
    hf_config.config_from_hf({'model_type': 'llama'}, 'config.json')
