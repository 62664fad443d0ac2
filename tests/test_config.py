"""configs/gemma.py and its conversion into ExperimentConfig: every bad value fails early."""

import os
import pathlib
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from specjax.experiments import config as config_lib
from specjax.experiments import methods

import config_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_PATH = ROOT / 'configs' / 'gemma.py'


def gemma_config_module():
  return config_files.load('gemma')


def get_config(arg=None):
  return gemma_config_module().get_config(arg)


def test_default_config_converts_and_matches_the_dataclass():
  config = get_config()
  fields = {f.name for f in config_lib.dataclasses.fields(config_lib.ExperimentConfig)}
  assert set(config.keys()) == fields
  cfg = config_lib.ExperimentConfig.from_config(config)
  assert cfg.model == 'embedded:gemma3-270m'
  assert cfg.methods == ('autoregressive', 'ngram', 'hybrid')
  assert cfg.hybrid['drafter'] == 'eagle' and cfg.eagle['checkpoint'] == 'embedded'
  assert cfg.sampling.greedy and cfg.max_new_tokens == 64 and cfg.resume


def test_named_variants_and_key_values_in_the_arg():
  quick = get_config('quick')
  assert (quick.limit, quick.max_new_tokens) == (4, 32)
  config = get_config('drafters=ngram+early_exit,gamma=6,chat_template=false,temperature=0.5')
  assert config.drafters == ('ngram', 'early_exit')
  assert (config.gamma, config.chat_template, config.temperature) == (6, False, 0.5)
  for bad in ('nope', 'foo=1', 'gamma=six', 'resume=maybe'):
    with pytest.raises(ValueError):
      get_config(bad)


def test_sweep_is_drafter_by_gamma_and_every_point_is_valid():
  module = gemma_config_module()
  sweep = module.get_sweep()
  assert {(p['drafters'], p['gamma']) for p in sweep} == {(('ngram',), g) for g in (2, 4, 6, 8)}
  assert len(sweep) == 4
  for point in sweep:
    config = module.get_config()
    config.update(point)
    config_lib.ExperimentConfig.from_config(config)
  with_draft = module.get_sweep(f'draft_model.checkpoint={CONFIG_PATH}')
  assert len(with_draft) == 8 and with_draft[-1]['drafters'] == ('draft_model',)


def _parse(*args):
  argv = ['prog', f'--config={CONFIG_PATH}:quick', *args]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'test', flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  return values.config


def test_locked_config_takes_known_keys_and_rejects_unknown_ones():
  config = _parse('--config.gamma=6', "--config.drafters=('ngram','early_exit')",
                  '--config.categories=code')
  assert config.gamma == 6 and config.limit == 4
  assert config.drafters == ('ngram', 'early_exit') and config.categories == ('code',)
  with pytest.raises(AttributeError):
    _parse('--config.gama=6')


