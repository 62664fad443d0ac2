"""chat_template='auto': prompts are chat turns only for checkpoints that carry a chat template.

The template is read from a GGUF header (checked against gguf.GGUFReader) or a
Hugging Face directory; the embedded Gemma 3 270M is a base model and gets raw
text. The choice is recorded in the summary.
"""

import json
import pathlib

import gguf
import pytest

from specjax import experiment
from specjax.checkpoints import CheckpointError
from specjax.checkpoints import chat_template
from specjax.experiments import prompt_format
from specjax.experiments.config import ExperimentConfig

import config_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}"


def get_config(arg=None):
  return config_files.load('gemma').get_config(arg)


def write_gguf(path, template=None):
  """A GGUF header with a vocabulary, scalars of several types, an int array and a nested one."""
  writer = gguf.GGUFWriter(path, arch='gemma3')
  writer.add_block_count(2)
  writer.add_token_list([f'tok{i}' for i in range(300)] + ['', 'é', '▁▁'])
  writer.add_token_scores([float(-i) for i in range(303)])
  writer.add_token_types([1] * 303)
  writer.add_bool('test.flag', True)
  writer.add_uint64('test.big', 2 ** 40)
  writer.add_float64('test.ratio', 0.5)
  writer.add_array('test.nested', [[1, 2], [3]])
  if template is not None:
    writer.add_chat_template(template)
  writer.add_string('test.after', 'a field after the template')
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def test_gguf_chat_template_is_read_from_the_header(tmp_path):
  path = write_gguf(tmp_path / 'it.gguf', TEMPLATE)
  assert chat_template.find(path) == TEMPLATE
  assert gguf.GGUFReader(path).fields['tokenizer.chat_template'].contents() == TEMPLATE
  assert chat_template.find(write_gguf(tmp_path / 'base.gguf')) is None
  (tmp_path / 'notes.txt').write_text('not a GGUF')
  assert chat_template.find(tmp_path / 'notes.txt') is None


def test_a_truncated_gguf_header_is_an_error_naming_the_file(tmp_path):
  data = write_gguf(tmp_path / 'it.gguf', TEMPLATE).read_bytes()
  cut = tmp_path / 'cut.gguf'
  cut.write_bytes(data[:2000])  # inside the vocabulary
  with pytest.raises(CheckpointError, match='cut.gguf'):
    chat_template.find(cut)


def test_a_missing_path_or_unreadable_tokenizer_config_is_an_error_naming_it(tmp_path):
  with pytest.raises(CheckpointError, match='nowhere.gguf: no such file or directory'):
    chat_template.find(tmp_path / 'nowhere.gguf')
  (tmp_path / 'tokenizer_config.json').write_text('{"chat_template": ')
  with pytest.raises(CheckpointError, match='tokenizer_config.json: unreadable'):
    chat_template.find(tmp_path)


def test_hf_directory_chat_template(tmp_path):
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'bos_token': '<bos>'}))
  assert chat_template.find(tmp_path) is None
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'chat_template': TEMPLATE}))
  assert chat_template.find(tmp_path) == TEMPLATE
  (tmp_path / 'config.json').write_text('{}')
  assert chat_template.find(tmp_path / 'config.json') == TEMPLATE  # a file stands for its dir
  (tmp_path / 'tokenizer_config.json').write_text('{}')
  (tmp_path / 'chat_template.jinja').write_text(TEMPLATE)
  assert chat_template.find(tmp_path) == TEMPLATE


def _resolve(**overrides):
  config = get_config()
  config.update(overrides)
  return prompt_format.resolve(ExperimentConfig.from_config(config))


def test_auto_follows_the_checkpoint(tmp_path):
  it_model = str(write_gguf(tmp_path / 'it.gguf', TEMPLATE))
  base_model = str(write_gguf(tmp_path / 'base.gguf'))
  assert _resolve(model=it_model).chat
  assert 'instruction-tuned' in _resolve(model=it_model).reason
  assert not _resolve(model=base_model).chat
  assert not _resolve(model=base_model, chat_template=False).chat
  assert _resolve(model=base_model, chat_template=True).chat
  embedded = _resolve()  # the embedded Gemma 3 270M is the base model
  assert not embedded.chat and 'base model' in embedded.reason
  assert not _resolve(model='tiny-random').chat


def test_chat_template_setting_takes_auto_true_or_false():
  assert get_config().chat_template == 'auto'
  assert get_config('chat_template=false').chat_template is False
  assert get_config('chat_template=True').chat_template is True
  assert get_config('chat_template=auto').chat_template == 'auto'
  with pytest.raises(ValueError, match='chat_template'):
    get_config('chat_template=yes')
  config = get_config()
  config.chat_template = False  # a bool where the default is a string
  assert ExperimentConfig.from_config(config).chat_template is False
  for bad in ('Auto', 1, None):
    config.chat_template = bad
    with pytest.raises(ValueError, match='chat_template'):
      ExperimentConfig.from_config(config)


def test_the_choice_is_applied_and_recorded(tmp_path):
  prompts = tmp_path / 'prompts.jsonl'
  prompts.write_text(json.dumps({'id': 'p1', 'prompt': 'abc'}) + '\n')
  counts = {}
  for setting in ('auto', True):
    config = get_config()
    config.update(dict(model='tiny-random', prompts=str(prompts), max_new_tokens=2, drafters=(),
                       chat_template=setting, output_dir=str(tmp_path / str(setting))))
    summary, rows = experiment.run_experiment_with_rows(config)
    counts[setting] = rows[0]['prompt_tokens']
    assert summary['prompt_format']['chat'] is (setting is True)
    markdown = (tmp_path / str(setting) / 'summary.md').read_text()
    assert f'Prompt format: chat_template={setting}' in markdown
  assert counts['auto'] == 1 + 3  # BOS and three bytes: raw text
  wrapped = '<start_of_turn>user\nabc<end_of_turn>\n<start_of_turn>model\n'
  assert counts[True] == 1 + len(wrapped.encode())
