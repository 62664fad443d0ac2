"""A jax.profiler trace of target calls over the given widths (batch 1), XLA's op times summed by
name. Profiling inflates wall time; read the op times. `python profile_call.py 1,9 512`."""
import collections, glob, gzip, json, re, sys, tempfile
import jax
from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models.language_model import LanguageModel

config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
model, params = LanguageModel(config), jax.device_put(params)
widths = [int(w) for w in sys.argv[1].split(',')]
slots = int(sys.argv[2]) if len(sys.argv) > 2 else 512
for w in widths:
  fn = step_costs._call_run(model, params, w, batch=1, num_slots=slots)
  fn().block_until_ready(); fn().block_until_ready()
  d = tempfile.mkdtemp(prefix=f'profile-w{w}-')
  with jax.profiler.trace(d, create_perfetto_trace=True):
    for _ in range(3):
      fn().block_until_ready()
  path = sorted(glob.glob(f'{d}/**/*.trace.json.gz', recursive=True))[-1]
  ev = json.load(gzip.open(path))['traceEvents']
  tot = collections.Counter(); cnt = collections.Counter()
  for e in ev:   # leaf ops only, by kind: dot.1496 and dot.1375 are both 'dot'
    if e.get('ph') == 'X' and 'dur' in e and not e['name'].startswith(
        ('ThunkExecutor', 'while', '$', 'Pjit', 'end:')):
      kind = re.sub(r'\.\d+$', '', e['name'])
      tot[kind] += e['dur']; cnt[kind] += 1
  calls = 3 * step_costs._STEPS
  print(f'\n== width {w}: leaf ops {sum(tot.values()) / calls / 1e3:.1f} ms per call')
  for kind, us in tot.most_common(12):
    print(f'{us / calls / 1e3:8.2f} ms  x{cnt[kind] / calls:6.1f}  {kind}')
