"""Reports from result files alone: exact tables from a fixed fixture, real PNGs, clear errors.

tests/fixtures/report holds hand-made rows (two prompts; the baseline, n-gram
at gamma 2 and 4 and early exit at gamma 2 at batch size 1 in results.jsonl,
and the baseline and n-gram at batch size 2 in a second file, as a sweep
might write). Their counts are chosen so every figure can be checked by hand:
e.g. n-gram at gamma 2 makes 60 tokens in 0.5 s against the baseline's 60 in
1.5 s (3.00x; the mean of per-prompt rates would give 3.43x), with 36
accepted drafts in 22 verify calls, so alpha solves alpha + alpha^2 = 36/22
(0.873).
"""

import json
import pathlib
import shutil
import struct
import subprocess
import sys

import pytest

from specjax import report
from specjax.reports import rows as rows_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / 'tests' / 'fixtures' / 'report'
COSTS = {'ngram': 0.0, 'early_exit': 0.25}
PLOTS = ('speedup_vs_gamma.png', 'accepted_per_task.png', 'acceptance_by_position.png',
         'predicted_vs_measured.png', 'speedup_vs_batch_size.png')


def section(text, title):
  """The lines of a section of report.md, its heading and image link left out."""
  body = text.split(f'## {title}\n\n', 1)[1].split('\n## ', 1)[0]
  kept = '\n'.join(line for line in body.splitlines() if not line.startswith('!['))
  return kept.strip().split('\n')


@pytest.fixture(scope='module')
def made(tmp_path_factory):
  out = tmp_path_factory.mktemp('report')
  path = report.write_report(str(FIXTURE), str(out), COSTS, command='cmd')
  return out, pathlib.Path(path).read_text(encoding='utf-8')


def test_header_names_the_command_and_the_files(made):
  _, text = made
  assert text.startswith('# Report: report\n\nCommand: `cmd`  \n'
                         'Rows: 12, from results.jsonl (8), sweep_batch2.jsonl (4).\n')


def test_speedup_against_gamma_table(made):
  assert section(made[1], 'Speedup against gamma') == [
      '| method | gamma | temperature | batch size | prompts | tokens/s | speedup | '
      'acceptance rate | mean accepted tokens | alpha |',
      '|---|---|---|---|---|---|---|---|---|---|',
      '| autoregressive | - | 0 | 1 | 2 | 40.0 | 1.00x | - | - | - |',
      '| autoregressive | - | 0 | 2 | 2 | 50.0 | 1.00x | - | - | - |',
      '| early_exit | 2 | 0 | 1 | 2 | 80.0 | 2.00x | 0.467 | 1.88 | 0.588 |',
      '| ngram | 2 | 0 | 1 | 2 | 120.0 | 3.00x | 0.818 | 2.50 | 0.873 |',
      '| ngram | 2 | 0 | 2 | 2 | 100.0 | 2.00x | 0.818 | 2.50 | 0.873 |',
      '| ngram | 4 | 0 | 1 | 2 | 150.0 | 3.75x | 0.786 | 3.75 | 0.906 |',
  ]


def test_per_task_table(made):
  assert section(made[1], 'Mean accepted tokens per task')[2:] == [
      '| task | early_exit@2 b=1 | ngram@2 b=1 | ngram@2 b=2 | ngram@4 b=1 |',
      '|---|---|---|---|---|',
      '| code | 1.90 | 2.86 | 2.86 | 4.44 |',   # 40 tokens / 21, 14, 14 and 9 calls
      '| qa | 1.82 | 2.00 | 2.00 | 2.86 |',
      '| all | 1.88 | 2.50 | 2.50 | 3.75 |',
  ]


def test_acceptance_by_position_table(made):
  assert section(made[1], 'Acceptance by draft position')[2:] == [
      '| method | gamma | temperature | batch size | 1 | 2 | 3 | 4 |',
      '|---|---|---|---|---|---|---|---|',
      '| early_exit | 2 | 0 | 1 | 0.600 | 0.333 | - | - |',  # [18, 10] / 30 calls
      '| ngram | 2 | 0 | 1 | 0.864 | 0.773 | - | - |',
      '| ngram | 2 | 0 | 2 | 0.864 | 0.773 | - | - |',
      '| ngram | 4 | 0 | 1 | 0.929 | 0.857 | 0.714 | 0.643 |',
  ]


