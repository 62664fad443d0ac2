"""N-gram token trees against n-gram chains of the same verify width, in one run.

Gemma 3 270M (the embedded GGUF, float32), greedy, batch 1, raw-text
Spec-Bench prompts (first turn, no chat template; `--per_category` per task).
Every speculative method goes through the same tree loop (`decoding/tree_verify.py`):
a chain of W nodes is the tree `chain-W`, and a tree of W nodes verifies the same
W + 1 positions per target call, so the two differ only in where the n-gram
drafter's nodes go: one candidate continuation, or several (other suffix
lengths, earlier occurrences) sharing the width. Prints, with the CPU model and
flags, per method: mean accepted tokens per target call (new tokens / target
calls, the prefill counted, as Spec-Bench), tokens/s and speedup over
autoregressive decoding on the same prompts, and each tree's ratios over its
chain. Compilation is excluded (each program runs once untimed per shape
bucket first). Greedy outputs are checked identical to autoregressive.

  PYTHONPATH=. .venv/bin/python benchmarks/trees.py --per_category=2 --max_new_tokens=64 \
      --pairs='chain-4:-1,0,1,-1;chain-8:-1,0,1,2,3,-1,5,-1'
"""

from __future__ import annotations

import collections
import os
import sys
import time
import zlib

from absl import app
from absl import flags
import jax

from specjax import checkpoints
from specjax import compile_cache
from specjax.checkpoints import embedded
from specjax.decoding import autoregressive, program, speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import make_drafter
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC_BENCH = os.path.join(_HERE, '..', '..', 'shared', 'data', 'spec_bench_question.jsonl')

PROMPTS = flags.DEFINE_string('prompts', _SPEC_BENCH, 'Spec-Bench question.jsonl.')
PER_CATEGORY = flags.DEFINE_integer('per_category', 2, 'Prompts per Spec-Bench task.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated per prompt.')
# (chain, tree) pairs of the same node count: the tree keeps a main path and
# spends the rest of the width on alternatives at the root.
PAIRS = flags.DEFINE_string('pairs', 'chain-4:-1,0,1,-1;chain-8:-1,0,1,2,3,-1,5,-1',
                            'chain:tree pairs of equal node counts, ";"-separated (trees as '
                            'presets or "-1,0,..." parents).')


def _prompts(tokenizer):
  by_task = collections.defaultdict(list)
  for p in prompts_lib.load_prompts(PROMPTS.value):
    by_task[p.category].append(p)
  chosen = [p for task in by_task.values() for p in task[:PER_CATEGORY.value]]
  return chosen, {p.id: tokenizer.encode(p.text, add_bos=True) for p in chosen}


def main(argv):
  del argv
  compile_cache.enable()
  print(cpu_info.describe())
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model = LanguageModel(config)
  params = jax.device_put(q8_weights.with_q8_weights(params))  # the head as the product serves it
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  eos = (tokenizer.eos_id,)
  chosen, ids = _prompts(tokenizer)
  ngram = make_drafter('ngram', target=model)
  pairs = [tuple(p.split(':')) for p in PAIRS.value.split(';')]
  trees = {spec: tree_lib.parse(spec) for pair in pairs for spec in pair}
  for chain, tree in pairs:
    if trees[chain].num_nodes != trees[tree].num_nodes:
      sys.exit(f'{chain} and {tree} differ in node count')
  methods = ['autoregressive'] + list(trees)
  width = max(t.num_nodes for t in trees.values()) + 1
  compiled = set()
  totals = {m: collections.Counter() for m in methods}
  reference, mismatches = {}, []
  start = time.time()
  for n, p in enumerate(chosen):
    row_id = zlib.crc32(p.id.encode())
    packed = program.pack(model, [ids[p.id]], max_new_tokens=MAX_NEW.value, extra_slots=width,
                          row_ids=[row_id])
    for method in methods:
      if method == 'autoregressive':
        call = lambda: autoregressive.generate(model, params, packed,  # noqa: E731
                                               max_new_tokens=MAX_NEW.value, eos_ids=eos)
      else:
        tree = trees[method]
        call = lambda: speculative.generate(model, params, ngram, packed,  # noqa: E731
                                            gamma=tree.max_depth, max_new_tokens=MAX_NEW.value,
                                            eos_ids=eos, tree=tree)
      if (method, packed.bucket) not in compiled:
        call()
        compiled.add((method, packed.bucket))
      out = call()
      new = out.new_tokens[0]
      t = totals[method]
      t['new'] += len(new)
      t['wall'] += out.wall_s
      t['calls'] += out.target_calls[0] if method != 'autoregressive' else out.steps + 1
      if method == 'autoregressive':
        reference[p.id] = new
      elif new != reference[p.id]:
        mismatches.append((method, p.id))
    print(f'[{n + 1}/{len(chosen)}, {time.time() - start:.0f} s] {p.id} ({p.category}, '
          f'{len(ids[p.id])} tokens)', flush=True)

  base = totals['autoregressive']['new'] / totals['autoregressive']['wall']
  lines = [cpu_info.describe(),
           f'Gemma 3 270M, greedy, batch 1, {len(chosen)} raw-text Spec-Bench prompts '
           f'({PER_CATEGORY.value} per task), {MAX_NEW.value} new tokens, n-gram drafter '
           f'(max_n 3, min_n 1, 4 matches per n)', '',
           '| method | nodes | depth | mean accepted tokens | tokens/s | speedup |',
           '|---|---|---|---|---|---|']
  figures = {}
  for method in methods:
    t = totals[method]
    tps = t['new'] / t['wall']
    mat = t['new'] / t['calls']
    figures[method] = (mat, tps / base)
    tree = trees.get(method)
    lines.append(f'| {method} | {tree.num_nodes if tree else "-"} | '
                 f'{tree.max_depth if tree else "-"} | {mat:.2f} | {tps:.1f} | {tps / base:.2f}x |')
  lines += ['', '| tree / chain (same width) | mean accepted tokens | speedup |', '|---|---|---|']
  for chain, tree in pairs:
    lines.append(f'| {tree} / {chain} | {figures[tree][0] / figures[chain][0]:.3f} | '
                 f'{figures[tree][1] / figures[chain][1]:.3f} |')
  lines += ['', f'greedy outputs identical to autoregressive: '
            f'{"yes" if not mismatches else f"NO: {mismatches}"}',
            f'command: PYTHONPATH=. python benchmarks/trees.py --per_category={PER_CATEGORY.value} '
            f"--max_new_tokens={MAX_NEW.value} --pairs='{PAIRS.value}'"]
  print('\n'.join(lines))


if __name__ == '__main__':
  app.run(main)
