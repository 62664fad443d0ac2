"""18 layers' body products by the skinny kernel, q/k/v and gate/up as separate products
against one concatenated product each (random weights of the 270M's shapes), in turns."""
import time, numpy as np, jax, jax.numpy as jnp
from specjax.cpu_kernels import skinny_matmul as sm
rng = np.random.default_rng(0)
L, D, Q, KV, F = 18, 640, 1024, 256, 2048
def r(*s): return jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.02)
sep = [dict(q=r(Q, D), k=r(KV, D), v=r(KV, D), o=r(D, Q), g=r(F, D), u=r(F, D), d=r(D, F)) for _ in range(L)]
fused = [dict(qkv=jnp.concatenate([p['q'], p['k'], p['v']]), o=p['o'], gu=jnp.concatenate([p['g'], p['u']]), d=p['d']) for p in sep]
mm = sm.skinny_matmul
@jax.jit
def f_sep(x, ps):
  for p in ps:
    q, k, v = mm(x, p['q']), mm(x, p['k']), mm(x, p['v'])
    x = x + mm(q + jnp.tile(k + v, (1, 4)), p['o'])
    x = x + mm(jax.nn.gelu(mm(x, p['g'])) * mm(x, p['u']), p['d'])
  return x
@jax.jit
def f_fused(x, ps):
  for p in ps:
    qkv = mm(x, p['qkv']); q, k, v = qkv[:, :Q], qkv[:, Q:Q+KV], qkv[:, Q+KV:]
    x = x + mm(q + jnp.tile(k + v, (1, 4)), p['o'])
    gu = mm(x, p['gu'])
    x = x + mm(jax.nn.gelu(gu[:, :F]) * gu[:, F:], p['d'])
  return x
for n in (2, 5, 9, 12):
  x = jnp.ones((n, D), jnp.float32) * 0.1
  a, b = f_sep(x, sep), f_fused(x, fused)
  print(n, 'max diff', float(jnp.abs(a - b).max()))
  ts = {'sep': [], 'fused': []}
  for _ in range(15):
    for name, fn, ps in (('sep', f_sep, sep), ('fused', f_fused, fused)):
      t = time.perf_counter(); fn(x, ps).block_until_ready(); ts[name].append(time.perf_counter() - t)
  print(n, {k: f'{min(v)*1e3:.1f}/{np.median(v)*1e3:.1f}' for k, v in ts.items()}, flush=True)
