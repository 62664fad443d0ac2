"""The chunked argmax is jnp.argmax: the first maximum, for ties, NaN and -inf too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import argmax as argmax_lib


@pytest.mark.parametrize('size', [262_144, 5_000, 32_000, 50_257, 100])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_equals_jnp_argmax_on_random_rows(size, dtype):
  x = jax.random.normal(jax.random.key(size), (3, 4, size)).astype(dtype)
  got = jax.jit(argmax_lib.argmax)(x)
  assert got.dtype == jnp.int32 and got.shape == (3, 4)
  np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))


def test_the_first_of_tied_maxima_wins_across_and_within_chunks():
  size = 262_144
  chunk = argmax_lib.chunk_size(size)
  x = np.zeros((4, size), np.float32)
  x[0, [7 * chunk + 3, 2 * chunk + 9, 2 * chunk + 5]] = 1.0   # ties in two chunks
  x[1, [chunk - 1, chunk]] = 2.0                             # ties across a chunk boundary
  x[2] = -np.inf                                             # nothing above -inf
  x[3, [size - 1]] = 0.5                                     # the last entry
  np.testing.assert_array_equal(argmax_lib.argmax(jnp.asarray(x)), [2 * chunk + 5, chunk - 1, 0,
                                                                    size - 1])


def test_nan_is_the_maximum_and_the_first_nan_wins_as_in_jnp_argmax():
  size = 50_257   # not a multiple of the chunk: the padded tail must not matter
  x = np.random.default_rng(0).normal(size=(3, size)).astype(np.float32)
  x[0, [40_000, 123]] = np.nan
  x[1, size - 1] = np.nan
  x[2] = -np.inf
  x = jnp.asarray(x)
  np.testing.assert_array_equal(argmax_lib.argmax(x), jnp.argmax(x, axis=-1))
  np.testing.assert_array_equal(argmax_lib.argmax(x), [123, size - 1, 0])


def test_masked_logits_are_exact():
  """-inf masks (a reduced draft vocabulary, top-k) beside finite logits."""
  x = np.full((2, 262_144), -np.inf, np.float32)
  x[0, ::1000] = np.random.default_rng(1).normal(size=x[0, ::1000].shape)
  x[1, 70_001] = -3.0
  x = jnp.asarray(x)
  np.testing.assert_array_equal(argmax_lib.argmax(x), jnp.argmax(x, axis=-1))
  assert int(argmax_lib.argmax(x)[1]) == 70_001


def test_short_axes_and_integers_take_jnp_argmax():
  x = jnp.asarray([[3, 9, 9, 1]], jnp.int32)
  np.testing.assert_array_equal(argmax_lib.argmax(x), [1])
