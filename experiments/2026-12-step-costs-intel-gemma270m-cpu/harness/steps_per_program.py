"""Seconds per call of the served greedy 270M (q8 forms, batch 1, 512 slots) as `step_costs`
times it, with 4 and with 16 calls per timed program, three interleaved rounds, best of each.
If a timed program pays a fixed cost beside its calls (a cache made at every run), the
4-call figures come out above the 16-call ones; if not, they agree.
`python steps_per_program.py` (from the repository root)."""
import jax
from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel

config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
model = LanguageModel(config)
params = jax.device_put(q8_weights.with_q8_weights(params, q8_weights.SPLITTABLE))
best = {}
for _ in range(3):
  for steps in (4, 16):
    step_costs._STEPS = steps  # pylint: disable=protected-access
    for width in (1, 5, 9):
      jax.clear_caches()
      seconds = step_costs.seconds_per_call(model, params, width, batch=1, num_slots=512,
                                            greedy=True)
      best[steps, width] = min(best.get((steps, width), float('inf')), seconds)
for steps in (4, 16):
  decode = best[steps, 1]
  print(f'{steps:2d} calls a program: ' + ', '.join(
      f'{w} positions {best[steps, w] * 1e3:.2f} ms ({best[steps, w] / decode:.2f})'
      for w in (1, 5, 9)))