def test_run_reports_an_unknown_key_plainly():
  result = subprocess.run(
      [sys.executable, '-m', 'specjax.run', f'--config={CONFIG_PATH}', '--config.gama=6'],
      capture_output=True, text=True, cwd=ROOT, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode != 0
  assert "unknown config key 'gama'" in result.stderr and 'gamma' in result.stderr
  assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('key, value', [
    ('temperature', -0.1), ('temperature', float('nan')), ('top_p', 0.0), ('top_p', 1.5),
    ('top_k', -1), ('batch_size', 0), ('max_new_tokens', 0), ('limit', -1), ('gamma', 0),
    ('model', 'embedded:gemma9-1t'), ('model', '/no/such/checkpoint.gguf'),
    ('drafters', ('ngram', 'medusa')), ('drafters', ('ngram', 'ngram')),
    ('prompts', '/no/such/prompts.jsonl'), ('tokenizer', '/no/such/tokenizer.model'),
    ('mesh_data', 0),
    ('mesh_model', 0), ('max_cache_len', 0), ('output_dir', ''),
    ('gamma', '4'), ('batch_size', 2.0), ('chat_template', 'yes'), ('resume', 1),
    ('too_long', 'skp'), ('prompts', '/'), ('tokenizer', '/'),
])
def test_invalid_value_names_its_key(key, value):
  values = get_config().to_dict()
  values[key] = value
  with pytest.raises(ValueError, match=key) as error:
    config_lib.ExperimentConfig.from_config(values)
  if isinstance(value, (int, str)) and key not in ('ngram_max', 'draft_model'):
    assert repr(value) in str(error.value) or str(value) in str(error.value)


def test_each_entry_point_has_its_own_default_output_dir():
  assert get_config().output_dir == 'results/gemma'
  assert get_config('quick').output_dir == 'results/gemma-quick'
  assert (get_config('drafters=ngram+early_exit,gamma=6').output_dir
          == 'results/gemma-drafters_ngram+early_exit-gamma_6')
  assert get_config('quick,output_dir=elsewhere').output_dir == 'elsewhere'


def test_draft_model_drafter_needs_a_checkpoint():
  values = get_config().to_dict()
  values['drafters'] = ('draft_model',)
  with pytest.raises(ValueError, match='draft_model'):
    config_lib.ExperimentConfig.from_config(values)
  values['draft_model'] = dict(checkpoint='embedded:gemma3-270m')
  assert config_lib.ExperimentConfig.from_config(values).draft_model == {
      'checkpoint': 'embedded:gemma3-270m'}


@pytest.mark.parametrize('key, value, message', [
    ('ngram', {'max_n': 3, 'min_n': 0}, r'config.ngram.min_n / max_n need 1 <= min_n'),
    ('ngram', {'maxn': 3}, r'config.ngram has unknown setting\(s\) maxn'),
    ('early_exit', {'layers': 0}, r'config.early_exit.layers must be >= 1, got 0'),
    ('early_exit', {'layers': 'four'}, r"config.early_exit.layers must be a int, got 'four'"),
    ('draft_length', {'adaptive': 'yes'}, r'config.draft_length.adaptive must be a bool'),
    ('draft_length', {'buckets': (1, 4)}, r'config.draft_length.buckets must include 0'),
    ('draft_length', {'speed': 1}, r'config.draft_length has unknown setting\(s\) speed'),
    ('draft_length', {'finish_softness': 0.0},
     r'config.draft_length.finish_softness must be > 0 tokens'),
    ('draft_length', {'finish_softness': 'wide'},
     r'config.draft_length.finish_softness must be a number'),
    ('draft_length', {'outcome_samples': -8},
     r'config.draft_length.outcome_samples must be an int >= 0'),
    ('draft_length', {'outcome_samples': 6.5},
     r'config.draft_length.outcome_samples must be an int'),
    ('draft_length', {'pool_rows': 1}, r'config.draft_length.pool_rows must be a bool, got 1'),
])
def test_bad_nested_settings_fail_before_anything_loads(key, value, message):
  values = get_config().to_dict()
  values[key] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.ExperimentConfig.from_config(values)


def test_nested_settings_from_the_config_arg():
  config = get_config('ngram.max_n=5,early_exit.layers=6')
  assert config.ngram.max_n == 5 and config.ngram.min_n == 1 and config.early_exit.layers == 6
  with pytest.raises(ValueError, match="unknown config key 'ngram.maxn'"):
    get_config('ngram.maxn=5')


def test_unknown_and_missing_keys_fail_when_called_from_python():
  values = get_config().to_dict()
  with pytest.raises(ValueError, match='gama'):
    config_lib.ExperimentConfig.from_config({**values, 'gama': 6})
  del values['seed']
  with pytest.raises(ValueError, match='seed'):
    config_lib.ExperimentConfig.from_config(values)


def test_fingerprints_follow_what_each_method_depends_on():
  values = get_config().to_dict()
  base = config_lib.ExperimentConfig.from_config(values)
  gamma4 = config_lib.ExperimentConfig.from_config({**values, 'gamma': 4})
  more = config_lib.ExperimentConfig.from_config({**values, 'limit': 3, 'drafters': ()})
  hot = config_lib.ExperimentConfig.from_config({**values, 'temperature': 0.7})
  assert base.fingerprint('autoregressive') == gamma4.fingerprint('autoregressive')
  assert base.fingerprint('ngram') != gamma4.fingerprint('ngram')
  assert base.fingerprint('early_exit') == base.fingerprint('early_exit')
  assert base.fingerprint('ngram') == more.fingerprint('ngram')
  assert base.fingerprint('autoregressive') != hot.fingerprint('autoregressive')


def test_early_exit_layers_are_checked_against_the_target_before_it_loads(tmp_path):
  """The embedded 270M has 18 layers: 18 early-exit layers is an error that names the
  key, raised by the preflight checks from the model's name alone (no weights read)."""
  from specjax.experiments import preflight  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  assert preflight.model_layers('embedded:gemma3-270m') == 18
  assert preflight.model_layers(str(embedded.default_gguf_path())) == 18   # its GGUF header
  values = get_config().to_dict()
  values.update(drafters=('early_exit',), early_exit=dict(layers=18),
                output_dir=str(tmp_path / 'out'))
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.early_exit.layers is 18: .* must be in \[1, 17\]'):
    preflight.check_config(config_lib.ExperimentConfig.from_config(values))
  values['early_exit'] = dict(layers=17)
  preflight.check_config(config_lib.ExperimentConfig.from_config(values))


def test_paper_table_sweeps_are_valid_cells_of_their_base_config():
  from specjax.experiments import sweep_cells  # pylint: disable=g-import-not-at-top
  module = config_files.load('paper_tables')
  for table, count in (('leviathan', 12), ('spec_bench', 3), ('chen', 6)):
    base = module.get_config(table)
    assert (base.chat_template, base.per_category, base.output_dir) == (
        False, 2, f'results/paper_tables-{table}')
    assert base.draft_length.adaptive == (table == 'spec_bench')
    cells = sweep_cells.expand(base.to_dict(), module.get_sweep(table))
    assert len(cells) == count
  assert module.get_config('chen,max_new_tokens=16').max_new_tokens == 16  # the arg wins
  assert len(module.get_sweep('leviathan,drafters=ngram')) == 4
  assert len(module.get_sweep('leviathan,drafters=ngram,gamma=4')) == 2
  with pytest.raises(ValueError, match='needs a table'):
    module.get_config('')


@pytest.mark.parametrize('tree, drafters, message', [
    ('-1,0,0,5', ('ngram',), r"config.tree is '-1,0,0,5': tree node 3 has parent 5"),
    ('0', ('ngram',), r"config.tree is '0': tree node 0 has parent 0"),
    ('medusa-99', ('ngram',), r"config.tree is 'medusa-99': unknown tree"),
    ('eagle-25', ('ngram', 'early_exit'), r"config.tree is 'eagle-25', a branching tree, but "
                                          r'drafter\(s\) early_exit draft chains only'),
])
def test_bad_trees_fail_before_anything_loads(tree, drafters, message):
  values = get_config().to_dict()
  values.update(tree=tree, drafters=drafters)
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.ExperimentConfig.from_config(values)


def test_a_tree_sets_gamma_verify_slots_and_fingerprint():
  from specjax.experiments import preflight
  values = get_config().to_dict()
  base = config_lib.ExperimentConfig.from_config(values)
  tree = config_lib.ExperimentConfig.from_config({**values, 'tree': 'eagle-25'})
  chain = config_lib.ExperimentConfig.from_config({**values, 'tree': 'chain-3',
                                                   'drafters': ('early_exit',)})
  assert base.token_tree is None and base.loop_gamma == 6
  assert tree.loop_gamma == 5 and chain.loop_gamma == 3
  assert preflight.verify_slots(tree, 'ngram') == 26 and preflight.verify_slots(base, 'ngram') == 7
  assert preflight.verify_slots(tree, 'autoregressive') == 1
  assert tree.fingerprint('ngram') != base.fingerprint('ngram')
  assert tree.fingerprint('autoregressive') == base.fingerprint('autoregressive')


def test_draft_length_settings_reach_the_policy():
  """Each nested draft_length key sets the loop's policy (costs given, so nothing
  is measured and no model is needed)."""
  values = {**get_config().to_dict(), 'gamma': 4}
  values['draft_length'] = dict(values['draft_length'], buckets=(0, 2, 4), costs=(1.0, 1.2, 1.5),
                                pool_rows=False, outcome_samples=8, finish_softness=2.0)
  policy_for = methods._policy  # pylint: disable=protected-access
  policy = policy_for(None, None, config_lib.ExperimentConfig.from_config(values), None, (4, 128))
  assert policy.buckets == (0, 2, 4) and policy.costs == (1.0, 1.2, 1.5)
  assert (policy.pool_rows, policy.outcome_samples, policy.finish_softness) == (False, 8, 2.0)
  values['draft_length'] = dict(values['draft_length'], pool_rows=True)
  assert policy_for(None, None, config_lib.ExperimentConfig.from_config(values), None,
                    (4, 128)).pool_rows
