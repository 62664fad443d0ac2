"""What ships in specjax/drafters/data for the embedded 270M: small, packaged, remakeable.

The issue's budget is 25 MB for every shipped drafter together; each trained
drafter directory carries its manifest (the target, the command that made it,
its config and data recipe) and its curve, is named in the data README with
that command, and is matched by the package-data globs, so a wheel carries it.
"""

import json
import pathlib
import tomllib

import pytest

from specjax.checkpoints import drafter_io
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import tiny_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / 'specjax' / 'drafters' / 'data'
BUDGET_BYTES = 25 * 10**6


def _files():
  return [p for p in DATA.rglob('*') if p.is_file() and '__pycache__' not in p.parts]


def test_the_shipped_data_fits_the_budget():
  total = sum(p.stat().st_size for p in _files())
  assert total <= BUDGET_BYTES, f'{total / 1e6:.1f} MB shipped in {DATA}'


def test_every_shipped_file_is_package_data():
  globs = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools'][
      'package-data']['specjax']
  package = ROOT / 'specjax'
  covered = {p for pattern in globs for p in package.glob(pattern) if p.is_file()}
  missing = [str(p.relative_to(ROOT)) for p in _files() if p not in covered]
  assert not missing, f'not in pyproject package-data: {missing}'


def test_each_trained_drafter_names_its_target_command_and_curve():
  readme = (DATA / 'README.md').read_text()
  directories = sorted(p for p in DATA.iterdir() if p.is_dir())
  assert {p.name for p in directories} >= {'gemma3-270m-eagle', 'gemma3-270m-distilled'}
  for directory in directories:
    manifest = json.loads((directory / drafter_io.MANIFEST).read_text())
    kind = directory.name.removeprefix('gemma3-270m-')
    assert manifest['kind'] == kind
    assert manifest['train_config']['target'] == 'embedded:gemma3-270m'
    assert manifest['command'] == f'python -m specjax.train --config=configs/train_{kind}.py'
    assert manifest['command'] in readme and directory.name in readme
    assert (directory / 'curve.png').stat().st_size > 0
    assert (directory / 'metrics.jsonl').read_text().strip()


@pytest.mark.parametrize('kind', ['eagle', 'medusa', 'distilled'])
def test_a_shipped_drafter_for_another_target_says_what_to_do(kind):
  """The default run drafts with the shipped EAGLE head: given another model, the
  error names the shipped drafter and the way out, before any decoding."""
  other = drafter_io.target_signature(tiny_config(), '')
  with pytest.raises(CheckpointError, match=(
      rf"trained for another target: its embed_dim is 640, this target's is 32; checkpoint "
      rf"'embedded' is the {kind} drafter shipped for embedded:gemma3-270m.*"
      r'--config.drafters=ngram')):
    drafter_io.load_drafter('embedded', kind, target=other)
