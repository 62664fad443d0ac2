"""The Colab notebooks run top to bottom, small, on CPU, as CI runs them.

Each notebook's first cell reads SPECJAX_SMALL=1 (a random tiny model, two
prompts, a few tokens) and SPECJAX_OUTPUT_DIR; it must find the specjax that
is already importable and install nothing. A cell that raises fails the test
with the cell's error.
"""

import json
import os
import pathlib

import nbformat
from nbclient import NotebookClient
import pytest

from specjax.experiments.tiny import ByteTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'colab').glob('*.ipynb'))
PNG = b'\x89PNG\r\n\x1a\n'


def outputs(nb) -> str:
  text = []
  for cell in nb.cells:
    for out in cell.get('outputs', []):
      text.append(out.get('text', ''))
      text.append(out.get('data', {}).get('text/plain', ''))
      text.append(out.get('data', {}).get('text/markdown', ''))
  return '\n'.join(text)


def test_there_are_notebooks_and_they_share_their_setup_cell():
  assert [p.name for p in NOTEBOOKS] == ['specjax_paper_tables.ipynb', 'specjax_quickstart.ipynb',
                                         'specjax_train_drafter.ipynb']
  first = [next(c for c in nbformat.read(p, as_version=4).cells if c.cell_type == 'code').source
           for p in NOTEBOOKS]
  assert first[1:] == first[:-1]
  assert "os.environ.get('SPECJAX_SMALL')" in first[0]
  assert 'OWNER' not in first[0]  # no placeholder to edit


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_small_on_cpu(path, tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_SMALL', '1')
  monkeypatch.setenv('SPECJAX_OUTPUT_DIR', str(tmp_path))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  # The kernel imports this checkout's specjax, as the tests do.
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
      filter(None, [str(ROOT), os.environ.get('PYTHONPATH', '')])))
  nb = nbformat.read(path, as_version=4)
  NotebookClient(nb, timeout=300, kernel_name='python3',
                 resources={'metadata': {'path': str(path.parent)}}).execute()
  text = outputs(nb)
  assert 'specjax is importable already: nothing to install.' in text
  assert 'Installing specjax' not in text
  assert f'specjax checkout: {ROOT};' in text
  if 'train_drafter' in path.name:
    check_trained_and_served(tmp_path, text)
    return
  report = tmp_path / ('colab_sweep' if 'quickstart' in path.name else 'paper_tables') / 'report'
  assert (report / 'report.md').is_file()
  assert (report / 'speedup_vs_gamma.png').read_bytes()[:8] == PNG
  assert '| ngram | 4 | 0 | 1 | 2 |' in (report / 'report.md').read_text()


def check_trained_and_served(out: pathlib.Path, text: str):
  """The tiny recipe trained heads (a manifest, a curve) that the run then served exactly."""
  manifest = json.loads((out / 'train_medusa-tiny' / 'drafter' / 'drafter.json').read_text())
  assert manifest['target']['vocab_size'] == ByteTokenizer.vocab_size  # the tiny target's
  assert (out / 'train_medusa-tiny' / 'curve.png').read_bytes()[:8] == PNG
  assert 'held-out mean accepted tokens' in text
  rows = [json.loads(line) for line in open(out / 'serve_medusa-tiny' / 'results.jsonl')]
  medusa = [r for r in rows if r['method'] == 'medusa']
  assert len(medusa) == 2 and all(r['identical_to_baseline'] for r in medusa)
