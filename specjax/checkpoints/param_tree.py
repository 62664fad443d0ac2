"""The parameter tree as flat, dotted leaf names, and its check against a config.

Loaders build the tree leaf by leaf and the weight cache stores one file per
leaf; both need one spelling of a leaf's name ('layer_0.attn.q_NHxD'). Every
loader ends with `check_params`, so a tree that reaches the model always has
exactly the leaves and shapes `param_shapes(config)` says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specjax.checkpoints.errors import CheckpointError
from specjax.models import gemma
from specjax.models.config import GemmaConfig

SEPARATOR = '.'


def flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, dict):
      flat.update(flatten(value, name + SEPARATOR))
    else:
      flat[name] = value
  return flat


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *parents, leaf = name.split(SEPARATOR)
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def expected_shapes(config: GemmaConfig) -> dict[str, tuple[int, ...]]:
  """Leaf name -> shape, traced with `jax.eval_shape` (no memory is allocated)."""
  return {name: tuple(s.shape) for name, s in flatten(gemma.param_shapes(config)).items()}


def check_params(params: dict[str, Any], config: GemmaConfig, source: object) -> None:
  """Raises CheckpointError unless `params` has exactly the leaves and shapes of `config`."""
  want = expected_shapes(config)
  have = {name: tuple(np.shape(x)) for name, x in flatten(params).items()}
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  if missing or extra:
    raise CheckpointError(f'{source}: parameters do not match the model config: '
                          f'missing {missing}, unexpected {extra}')
  wrong = [f'{n} {have[n]} (expected {want[n]})' for n in sorted(want) if have[n] != want[n]]
  if wrong:
    raise CheckpointError(f'{source}: wrong parameter shapes: {"; ".join(wrong)}')
