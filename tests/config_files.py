"""The repository's config files (configs/<name>.py) as modules, the way absl's config_flags reads them."""

import importlib.util
import pathlib

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'


def load(name: str):
  """configs/<name>.py executed as a fresh module (its get_config, get_sweep, VARIANTS, ...)."""
  path = CONFIGS / f'{name}.py'
  spec = importlib.util.spec_from_file_location(f'specjax_config_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