def test_predicted_against_measured_table(made):
  lines = section(made[1], 'Predicted against measured speedup')
  assert 'early_exit 0.25, ngram 0' in lines[0]
  assert lines[2:] == [
      '| method | gamma | temperature | batch size | alpha | c | predicted | measured | '
      'measured / predicted |',
      '|---|---|---|---|---|---|---|---|---|',
      # (1 + 28/30) / (1 + 2 x 0.25): early exit's alpha + alpha^2 is 28/30.
      '| early_exit | 2 | 0 | 1 | 0.588 | 0.25 | 1.29x | 2.00x | 1.55 |',
      '| ngram | 2 | 0 | 1 | 0.873 | 0 | 2.64x | 3.00x | 1.14 |',
      '| ngram | 2 | 0 | 2 | 0.873 | 0 | 2.64x | 2.00x | 0.76 |',
      '| ngram | 4 | 0 | 1 | 0.906 | 0 | 4.14x | 3.75x | 0.91 |',
  ]


def test_speedup_against_batch_size_table(made):
  assert section(made[1], 'Speedup against batch size')[2:] == [
      '| method | gamma | temperature | batch 1 | batch 2 |',
      '|---|---|---|---|---|',
      '| early_exit | 2 | 0 | 2.00x | - |',
      '| ngram | 2 | 0 | 3.00x | 2.00x |',
      '| ngram | 4 | 0 | 3.75x | - |',
  ]


def test_a_method_without_a_cost_is_left_out_of_the_prediction(tmp_path):
  path = report.write_report(str(FIXTURE), str(tmp_path), plots=False)
  lines = section(pathlib.Path(path).read_text(), 'Predicted against measured speedup')
  assert [line.split(' | ')[0] for line in lines[4:]] == ['| ngram'] * 3
  assert not list(tmp_path.glob('*.png'))


def test_leviathan_table_2_per_task(made):
  lines = section(made[1], 'Paper table: Leviathan et al. 2023, Table 2')[2:]
  assert lines[:2] == ['| task | drafter | T | gamma | alpha | speedup | c | predicted speedup |',
                       '|---|---|---|---|---|---|---|---|']
  # n-gram @2 on code: 26 accepted drafts in 13 verify calls (alpha 1), 40 tokens in 0.2 s
  # against the baseline's 40 in 0.9 s; on qa 10 in 9 calls: alpha + alpha^2 = 10/9.
  assert '| code | ngram | 0 | 2 | 1.00 | 4.50x | 0 | 3.00x |' in lines
  assert '| qa | ngram | 0 | 2 | 0.67 | 2.00x | 0 | 2.11x |' in lines
  assert '| all | early_exit | 0 | 2 | 0.59 | 2.00x | 0.25 | 1.29x |' in lines
  assert len(lines) == 2 + 4 * 3  # four settings, two tasks and 'all' each


def test_chen_table_ms_per_token(made):
  assert section(made[1], 'Paper table: Chen et al. 2023, Table 1')[2:] == [
      '| sampling | method | gamma | ms/token | speedup |',
      '|---|---|---|---|---|',
      '| greedy | autoregressive |  | 25.0 | 1.00x |',   # 60 tokens in 1.5 s
      '| greedy | early_exit | 2 | 12.5 | 2.00x |',
      '| greedy | ngram | 2 | 8.3 | 3.00x |',
      '| greedy | ngram | 4 | 6.7 | 3.75x |',
      '| greedy, batch 2 | autoregressive |  | 20.0 | 1.00x |',
      '| greedy, batch 2 | ngram | 2 | 10.0 | 2.00x |',
  ]


def test_spec_bench_leaderboard_groups_tasks(made):
  lines = section(made[1], 'Paper table: the Spec-Bench leaderboard')[2:]
  assert lines[0].startswith('| drafter | T | multi-turn conversation | translation |')
  # Only 'qa' is a Spec-Bench task here; 'code' counts towards the overall figures alone.
  assert lines[2] == ('| early_exit (gamma 2) | 0 | - | - | - | 2.00x | - | - | 1.88 | 2.00x |')
  assert lines[5] == '| ngram (gamma 4) | 0 | - | - | - | 4.00x | - | - | 3.75 | 3.75x |'


