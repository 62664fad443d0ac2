"""Runs one experiment: `python -m specjax.run --config=configs/gemma.py`.

Intentionally short: the work is `specjax.experiment.run_experiment`, which a
notebook can call directly. `--sweep` runs every cell of the config file's
`get_sweep()` instead (`specjax.experiments.sweep_runner`; `python -m
specjax.sweep` is the same command) into the config's output_dir, or, left at
the config file's default, that default + '-sweep'. Compiled programs are kept
on disk (`specjax.compile_cache`), so a second run does not compile them again.

A bad input ends the run with one line naming the key and value, and exit
code 1; `--verbosity=1` also logs the traceback. Ctrl-C keeps every row
written so far and exits with 130.
"""

import importlib.util
import logging as std_logging
import os
import re
import signal
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from specjax import compile_cache
from specjax import experiment
from specjax.checkpoints import CheckpointError
from specjax.experiments import sweep_cells
from specjax.experiments import sweep_runner
from specjax.experiments import results as results_lib
from specjax.experiments.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.',
                                          lock_config=True)
_SWEEP = flags.DEFINE_bool('sweep', False, "Run every cell of the config file's get_sweep().")

_output_dir = None  # where rows go, for the message after Ctrl-C


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  # JAX logs at INFO that it found no TPU library on every CPU or GPU machine, and
  # that it reset its compilation cache: a bad input must still be one line.
  for name in ('jax._src.xla_bridge', 'jax._src.compilation_cache'):
    std_logging.getLogger(name).setLevel(std_logging.WARNING)
  compile_cache.enable()
  # Ctrl-C ends the run here, not as a KeyboardInterrupt: Python raises that in
  # whatever runs next, and when that is a garbage-collection callback (JAX
  # registers one) it is printed and dropped, and the run goes on.
  signal.signal(signal.SIGINT, lambda signum, frame: _interrupted())
  try:
    _run()
  except KeyboardInterrupt:
    _interrupted()
  # The user's to fix: bad values and files (OSError, UnicodeDecodeError are
  # among them), so a line, not a traceback.
  except (ConfigError, CheckpointError, OSError, ValueError) as e:
    logging.debug('%s', type(e).__name__, exc_info=True)
    sys.exit(f'error: {_one_line(e)}')


def _run():
  global _output_dir
  if not flags.FLAGS['config'].present:
    sys.exit('error: --config is required, e.g. --config=configs/gemma.py')
  path, _, arg = config_flags.get_config_filename(flags.FLAGS['config']).partition(':')
  if not os.path.isfile(path):
    sys.exit(f'error: --config={path}: no such config file')
  config = _CONFIG.value.to_dict()
  if not _SWEEP.value:
    _output_dir = config['output_dir']
    experiment.run_experiment(config)
    return
  config_file = config_flags.get_config_filename(flags.FLAGS['config'])
  spec = importlib.util.spec_from_file_location('sweep_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if config['output_dir'] == module.get_config(arg or None).output_dir:  # not chosen by the user
    config['output_dir'] += '-sweep'
  _output_dir = config['output_dir']
  sweep_runner.run_sweep(config, sweep_cells.from_config_file(config_file))


def _interrupted():
  """Says what was kept, then exits at once: unwinding Python while XLA threads
  compile once ended in a segmentation fault. Rows are synced as written."""
  message = 'interrupted'
  if _output_dir is not None:
    path = os.path.join(_output_dir, results_lib.RESULTS)
    try:
      with open(path, encoding='utf-8') as f:
        rows = sum(1 for line in f if line.endswith('\n'))
      message += f'; {rows} rows kept in {path}; run the same command again to resume'
    except OSError:
      message += '; no rows written yet'
  sys.stderr.write(message + '\n')
  sys.stderr.flush()
  os._exit(130)  # pylint: disable=protected-access


def _one_line(error: BaseException) -> str:
  return re.sub(r'\s*\n\s*', ' ', str(error).strip())


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
    sys.exit(f'FATAL Flags parsing error: {_config_file_error(e) or e}')


def _config_file_error(error: flags.Error) -> str | None:
  """'flag --config=F:ARG: <what get_config raised>', without the traceback that
  ml_collections pastes into the message; None for other flag errors."""
  flag, sep, _ = str(error).partition(': Error whilst parsing config file:')
  if not sep:
    return None
  cause, chain = error, [error]
  while (cause := cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)):
    chain.append(cause)
  return f'{flag}: {_one_line(chain[-1])}'


if __name__ == '__main__':
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:
    _interrupted()
