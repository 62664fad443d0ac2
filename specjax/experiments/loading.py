"""Model, parameters and tokenizer for an experiment, placed on its mesh.

The tokenizer comes from the checkpoint when it carries one (a GGUF file's
metadata, a Hugging Face directory's tokenizer.model); `config.tokenizer`
overrides that and is required for checkpoints without one. The tokenizer is
read on its own, before any weight, so prompt lengths are checked first.
"""

from __future__ import annotations

import functools
import os
import pathlib

import jax
import jax.numpy as jnp

from specjax import checkpoints
from specjax import sharding
from specjax.drafters import TRAINED_DRAFTERS
from specjax.checkpoints import embedded
from specjax.experiments import tiny
from specjax.experiments.config import EMBEDDED_PREFIX, TINY_RANDOM, ConfigError, ExperimentConfig
from specjax.models import language_model
from specjax.models import q8_weights
from specjax.tokenizer import Tokenizer


def load(config: ExperimentConfig):
  """(LanguageModel, params) for `config.model`.

  The last model loaded stays in memory, so the points of a sweep, or a
  notebook's second run, do not read the checkpoint again.
  """
  return _load(config.model, config.seed if config.model == TINY_RANDOM else 0,
               config.mesh_data, config.mesh_model)


@functools.lru_cache(maxsize=1)
def _load(model: str, seed: int, mesh_data: int, mesh_model: int):
  forms = None
  if model == TINY_RANDOM:
    model_config, params, _ = tiny.load(seed)
  else:
    model_config, params = checkpoints.load_checkpoint(model)
    forms = cached_forms(model, params)
  mesh = sharding.make_mesh(mesh_data, mesh_model) if mesh_data * mesh_model > 1 else None
  return _place(model_config, params, mesh, forms)


# Bump when what `q8_weights.all_forms` stores changes.
Q8_FORMS_VERSION = 5   # 2: the head's tile layout for q8_argmax too; 3: q8_amx's tiles;
#                         4: the head's AMX screen table where the CPU has AMX-INT8;
#                         5: the head's tiles on AVX2 CPUs too


def cached_forms(model: str, params):
  """The int8 forms of a checkpoint's matrices, split once and kept in the weight cache
  (`weight_cache.derived_arrays`), or None where no form would serve."""
  if not q8_weights.serves():
    return None
  from specjax.checkpoints import weight_cache  # pylint: disable=g-import-not-at-top
  return weight_cache.derived_arrays('q8forms', Q8_FORMS_VERSION,
                                     checkpoints.content_digest(model),
                                     lambda: q8_weights.all_forms(params))


def tokenizer(config: ExperimentConfig):
  """The run's tokenizer, read before the model so that prompt lengths are checked first."""
  if config.model == TINY_RANDOM:
    return tiny.ByteTokenizer()
  key, path = (('tokenizer', config.tokenizer) if config.tokenizer
               else ('model', _tokenizer_source(config.model)))
  try:
    return load_tokenizer(path)
  except (OSError, ValueError) as e:
    raise ConfigError(f'config.{key} is {getattr(config, key)!r}: no usable tokenizer in '
                      f'{path} ({e})') from None


def checkpoint_digests(config: ExperimentConfig) -> dict[str, str]:
  """{'model': sha256, 'draft_model': sha256 when that drafter runs}: what resumed rows match."""
  names = {'model': config.model} if config.model != TINY_RANDOM else {}
  if 'draft_model' in config.networks:
    names['draft_model'] = draft_model_path(config.draft_model['checkpoint'])
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  for name in TRAINED_DRAFTERS:
    if name in config.networks:
      names[name] = str(drafter_io.resolve(getattr(config, name)['checkpoint'], name))
  return {key: checkpoints.content_digest(name) for key, name in names.items()}


def draft_model_path(checkpoint: str) -> str:
  """config.draft_model.checkpoint as a path: 'embedded' is the distilled drafter shipped
  for the embedded 270M."""
  if checkpoint != 'embedded':
    return checkpoint
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  return str(drafter_io.resolve(checkpoint, 'distilled'))


def load_draft_model(config: ExperimentConfig, target: language_model.LanguageModel,
                     target_params):
  """The 'draft_model' drafter's (LanguageModel, params), placed like the target: a
  model checkpoint, or a distilled drafter's directory (`python -m specjax.train
  --config=configs/train_distilled.py`), checked against the target it was trained
  for; its student shares the target's embedding, and its draft vocabulary ids come
  third."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  path = draft_model_path(config.draft_model['checkpoint'])
  if not os.path.isfile(os.path.join(path, drafter_io.MANIFEST)):
    model_config, params = checkpoints.load_checkpoint(path)
    return _place(model_config, params, target.mesh, cached_forms(path, params))
  from specjax.training import distilled_objective  # pylint: disable=g-import-not-at-top
  sha = '' if config.model == TINY_RANDOM else checkpoints.content_digest(config.model)
  weights, vocab_ids, manifest = drafter_io.load_drafter(
      path, 'distilled', target=drafter_io.target_signature(target.config, sha))
  layers = manifest.get('student_layers')
  if not isinstance(layers, int):
    raise checkpoints.CheckpointError(f'{path}: the manifest names no student_layers')
  try:
    student = distilled_objective.student_config(target.config, layers)
  except ValueError as e:
    raise checkpoints.CheckpointError(f'{path}: {e}') from None
  params = distilled_objective.student_params(jax.tree.map(jnp.asarray, weights),
                                              target_params['embedding_VxD'])
  # The table's int8 form too, where the target has one, rather than splitting it again.
  params.update({k: target_params[k] for k in (q8_weights.HEAD_FORM, q8_weights.HEAD_SCALE)
                 if k in target_params})
  return (*_place(student, params, target.mesh), vocab_ids)


def load_trained_drafter(config: ExperimentConfig, target: language_model.LanguageModel,
                         name: str):
  """(weights, draft vocabulary ids or None, manifest) of a trained drafter ('medusa',
  'eagle'), checked against the target it was trained for."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  sha = '' if config.model == TINY_RANDOM else checkpoints.content_digest(config.model)
  return drafter_io.load_drafter(getattr(config, name)['checkpoint'], name,
                                 target=drafter_io.target_signature(target.config, sha))


def _place(model_config, params, mesh, forms=None):
  # int8 blocks read where a matrix is exactly that
  params = q8_weights.with_q8_weights(
      params, model_shards=1 if mesh is None else mesh.shape['model'], forms=forms)
  if mesh is None:  # One shared instance per config, so jit caches hit across runs.
    return language_model.single_device(model_config), params
  model = language_model.LanguageModel(model_config, mesh)
  return model, sharding.shard_params(params, model_config, mesh)


def load_tokenizer(path: str):
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / 'tokenizer.model'
  if path.suffix == '.gguf':
    return Tokenizer.from_gguf(path)
  return Tokenizer.from_model_file(path)


def _tokenizer_source(model: str) -> str:
  if model.startswith(EMBEDDED_PREFIX):
    return str(embedded.default_gguf_path())
  if model.endswith('.gguf') or os.path.isfile(os.path.join(model, 'tokenizer.model')):
    return model
  raise ConfigError(f'config.tokenizer is empty and {model} holds no tokenizer (no GGUF, no '
                    'tokenizer.model): set --config.tokenizer to a .gguf or tokenizer.model')
