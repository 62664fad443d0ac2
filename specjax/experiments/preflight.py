"""What is checked before a model loads, beyond the config's own values.

The output directory, the device count against the mesh, the self-drafters'
layers (early exit's depth, layer skipping's set) against the target's (read
from its name or file header), a draft vocabulary file against the tokenizer,
and each prompt's KV cache room: its
tokens, `max_new_tokens` and the verify slots must fit in `max_cache_len`.
Found later, inside a compiled batch, the same faults cost the weight load
and name a prompt by its batch index. A prompt that does not fit stops the
run, naming it, or with `too_long='skip'` is recorded as skipped for every
method, so the methods are still compared on the same prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import json
import os
from pathlib import Path

from absl import logging
import jax

from specjax.checkpoints import gguf_header
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.drafters import layer_skip as layer_skip_lib
from specjax.experiments.config import BASELINE, TINY_RANDOM, ConfigError, ExperimentConfig
from specjax.models import config as model_configs


def verify_slots(config: ExperimentConfig, method: str) -> int:
  """Cache slots a step may write past the last committed token: gamma + 1 for a
  speculative verify step (a token tree's nodes + 1 with `config.tree`), 1 for a
  decode step (whose entry is written twice). The one place that knows this;
  `methods.py` packs batches with it too."""
  if method == BASELINE:
    return 1
  tree = config.token_tree
  return config.gamma + 1 if tree is None else tree.num_nodes + 1


def slots_needed(config: ExperimentConfig, prompt_tokens: int) -> tuple[int, int]:
  """(cache slots, verify slots) a prompt of `prompt_tokens` needs under every method."""
  extra = max(verify_slots(config, m) for m in config.methods)
  return prompt_tokens + config.max_new_tokens + extra, extra


def check_config(config: ExperimentConfig) -> None:
  """The output directory, the mesh against the devices, the token budget against the cache."""
  _check_output_dir(config.output_dir)
  devices = jax.devices()
  wanted = config.mesh_data * config.mesh_model
  if wanted > len(devices):
    raise ConfigError(
        f'config.mesh_data={config.mesh_data} x config.mesh_model={config.mesh_model} needs '
        f'{wanted} devices; this machine has {len(devices)} ({devices[0].platform})')
  _check_early_exit_layers(config)
  _check_layer_skip(config)
  needed, extra = slots_needed(config, 1)  # a prompt is at least its BOS
  if needed > config.max_cache_len:
    raise ConfigError(
        f'config.max_new_tokens is {config.max_new_tokens}: with {extra} verify slots even a '
        f'one-token prompt needs {needed} cache slots, more than config.max_cache_len '
        f'({config.max_cache_len})')


def _check_output_dir(output_dir: str) -> None:
  """A directory, or creatable under a writable one; nothing is created yet."""
  target = os.path.abspath(output_dir)
  if os.path.exists(target) and not os.path.isdir(target):
    raise ConfigError(f'config.output_dir is {output_dir!r}, which is a file')
  parent = target
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f'config.output_dir is {output_dir!r}, but {parent} is a file')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f'config.output_dir is {output_dir!r}, but {parent} is not writable')


def fit_prompts(config: ExperimentConfig, prompt_ids: Sequence[str],
                token_ids: Mapping[str, Sequence[int]]) -> dict[str, str]:
  """{prompt id: why} for prompts to skip; raises unless `config.too_long` is 'skip'."""
  too_long = {}
  for prompt_id in prompt_ids:
    n = len(token_ids[prompt_id])
    needed, extra = slots_needed(config, n)
    if needed > config.max_cache_len:
      too_long[prompt_id] = (f'{n} prompt tokens + max_new_tokens {config.max_new_tokens} + '
                             f'{extra} verify slots = {needed} cache slots > max_cache_len '
                             f'{config.max_cache_len}')
  if not too_long:
    return {}
  if config.too_long == 'skip':
    for prompt_id, why in too_long.items():
      logging.warning('skipping prompt %s: %s', prompt_id, why)
    return too_long
  (first, why), more = next(iter(too_long.items())), len(too_long) - 1
  others = f' (and {more} more: {", ".join(list(too_long)[1:6])}{", ..." if more > 5 else ""})'
  raise ConfigError(
      f'config.max_cache_len is {config.max_cache_len}: prompt {first!r} does not fit ({why})'
      f'{others if more else ""}; raise max_cache_len, lower max_new_tokens, or set '
      'config.too_long=skip to skip such prompts')


def model_layers(model: str) -> int | None:
  """The target's layer count from its name or file header, before any weights load;
  None when only loading it would tell (the loaders check again)."""
  if model.startswith('embedded:'):
    return model_configs.get_model_config(model.partition(':')[2]).num_layers
  path = Path(model)
  if path.is_file():
    fields = gguf_header.read_scalars(path) or {}
    layers = fields.get(f'{fields.get("general.architecture", "")}.block_count')
    return int(layers) if isinstance(layers, int) else None
  hf_config = path / 'config.json'
  if hf_config.is_file():
    try:
      values = json.loads(hf_config.read_text(encoding='utf-8'))
    except (OSError, ValueError):
      return None  # the loader names the problem
    values = values.get('text_config', values)
    layers = values.get('num_hidden_layers')
    return layers if isinstance(layers, int) else None
  return None


def _check_early_exit_layers(config: ExperimentConfig) -> None:
  if 'early_exit' not in config.networks or config.model == TINY_RANDOM:
    return
  layers = config.early_exit.get('layers', 4)
  total = model_layers(config.model)
  if total is not None and not 1 <= layers < total:
    raise ConfigError(f'config.early_exit.layers is {layers}: the target {config.model} has '
                      f'{total} layers, so it must be in [1, {total - 1}]')


def _check_layer_skip(config: ExperimentConfig) -> None:
  if 'layer_skip' not in config.networks:
    return
  if config.model == TINY_RANDOM:
    total = model_configs.tiny_config().num_layers
  else:
    total = model_layers(config.model)
  if total is None:
    return  # the drafter checks again once the model is loaded
  settings = config.drafter_settings('layer_skip')
  fields = (None if not config.model.startswith('embedded:') else
            _model_fields(model_configs.get_model_config(config.model.partition(':')[2])))
  try:
    layer_skip_lib.skip_set(settings, total, fields)
  except ValueError as e:
    raise ConfigError(f'{e} (target {config.model})') from None


def _model_fields(model_config) -> dict:
  return dict(num_layers=model_config.num_layers, embed_dim=model_config.embed_dim,
              vocab_size=model_config.vocab_size)


def check_draft_vocab(config: ExperimentConfig, tokenizer) -> None:
  """Each self-drafter's draft vocabulary file, read and matched to the run's tokenizer
  by fingerprint, before any weight loads."""
  fingerprint = None
  for name in ('early_exit', 'layer_skip'):
    settings = config.drafter_settings(name)
    if name not in config.networks or not settings.draft_vocab:
      continue
    path = draft_vocab_lib.resolve_path(settings.draft_vocab)
    try:
      vocab = draft_vocab_lib.load(path)
    except ValueError as e:
      raise ConfigError(f'config.{name}.draft_vocab is {settings.draft_vocab!r}: {e}') from None
    fingerprint = fingerprint or draft_vocab_lib.tokenizer_fingerprint(tokenizer)
    if vocab.tokenizer != fingerprint:
      raise ConfigError(
          f'config.{name}.draft_vocab is {settings.draft_vocab!r}: {path} belongs to another '
          f'tokenizer (its fingerprint {vocab.tokenizer}, this run\'s tokenizer {fingerprint})')


def check_model(config: ExperimentConfig, max_position: int) -> None:
  """After loading: the cache cannot outgrow the model's context."""
  if config.max_cache_len > max_position:
    raise ConfigError(f'config.max_cache_len is {config.max_cache_len}, more than the model\'s '
                      f'context ({max_position} positions): set it to at most {max_position}')