def test_chen_table_names_nucleus_sampling_and_the_spec_bench_table_needs_its_tasks(tmp_path):
  rows = [json.loads(line) for line in (FIXTURE / 'results.jsonl').read_text().splitlines()]
  sampled = []
  for row in rows:
    row = dict(row, temperature=1.0, top_p=0.8, top_k=0, category='code',
               fingerprint=row['fingerprint'] + 't1')
    sampled.append(json.dumps(row))
  (tmp_path / 'results.jsonl').write_text('\n'.join(sampled) + '\n')
  text = pathlib.Path(report.write_report(str(tmp_path), str(tmp_path / 'out'), plots=False)
                      ).read_text()
  assert '| T=1, nucleus p=0.8 | autoregressive |  | 25.0 | 1.00x |' in text
  assert 'Spec-Bench leaderboard' not in text


def test_plots_are_png_files_linked_from_the_report(made):
  out, text = made
  for name in PLOTS:
    data = (out / name).read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n', name
    width, height = struct.unpack('>II', data[16:24])  # the IHDR chunk
    assert width >= 400 and height >= 300, name
    assert len(data) > 10_000, name  # axes, lines and labels, not a blank canvas
    assert f']({name})' in text


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)
  monkeypatch.setitem(sys.modules, 'matplotlib.figure', None)
  with pytest.raises(rows_lib.ReportError, match=r"'report' extra.*\.\[report\]"):
    report.write_report(str(FIXTURE), str(tmp_path))


def copy_fixture(tmp_path):
  directory = tmp_path / 'rows'
  shutil.copytree(FIXTURE, directory)
  return directory


def replace_line(path, number, text):
  lines = path.read_text(encoding='utf-8').splitlines()
  lines[number - 1] = text
  path.write_text('\n'.join(lines) + '\n', encoding='utf-8')


def first_row(field_changes, drop=()):
  row = json.loads((FIXTURE / 'results.jsonl').read_text().splitlines()[2])  # n-gram, p1
  row.update(field_changes)
  for key in drop:
    row.pop(key)
  return json.dumps(row)


@pytest.mark.parametrize('line, message', [
    ('{"prompt_id": "p1", ', 'not valid JSON'),
    ('[1, 2]', 'a JSON object'),
    (first_row({}, drop=('wall_s',)), "has no 'wall_s'"),
    (first_row({}, drop=('accepted_tokens',)), "has no 'accepted_tokens'"),
    (first_row({'new_tokens': 'forty'}), "'new_tokens' must be an integer"),
    (first_row({'wall_s': -1}), "'wall_s' must be a number >= 0"),
    (first_row({'gamma': 0}), "'gamma' must be an integer >= 1"),
    (first_row({'accepted_tokens': 27}), '27 accepted drafts in 13 verify calls of gamma 2'),
    (first_row({'acceptance_by_position': [1, 2, 3]}), 'acceptance_by_position must be gamma'),
    (first_row({'plain_calls': 14}), '14 plain calls, but only 13 calls after the prefill'),
    (first_row({'plain_calls': 1}), '26 accepted drafts in 12 verify calls of gamma 2'),
    (first_row({'tree': '-1,x'}), 'tree must be the parent indices of at least gamma'),
    (first_row({'tree': '-1'}), 'tree must be the parent indices of at least gamma'),
])
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, line, message):
  directory = copy_fixture(tmp_path)
  replace_line(directory / 'sweep_batch2.jsonl', 3, line)
  with pytest.raises(rows_lib.ReportError, match=message) as error:
    report.write_report(str(directory), str(tmp_path / 'out'), plots=False)
  assert str(error.value).startswith(f'{directory / "sweep_batch2.jsonl"}:3: ')


