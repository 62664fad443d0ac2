"""Raw text or chat turns: `config.chat_template` resolved against the checkpoint.

'auto' (the default) wraps prompts in Gemma's user/model turns only when the
checkpoint carries a chat template, the mark of an instruction-tuned model. A
base model is given the raw text to continue: wrapped in turns it mostly echoes
the question, which measures the drafter on copying rather than on generation.
The choice and its reason are logged and written into the summary.
"""

from __future__ import annotations

import dataclasses

from specjax.checkpoints import chat_template
from specjax.checkpoints import embedded
from specjax.experiments.config import EMBEDDED_PREFIX, TINY_RANDOM, ExperimentConfig


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  chat: bool     # wrap each prompt in the user/model turns
  reason: str    # one line for a person: the setting and what decided it

  def apply(self, tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template(text) if self.chat else text


def resolve(config: ExperimentConfig) -> PromptFormat:
  if isinstance(config.chat_template, bool):
    return PromptFormat(config.chat_template, f'chat_template={config.chat_template}')
  if config.model == TINY_RANDOM:
    return PromptFormat(False, f'chat_template=auto: {TINY_RANDOM} has no chat template')
  sources = [str(embedded.default_gguf_path()) if config.model.startswith(EMBEDDED_PREFIX)
             else config.model]
  if config.tokenizer:
    sources.append(config.tokenizer)
  for source in sources:
    if chat_template.find(source) is not None:
      return PromptFormat(True, f'chat_template=auto: {source} carries a chat template '
                                '(instruction-tuned), so prompts are wrapped in chat turns')
  return PromptFormat(False, f'chat_template=auto: {config.model} carries no chat template '
                             '(a base model), so prompts are raw text to continue')
