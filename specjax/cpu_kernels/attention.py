"""The attention of a few new tokens over the KV cache, in float32, on CPU.

A decode step attends 1 new token per row to every cache slot, a verify call
gamma + 1. XLA:CPU computes the two small products of each layer (queries by
keys, probabilities by values) one thread at a time and well below the
memory's speed, and over every slot of the cache, also those past the row's
length. `attention.cc` reads each slot that some query of the row may see
once, skips the rest, and splits the slots over XLA's thread pool.

`applies` says whether a call takes the kernel: the CPU backend, float32
operands, 1 to MAX_QUERIES new tokens per row (a prefill's many tokens are a
real matrix product, which XLA's kernels do well) and the kernel built (see
build.py). Gradients flow through `xla_attention`, XLA's own formulation (a
distilled drafter trains through the target's architecture), which is also
the model's attention wherever the kernel does not apply.

Each query's output is summed in an order that depends only on the slots, so
a row's result is the same bits whether it runs alone or beside other
queries (a decode step's token and the same token in a verify call).
A query that may see no slot gets zeros, in both forms.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'attention'
TARGET = 'specjax_attention_f32'
MAX_QUERIES = 16   # new tokens per row


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  return build.load(KERNEL, (TARGET,))


def applies(q_BxTxKxGxH: Array, k_BxSxKxH: Array, v_BxSxKxH: Array) -> bool:
  return (jax.default_backend() == 'cpu' and 1 <= q_BxTxKxGxH.shape[1] <= MAX_QUERIES
          and all(x.dtype == jnp.float32 for x in (q_BxTxKxGxH, k_BxSxKxH, v_BxSxKxH))
          and available())


def xla_attention(q_BxTxKxGxH: Array, k_BxSxKxH: Array, v_BxSxKxH: Array, mask_BxTxS: Array,
                  softcap: float | None = None) -> Array:
  """softmax(mask ? cap(q . k) : -inf) @ v by XLA's einsums, over every slot given.

  The kernel's definition and gradient, and the model's attention where the
  kernel does not apply (a prefill, another backend, bfloat16). The mask
  enters the softmax itself, so a query that may see no slot gets zeros, as
  from the kernel, not the mean of every value. q is already scaled; softcap
  is Gemma 2's attention soft cap (None: none); logits are float32 whatever
  the operands' dtype, and the probabilities take v's.
  """
  logits = jnp.einsum('btkgh,bskh->bkgts', q_BxTxKxGxH, k_BxSxKxH,
                      preferred_element_type=jnp.float32)
  if softcap:
    logits = jnp.tanh(logits / softcap) * softcap
  logits = jnp.where(mask_BxTxS[:, None, None], logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1, where=mask_BxTxS[:, None, None])
  probs = jnp.where(mask_BxTxS[:, None, None], probs, 0.0).astype(v_BxSxKxH.dtype)
  return jnp.einsum('bkgts,bskh->btkgh', probs, v_BxSxKxH)


def _call(q, k, v, mask, softcap):
  if not available():
    raise build.KernelBuildError(f'the {KERNEL} CPU kernel is not built: see the log for why')
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(TARGET, out, vmap_method='sequential')(
      q, k, v, mask.astype(bool), softcap=np.float32(softcap or 0.0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, mask, softcap):
  return _call(q, k, v, mask, softcap)


def _forward(q, k, v, mask, softcap):
  return _call(q, k, v, mask, softcap), (q, k, v, mask)


def _backward(softcap, residuals, d_out):
  q, k, v, mask = residuals
  _, vjp = jax.vjp(lambda q, k, v: xla_attention(q, k, v, mask, softcap), q, k, v)
  return (*vjp(d_out), None)


_attention.defvjp(_forward, _backward)


def attention(q_BxTxKxGxH: Array, k_BxSxKxH: Array, v_BxSxKxH: Array, mask_BxTxS: Array,
              softcap: float | None = None) -> Array:
  """softmax(mask ? cap(q . k) : -inf) @ v by the kernel; call only where `applies` holds.

  q is already scaled; `softcap` is Gemma 2's attention soft cap (None: none).
  """
  return _attention(q_BxTxKxGxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, softcap)