def test_missing_or_empty_directory_is_an_error(tmp_path):
  with pytest.raises(rows_lib.ReportError, match='no such directory'):
    report.write_report(str(tmp_path / 'absent'))
  with pytest.raises(rows_lib.ReportError, match=r'no \*\.jsonl'):
    report.write_report(str(tmp_path))
  (tmp_path / 'results.jsonl').write_text('\n')
  with pytest.raises(rows_lib.ReportError, match='hold no rows'):
    report.write_report(str(tmp_path))


def test_speedup_is_over_the_prompts_both_ran(tmp_path):
  directory = copy_fixture(tmp_path)
  lines = (FIXTURE / 'results.jsonl').read_text().splitlines()
  (directory / 'results.jsonl').write_text('\n'.join(lines[:5] + lines[6:]) + '\n')  # no p2 @4
  path = report.write_report(str(directory), str(tmp_path / 'out'), plots=False)
  # 40 tokens in 0.25 s against the baseline's 40 in 0.9 s on p1.
  assert '| ngram | 4 | 0 | 1 | 1 | 160.0 | 3.60x |' in pathlib.Path(path).read_text()


def test_a_row_copied_into_two_files_counts_once(tmp_path):
  directory = copy_fixture(tmp_path)
  lines = (FIXTURE / 'results.jsonl').read_text().splitlines()
  (directory / 'copy.jsonl').write_text(lines[2] + '\n' + lines[0] + '\n')
  path = report.write_report(str(directory), str(tmp_path / 'out'), COSTS, plots=False,
                             command='cmd')
  text = pathlib.Path(path).read_text()
  # Files are read in name order; a row counts where it was first seen.
  assert 'Rows: 12, from copy.jsonl (2), results.jsonl (6), sweep_batch2.jsonl (4).' in text
  assert '| ngram | 2 | 0 | 1 | 2 | 120.0 | 3.00x |' in text


def test_two_different_rows_for_one_prompt_and_setting_are_an_error(tmp_path):
  directory = copy_fixture(tmp_path)
  (directory / 'other.jsonl').write_text(first_row({'fingerprint': 'elsewhere'}) + '\n')
  with pytest.raises(rows_lib.ReportError, match=r'other\.jsonl:1 and .*results\.jsonl:3'):
    report.write_report(str(directory), plots=False)


def test_cost_ratio_flag():
  assert report.parse_cost_ratios('ngram=0,early_exit=0.25') == COSTS
  assert report.parse_cost_ratios('') == {}
  for bad in ('ngram', 'ngram=-1', '=0.5', 'ngram=cheap'):
    with pytest.raises(rows_lib.ReportError, match='method=c'):
      report.parse_cost_ratios(bad)


def test_command_line(tmp_path):
  run = lambda *args: subprocess.run([sys.executable, '-m', 'specjax.report', *args], cwd=ROOT,
                                     capture_output=True, text=True)
  done = run(str(FIXTURE), f'--out={tmp_path}', '--noplots')
  assert done.returncode == 0, done.stderr
  text = (tmp_path / 'report.md').read_text()
  assert f'Command: `python -m specjax.report {FIXTURE} --out={tmp_path} --noplots`' in text
  failed = run(str(tmp_path / 'absent'))
  assert failed.returncode == 1
  assert f'error: {tmp_path / "absent"}: no such directory' in failed.stderr
  assert 'Traceback' not in failed.stderr


