"""Megatron-style sharding of the Gemma forward over a ('data', 'model') mesh.

Rows are split over 'data'; query heads, MLP width and vocabulary over
'model'. K/V heads are split too when their count divides the axis size, and
replicated otherwise (Gemma 3 270M and 1B have a single K/V head). The rules
are a table keyed by parameter name, so a new weight needs one line here.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specjax.models import q8_weights
from specjax.models.config import GemmaConfig

MESH_AXES = ('data', 'model')


def make_mesh(data: int, model: int, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  if data < 1 or model < 1:
    raise ValueError(f'mesh axes must be >= 1, got data={data} model={model}')
  if data * model > len(devices):
    raise ValueError(f'a data={data} x model={model} mesh needs {data * model} devices, '
                     f'only {len(devices)} are available')
  # Auto axes: GSPMD places the loop's own arrays; shard_map is explicit where it matters.
  auto = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, model), MESH_AXES, axis_types=auto, devices=devices[:data * model])


def _kv_split(config: GemmaConfig, model_size: int) -> str | None:
  return 'model' if config.num_kv_heads % model_size == 0 else None


def check_divisible(config: GemmaConfig, model_size: int) -> None:
  for name, size in (('num_heads', config.num_heads), ('hidden_dim', config.hidden_dim),
                     ('vocab_size', config.vocab_size)):
    if size % model_size:
      raise ValueError(f'{name}={size} is not divisible by the model axis size {model_size}')


def param_specs(params, config: GemmaConfig, model_size: int):
  """A PartitionSpec for every parameter, chosen by its name."""
  kv = _kv_split(config, model_size)
  rules = {
      'embedding_VxD': P('model', None),
      'q_NHxD': P('model', None),       # heads are contiguous row blocks
      'k_KHxD': P(kv, None),
      'v_KHxD': P(kv, None),
      'o_DxNH': P(None, 'model'),
      'gate_FxD': P('model', None),
      'up_FxD': P('model', None),
      'down_DxF': P(None, 'model'),
      'scale': P(),
  }

  def spec(path, leaf):
    name = path[-1].key
    # A matrix's int8 form (models/q8_weights.py) is split like the matrix; a matrix split
    # by its input (o, down) must leave each shard whole blocks of its scales.
    name = q8_weights.base_name(name)
    if name not in rules:
      raise ValueError(f'no sharding rule for parameter {jax.tree_util.keystr(path)}')
    for axis, part in enumerate(rules[name]):
      if part == 'model' and name != path[-1].key and np.shape(leaf)[axis] % model_size:
        raise ValueError(f'{jax.tree_util.keystr(path)}: its {np.shape(leaf)[axis]} blocks a row '
                         f'do not split over the model axis size {model_size}; serve this '
                         'model without int8 forms (q8_weights) or on another mesh')
    return rules[name]
  return jax.tree_util.tree_map_with_path(spec, params)


def cache_specs(cache, config: GemmaConfig, model_size: int):
  spec = P('data', None, _kv_split(config, model_size), None)
  return jax.tree.map(lambda _: spec, cache)


def shard_params(params, config: GemmaConfig, mesh: Mesh):
  specs = param_specs(params, config, mesh.shape['model'])
  return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)
