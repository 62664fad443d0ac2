"""The attention kernel's outputs on random operands (shapes with partial blocks, a soft cap), saved
to an .npz, to compare two builds bit for bit: `python attention_bits.py out.npz`."""
import sys, numpy as np, jax
from specjax.cpu_kernels import attention
rng = np.random.default_rng(0)
out = {}
for (B, T, K, G, H, S, cap) in [(1, 9, 1, 4, 256, 512, 0), (2, 5, 1, 4, 256, 300, 0), (1, 3, 2, 3, 40, 100, 0),
                                (3, 16, 1, 4, 256, 1024, 50.0), (1, 1, 1, 4, 256, 77, 0), (2, 7, 2, 2, 64, 130, 0)]:
  q = rng.standard_normal((B, T, K, G, H), np.float32)
  k = rng.standard_normal((B, S, K, H), np.float32)
  v = rng.standard_normal((B, S, K, H), np.float32)
  mask = rng.random((B, T, S)) < 0.7
  mask[:, :, :S // 3] = True
  o = jax.jit(lambda *a: attention.attention(*a, softcap=cap or None))(q, k, v, mask)
  out[f'{B}_{T}_{K}_{G}_{H}_{S}_{cap}'] = np.asarray(o)
np.savez(sys.argv[1], **out)
