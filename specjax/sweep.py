"""Runs a config file's sweep: `python -m specjax.sweep --config=configs/gemma.py`.

The same command as `python -m specjax.run --config=... --sweep` (same flags,
same code): every cell of the file's `get_sweep()` (drafters x gamma x
temperature x categories x batch size) runs into config.output_dir, each
recorded in cells.jsonl as soon as it ends; a rerun skips finished cells. The
work is `specjax.experiments.sweep_runner.run_sweep`, which a notebook can call.
"""

from absl import app

from specjax import run


def parse_flags(argv):
  return run.parse_flags([*argv, '--sweep'])


if __name__ == '__main__':
  app.run(run.main, flags_parser=parse_flags)
