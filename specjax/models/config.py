"""Gemma 2 and Gemma 3 text architectures as frozen dataclasses.

Model code never sees a ConfigDict: the experiment converts its config once, at
the edge, into a `GemmaConfig` picked by name from `MODEL_CONFIGS`.

Sizes come from the published model cards and `config.json` files of the
Hugging Face checkpoints (text towers only for Gemma 3 4B/12B/27B).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

AttentionKind = Literal['global', 'local']


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """One Gemma text architecture.

  Attributes:
    family: 'gemma2' or 'gemma3'.
    num_layers: transformer blocks.
    embed_dim: model width D.
    num_heads: query heads N.
    num_kv_heads: key/value heads K (N % K == 0; K == 1 is MQA).
    head_dim: H.
    hidden_dim: MLP width F.
    vocab_size: V; the LM head is tied to the embedding.
    sliding_window: local layers attend to the last `sliding_window` positions.
    global_every: every `global_every`-th layer (1-based) is global; Gemma 2
      alternates (2), Gemma 3 has 5 local layers per global one (6).
    rope_base_global, rope_base_local: RoPE wavelengths of the two layer kinds.
    rope_scale_global: linear RoPE scaling of the global layers (positions are
      divided by it); Gemma 3 4B and larger were trained long-context with 8.
    query_pre_attn_scalar: queries are scaled by query_pre_attn_scalar**-0.5.
    attn_logit_softcap, final_logit_softcap: Gemma 2's tanh soft-capping
      (None disables it).
    use_qk_norm: Gemma 3 RMS-normalises queries and keys per head.
    rms_norm_eps: epsilon of every RMSNorm.
    max_position: longest context the model was trained for.
  """

  family: str
  num_layers: int
  embed_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  hidden_dim: int
  vocab_size: int
  sliding_window: int
  global_every: int
  rope_base_global: float
  rope_base_local: float
  query_pre_attn_scalar: float
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  use_qk_norm: bool = True
  rope_scale_global: float = 1.0
  rms_norm_eps: float = 1e-6
  max_position: int = 32768

  def __post_init__(self):
    for name in ('num_layers', 'embed_dim', 'num_heads', 'num_kv_heads',
                 'head_dim', 'hidden_dim', 'vocab_size', 'sliding_window',
                 'global_every'):
      if getattr(self, name) < 1:
        raise ValueError(f'GemmaConfig.{name} must be >= 1, got {getattr(self, name)}')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})')

  def attention_kind(self, layer: int) -> AttentionKind:
    return 'global' if (layer + 1) % self.global_every == 0 else 'local'

  @property
  def attention_kinds(self) -> tuple[AttentionKind, ...]:
    return tuple(self.attention_kind(i) for i in range(self.num_layers))

  def truncated(self, num_layers: int) -> GemmaConfig:
    """The same architecture with only its first `num_layers` blocks."""
    if not 1 <= num_layers <= self.num_layers:
      raise ValueError(f'num_layers must be in [1, {self.num_layers}], got {num_layers}')
    return dataclasses.replace(self, num_layers=num_layers)


def _gemma3(**kw) -> GemmaConfig:
  base = dict(family='gemma3', vocab_size=262_144, head_dim=256, global_every=6,
              rope_base_global=1_000_000.0, rope_base_local=10_000.0,
              query_pre_attn_scalar=256.0, use_qk_norm=True, sliding_window=1024,
              max_position=131_072)
  base.update(kw)
  return GemmaConfig(**base)


def _gemma2(**kw) -> GemmaConfig:
  base = dict(family='gemma2', vocab_size=256_000, head_dim=256, global_every=2,
              rope_base_global=10_000.0, rope_base_local=10_000.0,
              query_pre_attn_scalar=256.0, use_qk_norm=False, sliding_window=4096,
              attn_logit_softcap=50.0, final_logit_softcap=30.0, max_position=8192)
  base.update(kw)
  return GemmaConfig(**base)


MODEL_CONFIGS: dict[str, GemmaConfig] = {
    'gemma3-270m': _gemma3(num_layers=18, embed_dim=640, num_heads=4, num_kv_heads=1,
                           hidden_dim=2048, sliding_window=512, max_position=32_768),
    'gemma3-1b': _gemma3(num_layers=26, embed_dim=1152, num_heads=4, num_kv_heads=1,
                         hidden_dim=6912, sliding_window=512, max_position=32_768),
    'gemma3-4b': _gemma3(num_layers=34, embed_dim=2560, num_heads=8, num_kv_heads=4,
                         hidden_dim=10_240, rope_scale_global=8.0),
    'gemma3-12b': _gemma3(num_layers=48, embed_dim=3840, num_heads=16, num_kv_heads=8,
                          hidden_dim=15_360, rope_scale_global=8.0),
    'gemma3-27b': _gemma3(num_layers=62, embed_dim=5376, num_heads=32, num_kv_heads=16,
                          head_dim=128, hidden_dim=21_504, query_pre_attn_scalar=168.0,
                          rope_scale_global=8.0),
    'gemma2-2b': _gemma2(num_layers=26, embed_dim=2304, num_heads=8, num_kv_heads=4,
                         hidden_dim=9216),
    'gemma2-9b': _gemma2(num_layers=42, embed_dim=3584, num_heads=16, num_kv_heads=8,
                         hidden_dim=14_336),
    'gemma2-27b': _gemma2(num_layers=46, embed_dim=4608, num_heads=32, num_kv_heads=16,
                          head_dim=128, hidden_dim=36_864, query_pre_attn_scalar=144.0),
}


def get_model_config(name: str) -> GemmaConfig:
  try:
    return MODEL_CONFIGS[name]
  except KeyError:
    raise ValueError(
        f'unknown model {name!r}; known models: {", ".join(sorted(MODEL_CONFIGS))}') from None


def tiny_config(**overrides) -> GemmaConfig:
  """A Gemma-3-shaped model small enough for unit tests (runs in milliseconds)."""
  base = dict(family='gemma3', num_layers=4, embed_dim=32, num_heads=4, num_kv_heads=2,
              head_dim=16, hidden_dim=64, vocab_size=64, sliding_window=6, global_every=2,
              rope_base_global=10_000.0, rope_base_local=100.0, query_pre_attn_scalar=16.0,
              max_position=512)
  base.update(overrides)
  return GemmaConfig(**base)
