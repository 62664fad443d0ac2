"""Test-wide JAX settings: implicit rank promotion is an error (STYLE.md), so a
broadcast the code did not mean fails loudly instead of computing garbage."""

import jax

jax.config.update('jax_numpy_rank_promotion', 'raise')
