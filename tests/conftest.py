"""Test-wide JAX settings: implicit rank promotion is an error (STYLE.md), so a
broadcast the code did not mean fails loudly instead of computing garbage."""

import jax

jax.config.update('jax_numpy_rank_promotion', 'raise')


import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order


@pytest.fixture(autouse=True, scope='module')
def _drop_compiled_programs_after_each_module():
  """Frees every compiled program when a test module ends.

  The whole suite compiles thousands of XLA:CPU programs in one process; kept
  alive together they ran XLA out of resources and crashed a later compile
  (seen as SIGSEGV / SIGABRT inside backend_compile_and_load in
  test_speculative, which passes alone). Programs a module shares across its
  own tests are still reused.
  """
  yield
  jax.clear_caches()
