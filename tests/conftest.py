"""Test-wide JAX settings: implicit rank promotion is an error (STYLE.md), so a
broadcast the code did not mean fails loudly instead of computing garbage; and
compiled programs are kept on disk (JAX's persistent cache, in its own directory
beside the entry points' one), so a program that several test modules compile,
the 270M's decode loops above all, is compiled once per suite, not once per
module (each module's in-memory programs are dropped when it ends, below)."""

import jax

from specjax import compile_cache

jax.config.update('jax_numpy_rank_promotion', 'raise')
compile_cache.enable(compile_cache.default_dir().with_name('jax-compile-tests'),
                     min_compile_time_s=0.1)


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


@pytest.fixture(scope='module')
def gemma270m():
  """The embedded Gemma 3 270M: (model, params), loaded once per module that asks for it."""
  # pylint: disable=g-import-not-at-top
  from specjax import checkpoints
  from specjax.models import config as config_lib
  from specjax.models.language_model import LanguageModel
  cfg, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  assert cfg == config_lib.get_model_config('gemma3-270m')
  return LanguageModel(cfg), jax.device_put(params)
