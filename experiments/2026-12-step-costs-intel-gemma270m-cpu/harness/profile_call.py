"""A jax.profiler trace of the served greedy forward (the int8 forms, batch 1) over the given
widths, each op's time summed by kind and each FFI call by its kernel. Profiling inflates wall
time; read the shares. `python profile_call.py 1,5,9 512` (from the repository root)."""
import collections, glob, gzip, json, re, sys, tempfile
import jax
from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel

config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
model = LanguageModel(config)
params = jax.device_put(q8_weights.with_q8_weights(params, q8_weights.SPLITTABLE))
widths = [int(w) for w in sys.argv[1].split(',')]
slots = int(sys.argv[2]) if len(sys.argv) > 2 else 512
for w in widths:
  fn = step_costs._call_run(model, params, w, batch=1, num_slots=slots, greedy=True)
  fn().block_until_ready(); fn().block_until_ready()
  hlo = step_costs._calls.lower(model, params, *fn.carry, width=w, batch=1, num_slots=slots, greedy=True).compile().as_text()
  target = {}
  for m in re.finditer(r'%(\S+) = [^\n]*? custom-call\([^\n]*?custom_call_target="([^"]+)"', hlo):
    target[m.group(1)] = m.group(2)
  d = tempfile.mkdtemp(prefix=f'profile-w{w}-')
  with jax.profiler.trace(d):
    for _ in range(3):
      fn().block_until_ready()
  path = sorted(glob.glob(f'{d}/**/*.trace.json.gz', recursive=True))[-1]
  ev = json.load(gzip.open(path))['traceEvents']
  tot = collections.Counter(); cnt = collections.Counter()
  for e in ev:
    if e.get('ph') == 'X' and 'dur' in e and not e['name'].startswith(
        ('ThunkExecutor', 'while', '$', 'Pjit', 'end:')):
      name = e['name']
      kind = target.get(name, re.sub(r'\.\d+$', '', name))
      tot[kind] += e['dur']; cnt[kind] += 1
  calls = 3 * step_costs._STEPS
  print(f'\n== width {w}: leaf ops {sum(tot.values()) / calls / 1e3:.2f} ms per call')
  for kind, us in tot.most_common(14):
    print(f'{us / calls / 1e3:8.3f} ms  x{cnt[kind] / calls:6.1f}  {kind}')
