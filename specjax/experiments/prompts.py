"""The prompt set: the built-in one, or a JSONL file in one of two formats.

Spec-Bench lines are `{"question_id", "category", "turns": [...]}` and only the
first turn is used (speculative decoding is measured per generation, not per
conversation); plain lines are `{"id", "prompt"}` with an optional "category".
A bad line fails with its file and line number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
from collections.abc import Sequence

from specjax.experiments.config import ConfigError

BUILTIN = 'builtin.jsonl'
# Raw-text starts (code, prose, news, dialogue, maths, translation by example, lists,
# Q&A), none from Spec-Bench: what a reduced draft vocabulary and a layer-skip set
# are fitted on, so that Spec-Bench stays held out.
CALIBRATION = 'calibration.jsonl'
# Hand-written requests and questions of the kinds people put to a model (writing,
# roleplay, puzzles, maths, code, extraction, science, humanities, translation,
# summaries of short passages, facts, word problems, answers from a given passage),
# 128 of them, none taken from Spec-Bench or MT-bench: training prompts whose text is
# shaped like the prompts drafters are measured on.
INSTRUCTIONS = 'instructions.jsonl'
# 128 more of the same kinds on other topics, written after INSTRUCTIONS and sharing none of
# its prompts: the third EAGLE recipe's prompts (configs/train_eagle.py:requests).
REQUESTS = 'requests.jsonl'
# The named prompt sets a drafter's training data may start from (`distill_data.Recipe`).
PROMPT_SETS = {'calibration': CALIBRATION, 'instructions': INSTRUCTIONS, 'requests': REQUESTS}


@dataclasses.dataclass(frozen=True)
class Prompt:
  id: str
  category: str
  text: str


def load_prompts(path: str = '') -> list[Prompt]:
  """Prompts from `path`, or the built-in set when it is ''."""
  if path:
    try:
      with open(path, encoding='utf-8') as f:
        return parse_jsonl(f.read(), path)
    except UnicodeDecodeError as e:
      raise ConfigError(f'config.prompts is {path!r}, which is not UTF-8 text ({e.reason} at '
                        f'byte {e.start})') from None
    except OSError as e:  # a directory, no permission, ...
      raise ConfigError(f'config.prompts is {path!r}, which cannot be read: '
                        f'{e.strerror or e}') from None
  source = importlib.resources.files('specjax.prompts') / BUILTIN
  return parse_jsonl(source.read_text(encoding='utf-8'), f'specjax/prompts/{BUILTIN}')


def prompt_set(name: str) -> tuple[list[Prompt], str]:
  """A named prompt set of the package (`PROMPT_SETS`) and the sha256 of its file."""
  if name not in PROMPT_SETS:
    raise ConfigError(f'unknown prompt set {name!r}; known: {", ".join(PROMPT_SETS)}')
  file = PROMPT_SETS[name]
  text = (importlib.resources.files('specjax.prompts') / file).read_text(encoding='utf-8')
  return parse_jsonl(text, f'specjax/prompts/{file}'), hashlib.sha256(text.encode()).hexdigest()


def parse_jsonl(text: str, source: str) -> list[Prompt]:
  prompts, seen = [], {}
  for number, line in enumerate(text.splitlines(), start=1):
    if not line.strip():
      continue
    where = f'{source}:{number}'
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ConfigError(f'{where}: not valid JSON ({e})') from None
    prompt = _prompt(record, where)
    if prompt.id in seen:
      raise ConfigError(f'{where}: prompt id {prompt.id!r} already used on line {seen[prompt.id]}')
    seen[prompt.id] = number
    prompts.append(prompt)
  if not prompts:
    raise ConfigError(f'{source} holds no prompts')
  return prompts


def _prompt(record, where: str) -> Prompt:
  if not isinstance(record, dict):
    raise ConfigError(f'{where}: expected a JSON object, got {type(record).__name__}')
  if 'turns' in record:
    id_key, turns = 'question_id', record['turns']
    if not isinstance(turns, list) or not turns:
      raise ConfigError(f'{where}: "turns" must be a non-empty list of strings')
    text = turns[0]
  elif 'prompt' in record:
    id_key, text = 'id', record['prompt']
  else:
    raise ConfigError(f'{where}: needs "question_id" and "turns" (Spec-Bench) or "id" and '
                     f'"prompt"; found keys {sorted(record)}')
  if id_key not in record or not isinstance(record[id_key], (str, int)):
    raise ConfigError(f'{where}: needs a string or integer "{id_key}"')
  category = record.get('category', 'uncategorized')
  if not isinstance(category, str) or not category:
    raise ConfigError(f'{where}: "category" must be a non-empty string')
  if not isinstance(text, str):
    raise ConfigError(f'{where}: the prompt must be a string, got {type(text).__name__}')
  if not text.strip():
    raise ConfigError(f'{where}: the prompt is empty')
  return Prompt(str(record[id_key]), category, text)


def select(prompts: Sequence[Prompt], categories: Sequence[str] = (), limit: int = 0,
           per_category: int = 0) -> list[Prompt]:
  """The prompts of `categories` (all when empty), the first `per_category` of each
  category (all when 0; Spec-Bench papers often run "2 per task"), then the first
  `limit` (all when 0), in file order."""
  if categories:
    known = sorted({p.category for p in prompts})
    unknown = [c for c in categories if c not in known]
    if unknown:
      raise ConfigError(f'config.categories names {", ".join(unknown)}, which the prompt set '
                       f'lacks; it has: {", ".join(known)}')
    prompts = [p for p in prompts if p.category in categories]
  if per_category:
    taken = {}
    kept = []
    for p in prompts:
      if taken.get(p.category, 0) < per_category:
        taken[p.category] = taken.get(p.category, 0) + 1
        kept.append(p)
    prompts = kept
  return list(prompts[:limit] if limit else prompts)
