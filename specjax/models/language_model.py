"""A Gemma architecture bound to how it runs: one device, or shard_map on a mesh.

Decoding loops only call `forward` and `init_cache`; whether the model is
split over a ('data', 'model') mesh is invisible to them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specjax import sharding
from specjax.models import gemma
from specjax.models import kv_cache as kv_cache_lib
from specjax.models import q8_weights
from specjax.models.config import GemmaConfig
from specjax.models.gemma import ForwardOutput, Transformer

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class LanguageModel:
  """`forward(params, tokens_BxT, positions_BxT, cache, logit_indices_BxR=None,
  num_layers=None, hidden_layers=(), skip_layers=(), logits=True, tree_mask=None,
  greedy=False) -> gemma.ForwardOutput` (float32 logits, the new cache, hidden states).
  `skip_layers` run as the identity; `logits=False` skips the head; `tree_mask`
  ([T, T] or [B, T, T]) verifies a token tree; `greedy` adds each scored position's
  argmax, and may leave the logits None (see `gemma.Transformer`)."""

  config: GemmaConfig
  mesh: Mesh | None = None
  cache_dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    if self.mesh is not None:
      if tuple(self.mesh.axis_names) != sharding.MESH_AXES:
        raise ValueError(f'mesh axes must be {sharding.MESH_AXES}, got {self.mesh.axis_names}')
      sharding.check_divisible(self.config, self.mesh.shape['model'])

  @property
  def data_parallelism(self) -> int:
    return 1 if self.mesh is None else self.mesh.shape['data']

  def init_cache(self, batch: int, num_slots: int):
    cache = kv_cache_lib.init(self.config, batch, num_slots, self.cache_dtype)
    if self.mesh is None:
      return cache
    specs = sharding.cache_specs(cache, self.config, self.mesh.shape['model'])
    return jax.tree.map(
        lambda x, s: jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, s)),
        cache, specs)

  def forward(self, params, tokens_BxT: Array, positions_BxT: Array, cache,
              logit_indices_BxR: Array | None = None, num_layers: int | None = None,
              hidden_layers: tuple[int, ...] = (), skip_layers: tuple[int, ...] = (),
              logits: bool = True, tree_mask: Array | None = None,
              greedy: bool = False) -> ForwardOutput:
    depth = self.config.num_layers if num_layers is None else num_layers
    bad = [i for i in hidden_layers if not 0 <= i < depth]
    if bad:
      raise ValueError(f'hidden_layers {bad} are outside the {depth} layers this pass runs')
    hidden_layers = tuple(sorted(set(hidden_layers)))
    bad = [i for i in skip_layers if not 0 <= i < self.config.num_layers]
    if bad:
      raise ValueError(f'skip_layers {bad} are outside the model\'s {self.config.num_layers} '
                       'layers')
    skip_layers = tuple(sorted(set(skip_layers)))
    if self.mesh is None:
      return Transformer(self.config).apply(
          {'params': params}, tokens_BxT, positions_BxT, cache, logit_indices_BxR, num_layers,
          hidden_layers, skip_layers, logits, tree_mask, greedy)
    return self._sharded_forward(params, tokens_BxT, positions_BxT, cache,
                                 logit_indices_BxR, num_layers, hidden_layers, skip_layers,
                                 logits, tree_mask, greedy)

  def _sharded_forward(self, params, tokens_BxT, positions_BxT, cache, logit_indices_BxR,
                       num_layers, hidden_layers, skip_layers=(), logits=True, tree_mask=None,
                       greedy=False):
    model_size = self.mesh.shape['model']
    p_specs = sharding.param_specs(params, self.config, model_size)
    c_specs = sharding.cache_specs(cache, self.config, model_size)
    rows = P('data')
    module = Transformer(self.config, model_axis='model', model_shards=model_size)

    def local(params, tokens, positions, cache, indices, tree_mask):
      return module.apply({'params': params}, tokens, positions, cache, indices, num_layers,
                          hidden_layers, skip_layers, logits, tree_mask, greedy)

    # After each psum the hidden states are whole on every 'model' shard.
    logits_spec = P('data', None, None) if logits else None
    if logits and greedy:   # where the argmax kernel serves, no logits come back
      local_rows = tokens_BxT.shape[0] // self.mesh.shape['data'] * (
          tokens_BxT.shape[1] if logit_indices_BxR is None else logit_indices_BxR.shape[1])
      if gemma.head_argmax_serves(local_rows, q8_weights.has_head_argmax_form(params),
                                  self.config):
        logits_spec = None
    out_specs = ForwardOutput(logits_spec, c_specs, P('data', None, None),
                              P(None, 'data', None, None) if hidden_layers else None,
                              P('data', None) if logits and greedy else None)
    # A [T, T] tree mask is the same for every row (replicated); [B, T, T] splits by rows.
    mask_spec = None if tree_mask is None else (P() if tree_mask.ndim == 2 else rows)
    fn = jax.shard_map(
        local, mesh=self.mesh,
        in_specs=(p_specs, rows, rows, c_specs, None if logit_indices_BxR is None else rows,
                  mask_spec),
        out_specs=out_specs, check_vma=False)
    return fn(params, tokens_BxT, positions_BxT, cache, logit_indices_BxR, tree_mask)


@functools.cache
def single_device(config: GemmaConfig) -> LanguageModel:
  return LanguageModel(config)
