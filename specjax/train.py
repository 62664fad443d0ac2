"""Trains a drafter against its frozen target: `python -m specjax.train --config=configs/train_medusa.py`.

Intentionally short: the work is `specjax.training.trainer.train`, which a
notebook can call. Rerunning the same command resumes a killed run from its
last checkpoint (same data, same batches, same losses). A bad config value is
one line and exit code 1.
"""

import logging as std_logging
import sys

from absl import app
from absl import logging
from ml_collections import config_flags

from specjax import compile_cache
from specjax.checkpoints import CheckpointError
from specjax.training import trainer

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/train_*.py file.',
                                          lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if _CONFIG.value is None:
    sys.exit('error: --config is required, e.g. --config=configs/train_medusa.py')
  compile_cache.enable()
  # Orbax logs every save at INFO, through absl: keep the progress lines readable.
  logging.get_absl_handler().addFilter(
      lambda record: 'orbax' not in record.pathname or record.levelno >= std_logging.WARNING)
  try:
    cfg = trainer.TrainConfig.from_config(_CONFIG.value)
    final = trainer.train(cfg, command='python -m specjax.train ' + ' '.join(sys.argv[1:]))
  except (CheckpointError, OSError, ValueError) as e:
    logging.debug('%s', type(e).__name__, exc_info=True)
    sys.exit(f'error: {e}')
  print(f'trained drafter in {cfg.output_dir}/drafter: held-out mean accepted tokens '
        f'{final["heldout_served_accepted_tokens"]:.3f} in served order '
        f'({final["heldout_mean_accepted_tokens"]:.3f} over every position), '
        f'loss {final["heldout_loss"]:.4f}')


if __name__ == '__main__':
  app.run(main)
