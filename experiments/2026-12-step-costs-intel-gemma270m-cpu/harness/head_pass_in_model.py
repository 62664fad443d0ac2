"""A greedy call of the served 270M (int8 forms, batch 1, 512 slots) with the head's argmax from
the q8_argmax first pass against the same params without its tiles (the logits and their
argmax), in one process, interleaved rounds, best of each. Run it under
`SPECJAX_CPU_KERNELS_MARCH=haswell XLA_FLAGS=--xla_cpu_max_isa=AVX2` for an AVX2 CPU's path.
`python head_pass_in_model.py` (from the repository root)."""
import jax
from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel

config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
model = LanguageModel(config)
with_pass = q8_weights.without_head_screen(q8_weights.with_q8_weights(params, q8_weights.SPLITTABLE))
assert all(n in with_pass for n in q8_weights.HEAD_TILE_ARRAYS), 'no first pass here'
logits_only = {k: v for k, v in with_pass.items() if k not in q8_weights.HEAD_TILE_ARRAYS}
forms = {'first pass': jax.device_put(with_pass), 'logits': jax.device_put(logits_only)}
widths = (1, 5, 9)
best = {}
for _ in range(4):
  for name, p in forms.items():
    for w in widths:
      s = step_costs.seconds_per_call(model, p, w, batch=1, num_slots=512, greedy=True)
      best[name, w] = min(best.get((name, w), float('inf')), s)
for name in forms:
  print(f'{name:10s} ' + ', '.join(f'{w} positions {best[name, w] * 1e3:.1f} ms '
                                   f'({best[name, w] / best[name, 1]:.2f})' for w in widths))