def test_a_sweeps_cell_records_are_read_as_rows(tmp_path):
  """`python -m specjax.sweep` writes cells.jsonl, one record per cell holding its rows:
  a report of a sweep folder equals the report of the same rows as a results file."""
  lines = [json.loads(line) for line in (FIXTURE / 'results.jsonl').read_text().splitlines()]
  sweep = tmp_path / 'sweep'
  sweep.mkdir()
  records = [dict(id='a', status='ok', rows=lines[:4]),
             dict(id='b', status='error', error='boom', rows=[]),
             dict(id='c', status='ok', rows=lines[:1] + lines[4:])]   # the baseline again
  (sweep / 'cells.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  plain = tmp_path / 'plain'
  plain.mkdir()
  shutil.copy(FIXTURE / 'results.jsonl', plain / 'results.jsonl')
  from_sweep = pathlib.Path(report.write_report(str(sweep), str(tmp_path / 'o1'), COSTS,
                                                plots=False, command='cmd')).read_text()
  from_rows = pathlib.Path(report.write_report(str(plain), str(tmp_path / 'o2'), COSTS,
                                               plots=False, command='cmd')).read_text()
  table = lambda text: section(text, 'Speedup against gamma')  # noqa: E731
  assert table(from_sweep) == table(from_rows)


def tree_and_adaptive_rows():
  """The fixture's baseline for p1, an adaptive chain that took 4 plain steps, and two
  trees of the same depth: a token tree is its own setting, not a chain of its depth."""
  baseline = json.loads((FIXTURE / 'results.jsonl').read_text().splitlines()[0])  # 40 in 0.9 s
  common = dict(prompt_id='p1', category='code', temperature=0.0, prompt_tokens=10,
                new_tokens=40, batch_size=1, output_ids=[], text='', identical_to_baseline=True)
  chain = dict(common, method='eagle', fingerprint='chain', wall_s=0.6, gamma=3,
               target_calls=21, plain_calls=4, drafted_tokens=40, accepted_tokens=20,
               acceptance_by_position=[12, 6, 2])   # 16 verify calls of 3 or 2 drafts
  tree = dict(common, method='eagle', fingerprint='tree', wall_s=1.2, gamma=3,
              tree='-1,-1,0,0,2', target_calls=11, plain_calls=0, drafted_tokens=50,
              accepted_tokens=30, acceptance_by_position=[10, 10, 10])
  other_tree = dict(tree, fingerprint='tree2', tree='-1,0,1,1', wall_s=0.9, drafted_tokens=40)
  return [baseline, chain, tree, other_tree]


def test_a_tree_is_its_own_setting_and_plain_steps_are_not_verify_calls(tmp_path):
  (tmp_path / 'results.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in tree_and_adaptive_rows()))
  path = report.write_report(str(tmp_path), str(tmp_path / 'out'), {'eagle': 0.1},
                             plots=False, command='cmd')
  text = pathlib.Path(path).read_text()
  assert section(text, 'Speedup against gamma')[2:] == [
      '| autoregressive | - | 0 | 1 | 1 | 44.4 | 1.00x | - | - | - |',
      # 20 accepted drafts in 16 verify calls (21 calls less the prefill and 4 plain steps):
      # alpha + alpha^2 + alpha^3 = 20/16. A tree has no i.i.d. chain alpha.
      '| eagle | 3 | 0 | 1 | 1 | 66.7 | 1.50x | 0.500 | 1.90 | 0.622 |',
      '| eagle | tree 5/3 | 0 | 1 | 1 | 33.3 | 0.75x | 0.600 | 3.64 | - |',
      '| eagle | tree 4/3 | 0 | 1 | 1 | 44.4 | 1.00x | 0.750 | 3.64 | - |',
  ]
  assert section(text, 'Acceptance by draft position')[4:] == [
      '| eagle | 3 | 0 | 1 | 0.750 | 0.375 | 0.125 |',   # [12, 6, 2] / 16 verify calls
      '| eagle | tree 5/3 | 0 | 1 | 1.000 | 1.000 | 1.000 |',   # [10, 10, 10] / 10
      '| eagle | tree 4/3 | 0 | 1 | 1.000 | 1.000 | 1.000 |',
  ]
  assert section(text, 'Mean accepted tokens per task')[2] == (
      '| task | eagle@3 | eagle@tree 5/3 | eagle@tree 4/3 |')
  # Leviathan's prediction is for chains: only the chain is predicted,
  # (1 - alpha^4) / ((1 - alpha)(1 + 3 x 0.1)).
  assert section(text, 'Predicted against measured speedup')[4:] == [
      '| eagle | 3 | 0 | 1 | 0.622 | 0.1 | 1.73x | 1.50x | 0.87 |']
  from specjax.reports import paper  # pylint: disable=g-import-not-at-top
  drafters = [line.split(' | ')[0] for line in
              paper.spec_bench_table(rows_lib.read_rows(str(tmp_path)))[2:]]
  assert drafters == ['| eagle (gamma 3)', '| eagle (tree 5/3)', '| eagle (tree 4/3)']
  assert '| greedy | eagle | tree 4/3 | 22.5 | 1.00x |' in text   # Chen's table too


def test_the_run_summary_counts_verify_calls_without_plain_steps():
  from specjax.experiments import summary  # pylint: disable=g-import-not-at-top
  rows = tree_and_adaptive_rows()[:2]
  figures = summary.summarize(rows, ['autoregressive', 'eagle'])['methods']['eagle']
  assert figures['acceptance_by_position'] == [0.75, 0.375, 0.125]
  del rows[1]['plain_calls']   # an older row: taken as gamma drafts per verify call
  figures = summary.summarize(rows, ['autoregressive', 'eagle'])['methods']['eagle']
  assert figures['acceptance_by_position'] == [12 / 13, 6 / 13, 2 / 13]


def _cells(records):
  return ''.join(json.dumps(dict(status='ok', **r)) + '\n' for r in records)


def test_cells_that_differ_by_a_drafter_setting_are_reported_as_methods_of_their_own(tmp_path):
  """A sweep may run one drafter with two settings (two `eagle.checkpoint`s): their rows are
  the same method, prompt and setting but differ, so each is named by the setting that tells
  the cells apart. A cell no row of which collides keeps its plain name; prompts chosen by
  cell (`categories`) never collide; the baseline keeps its name."""
  lines = [json.loads(line) for line in (FIXTURE / 'results.jsonl').read_text().splitlines()]
  baseline = [r for r in lines if r['method'] == 'autoregressive']
  ngram = [r for r in lines if r['method'] == 'ngram' and r['gamma'] == 4]
  other = [dict(r, fingerprint=r['fingerprint'] + '-other', wall_s=r['wall_s'] * 2)
           for r in ngram]
  (tmp_path / 'cells.jsonl').write_text(_cells([
      dict(overrides={'drafters': ['ngram'], 'ngram.max_n': 3, 'categories': ['a']},
           rows=baseline + ngram),
      dict(overrides={'drafters': ['ngram'], 'ngram.max_n': 5, 'categories': ['a']},
           rows=baseline + other)]))
  rows = rows_lib.read_rows(str(tmp_path))
  assert sorted({r.method for r in rows}) == ['autoregressive', 'ngram [ngram.max_n=3]',
                                              'ngram [ngram.max_n=5]']
  text = pathlib.Path(report.write_report(str(tmp_path), str(tmp_path / 'out'), plots=False,
                                          command='cmd')).read_text()
  assert '| ngram [ngram.max_n=3] | 4 | 0 | 1 | 2 |' in text
  assert '| ngram [ngram.max_n=5] | 4 | 0 | 1 | 2 |' in text
  # Cells over different prompts (their overrides differ too) collide nowhere: plain names.
  by_prompt = tmp_path / 'by_prompt'
  by_prompt.mkdir()
  of_prompt = lambda p: [r for r in baseline + other if r['prompt_id'] == p]  # noqa: E731
  (by_prompt / 'cells.jsonl').write_text(_cells([
      dict(overrides={'categories': ['a']}, rows=of_prompt('p1')),
      dict(overrides={'categories': ['b']}, rows=of_prompt('p2'))]))
  assert {r.method for r in rows_lib.read_rows(str(by_prompt))} == {'autoregressive', 'ngram'}


def test_cells_whose_rows_collide_with_nothing_to_tell_them_apart_are_an_error(tmp_path):
  lines = [json.loads(line) for line in (FIXTURE / 'results.jsonl').read_text().splitlines()]
  ngram = [r for r in lines if r['method'] == 'ngram' and r['gamma'] == 4]
  other = [dict(r, fingerprint=r['fingerprint'] + '-other') for r in ngram]
  (tmp_path / 'cells.jsonl').write_text(_cells([
      dict(overrides={'drafters': ['ngram']}, rows=ngram),
      dict(overrides={'drafters': ['ngram']}, rows=other)]))
  with pytest.raises(rows_lib.ReportError,
                     match=r'cells\.jsonl:1 row 0 and .*cells\.jsonl:2 row 0'):
    rows_lib.read_rows(str(tmp_path))
