"""What ships in specjax/drafters/data for the embedded 270M: small, packaged, remakeable,
and, run on the real target, exact and better than untrained drafters of the same shape.

The issue's budget is 25 MB for every shipped drafter together; each trained
drafter directory carries its manifest (the target, the command that made it,
its config and data recipe) and its curve, is named in the data README with
that command, and is matched by the package-data globs, so a wheel carries it.
"""

import dataclasses
import json
import pathlib
import re
import tomllib

import jax
import jax.numpy as jnp
import pytest

from specjax import checkpoints
from specjax.checkpoints import drafter_io
from specjax.checkpoints.errors import CheckpointError
from specjax.decoding import autoregressive, draft_length, speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import make_drafter
from specjax.models.config import tiny_config
from specjax.models.language_model import LanguageModel
from specjax.training import trainer

import config_files
from real_prompts import PROMPTS

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
    command = manifest['command']
    assert command.startswith(f'python -m specjax.train --config=configs/train_{kind}.py')
    assert command in readme and directory.name in readme
    # The config file alone remakes it: every value the run recorded is the file's value
    # for the recipe the command names (`:<recipe>`; output_dir aside: where that run
    # wrote). Keys added since are not in the manifest.
    recipe = re.match(rf'python -m specjax.train --config=configs/train_{kind}.py(?::(\w+))?',
                      command).group(1)
    recorded = manifest['train_config']
    remade = json.loads(json.dumps(dataclasses.asdict(trainer.TrainConfig.from_config(
        config_files.load(f'train_{kind}').get_config(recipe)))))
    for key, value in recorded.items():
      if key == 'output_dir':
        continue
      if key == 'init_from' and value == 'embedded' and remade[key]:
        # Continued from the drafter shipped then, which the recipe's own init_from makes:
        # the manifest records where it started and that drafter's command, also named here.
        assert manifest['init_from']['command'] in readme, manifest['init_from']
        continue
      if isinstance(value, dict):
        assert {k: remade[key].get(k) for k in value} == value, (kind, key)
      else:
        assert remade[key] == value, (kind, key, remade[key], value)
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


def test_the_shipped_eagle_drafter_is_exact_and_beats_an_untrained_one(gemma270m):
  """The EAGLE drafter shipped for the embedded 270M (eagle.checkpoint='embedded'): tied to
  this target, greedy output identical to autoregressive at batch 3 of mixed lengths, and
  more drafts accepted than by an untrained layer of the same shape, on prompts that are
  not its training data (the target's own text from BOS)."""
  from specjax.drafters import eagle_net  # pylint: disable=g-import-not-at-top
  model, params = gemma270m
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  net, ids, manifest = drafter_io.load_drafter('embedded', 'eagle', target=signature)
  untrained = eagle_net.init_params(model.config, len(manifest['hidden_layers']),
                                    net['gate_FxD'].shape[0], jax.random.key(0),
                                    params['final_norm']['scale'])
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted = {}
  for name, weights in (('trained', net), ('untrained', untrained)):
    drafter = make_drafter('eagle', target=model, trained=(weights, ids, manifest),
                           target_params=params)
    out = speculative.generate(model, params, drafter, PROMPTS, gamma=4, max_new_tokens=24,
                               policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted


def test_the_shipped_distilled_drafter_is_exact_and_beats_the_target_cut_short(gemma270m):
  """The distilled draft model shipped for the embedded 270M (draft_model.checkpoint=
  'embedded'): tied to this target, greedy output identical to autoregressive at batch 3
  of mixed lengths, and more drafts accepted than by its untrained start (the target's
  first blocks and final norm, through the same draft vocabulary), on prompts that are
  not its training data; exact as a branching tree too."""
  from specjax.training import distilled_objective  # pylint: disable=g-import-not-at-top
  model, params = gemma270m
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  weights, ids, manifest = drafter_io.load_drafter('embedded', 'distilled', target=signature)
  layers = manifest['student_layers']
  student = LanguageModel(distilled_objective.student_config(model.config, layers))
  untrained = distilled_objective.student_init(params, layers)
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted, drafters = {}, {}
  for name, student_weights in (('trained', jax.tree.map(jnp.asarray, weights)),
                                ('untrained', untrained)):
    student_params = distilled_objective.student_params(student_weights, params['embedding_VxD'])
    drafters[name] = make_drafter('draft_model', target=model,
                                  draft_model=(student, student_params, jnp.asarray(ids)))
    out = speculative.generate(model, params, drafters[name], PROMPTS, gamma=4, max_new_tokens=24,
                               policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted
  tree = tree_lib.parse('-1,-1,0,0,2,4')   # the trained one, as a branching tree
  out = speculative.generate(model, params, drafters['trained'], PROMPTS, gamma=tree.max_depth,
                             max_new_tokens=24, tree=tree)
  assert out.new_tokens == reference.new_tokens


def test_the_shipped_medusa_heads_are_exact_and_beat_untrained_ones(gemma270m):
  """The Medusa heads shipped for the embedded 270M (medusa.checkpoint='embedded'): tied to
  this target, greedy output identical to autoregressive at batch 3 of mixed lengths, as a
  chain and as a tree, and more drafts accepted than by untrained heads of the same
  shape (residual blocks at zero: every head guesses the target's own next token)."""
  from specjax.drafters import medusa  # pylint: disable=g-import-not-at-top
  model, params = gemma270m
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  heads, ids, manifest = drafter_io.load_drafter('embedded', 'medusa', target=signature)
  untrained = medusa.init_heads(len(heads['w_KxDxD']), model.config.embed_dim)
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted, drafters = {}, {}
  for name, weights in (('trained', jax.tree.map(jnp.asarray, heads)), ('untrained', untrained)):
    drafters[name] = make_drafter('medusa', target=model, trained=(weights, ids, manifest),
                                  target_params=params)
    out = speculative.generate(model, params, drafters[name], PROMPTS, gamma=4,
                               max_new_tokens=24, policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted
  tree = tree_lib.parse('-1,-1,0,0,2,4')   # 4 deep: a level per head
  out = speculative.generate(model, params, drafters['trained'], PROMPTS, gamma=tree.max_depth,
                             max_new_tokens=24, tree=tree)
  assert out.new_tokens == reference.new_tokens
