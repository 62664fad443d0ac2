"""Runs one experiment: `python -m specjax.run --config=configs/gemma.py`.

Intentionally short: the work is `specjax.experiment.run_experiment`, which a
notebook can call directly. `--sweep` runs every cell of the config file's
`get_sweep()` instead (`specjax.experiments.sweep_runner`; `python -m
specjax.sweep` is the same command). Compiled programs are kept on disk
(`specjax.compile_cache`), so a second run does not compile them again.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from specjax import compile_cache
from specjax import experiment
from specjax.checkpoints import CheckpointError
from specjax.experiments import sweep_cells
from specjax.experiments import sweep_runner
from specjax.experiments.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.',
                                          lock_config=True)
_SWEEP = flags.DEFINE_bool('sweep', False, "Run every cell of the config file's get_sweep().")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  compile_cache.enable()
  try:
    _run()
  except (ConfigError, CheckpointError) as e:  # the user's to fix: no traceback
    sys.exit(f'error: {e}')


def _run():
  if not _SWEEP.value:
    experiment.run_experiment(_CONFIG.value)
    return
  config_file = config_flags.get_config_filename(flags.FLAGS['config'])
  sweep_runner.run_sweep(_CONFIG.value, sweep_cells.from_config_file(config_file))


def parse_flags(argv):
  """absl's parser, with a plain message for a key the locked config lacks."""
  try:
    return flags.FLAGS(argv)
  except AttributeError as e:  # ConfigDict's answer to an unknown --config.<key>
    cause = e.args[0] if e.args and isinstance(e.args[0], KeyError) else e
    key, _, hint = str(cause.args[0] if cause.args else cause).partition('\n')
    sys.exit(f'FATAL Flags parsing error: unknown config key {key}: the config file does not '
             f'define it (see the key table in README.md). {hint}'.rstrip())
  except flags.Error as e:
    sys.exit(f'FATAL Flags parsing error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
