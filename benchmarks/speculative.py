"""Spec-Bench speedups of each drafter and gamma over autoregressive decoding.

Gemma 3 270M (the embedded GGUF, float32), batch 1, greedy, as Spec-Bench
measures: per task, speedup = mean tokens/s of the method / mean tokens/s of
autoregressive decoding of the same prompts in the same run, and mean accepted
tokens per target call (the corrected or bonus token included, so plain
decoding scores 1.00). Beside each measured speedup it prints the one
predicted from the measured mean accepted tokens and the measured costs of a
decode step, a verify call and a draft step, each measured at the prompt's
own cache length (the slots of the program it ran in):

  predicted wall = prefill + verify calls x (verify call + gamma x draft step),

where the prefill (shared by both methods) is the baseline's wall time less
its decode steps, so that with mean accepted tokens per call k the decode part
is predicted k x decode step / (verify call + gamma x draft step) faster; the
ratio of measured to predicted speedup is the engine's efficiency. Step costs
are kept in `<out>/costs.json` and reused by a rerun. Compilation is excluded: each
(method, shape bucket) runs once untimed first. Rows go to
`<out>/rows.jsonl` as they are measured, and a rerun resumes from them.

  .venv/bin/python benchmarks/speculative.py --per_category=3 --max_new_tokens=128

With `--hf_prompt_lookup` (needs the `compare` extra) it also times
transformers' `generate(..., prompt_lookup_num_tokens=10)` and plain
`generate` on the same prompts, for a side-by-side tokens/s ratio.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specjax import checkpoints
from specjax import sampling
from specjax.decoding import autoregressive, speculative
from specjax.decoding import batch as batch_lib
from specjax.drafters import make_drafter
from specjax.experiments import prompts as prompts_lib
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer
from specjax.checkpoints import embedded

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC_BENCH = os.path.join(_HERE, '..', '..', 'shared', 'data', 'spec_bench_question.jsonl')

PROMPTS = flags.DEFINE_string('prompts', _SPEC_BENCH, 'Spec-Bench question.jsonl.')
PER_CATEGORY = flags.DEFINE_integer('per_category', 3, 'Prompts per Spec-Bench task (0: all).')
CATEGORIES = flags.DEFINE_list('categories', [], 'Only these tasks (empty: all 13).')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 128, 'Tokens generated per prompt.')
DRAFTERS = flags.DEFINE_list('drafters', ['ngram', 'early_exit'], 'Drafters to compare.')
GAMMAS = flags.DEFINE_list('gammas', ['2', '4', '6', '8'], 'Draft lengths.')
EARLY_EXIT_LAYERS = flags.DEFINE_integer('early_exit_layers', 6, 'Layers of the early-exit drafter.')
OUT = flags.DEFINE_string('out', 'results/bench_speculative', 'Output directory.')
HF = flags.DEFINE_bool('hf_prompt_lookup', False, "Also time transformers' prompt lookup.")
HF_PROMPTS = flags.DEFINE_integer('hf_prompts', 4, 'Prompts per task for the transformers run.')
HF_TASKS = flags.DEFINE_list('hf_tasks', ['summarization', 'rag'], 'Tasks for the transformers run.')


def _timed(fn, *args, repeats=5):
  jax.block_until_ready(fn(*args))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def measure_costs(model: LanguageModel, params, drafter, gamma: int, num_slots: int,
                  steps: int = 8) -> dict[str, float]:
  """Seconds per decode step, verify call and draft round, inside compiled loops."""
  cache = model.init_cache(1, num_slots)
  start_pos = num_slots // 2

  def loop_of(width):
    @jax.jit
    def run(params, cache):
      def body(i, carry):
        cache, acc = carry
        tokens = jnp.full((1, width), 100, jnp.int32) + acc
        positions = (start_pos + i + jnp.arange(width))[None]
        logits, cache = model.forward(params, tokens, positions, cache)
        return cache, (jnp.argmax(logits[0, -1]) % 2).astype(jnp.int32)
      return jax.lax.fori_loop(0, steps, body, (cache, jnp.int32(0)))[1]
    return run

  decode = _timed(loop_of(1), params, cache) / steps
  verify = _timed(loop_of(gamma + 1), params, cache) / steps
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 1000, (1, num_slots)), jnp.int32)
  lengths = jnp.asarray([start_pos], jnp.int32)
  keys = sampling.row_keys(0, [0])
  greedy = sampling.SamplingConfig()

  @jax.jit
  def draft_rounds(params, cache, tokens):
    state = drafter.init(drafter.params, tokens, lengths, 16, cache)
    def body(i, carry):
      state, cache, acc = carry
      draft, _, state, cache = drafter.propose(drafter.params, state, tokens, lengths + i, keys,
                                               greedy, gamma, params, cache)
      state = drafter.update(drafter.params, state, tokens, lengths + i + 1)
      return state, cache, acc + draft[0, -1]
    return jax.lax.fori_loop(0, steps, body, (state, cache, jnp.int32(0)))[2]

  draft_round = _timed(draft_rounds, params, cache, tokens) / steps
  return {'decode_s': decode, 'verify_s': verify, 'draft_round_s': draft_round,
          'draft_step_s': draft_round / gamma}


def _load_rows(path):
  rows = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          rows[(row['prompt_id'], row['method'])] = row
  return rows


def main(argv):
  del argv
  os.makedirs(OUT.value, exist_ok=True)
  if not os.path.exists(PROMPTS.value):
    sys.exit(f'Spec-Bench prompts not found at {PROMPTS.value} (see ../shared/data/README.md)')
  prompts = prompts_lib.load_prompts(PROMPTS.value)
  by_task = collections.defaultdict(list)
  for p in prompts:
    if not CATEGORIES.value or p.category in CATEGORIES.value:
      by_task[p.category].append(p)
  chosen = [p for task in by_task.values()
            for p in (task[:PER_CATEGORY.value] if PER_CATEGORY.value else task)]

  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model = LanguageModel(config)
  params = jax.device_put(params)
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  eos = [tokenizer.eos_id] + ([tokenizer.end_of_turn_id] if tokenizer.end_of_turn_id else [])
  ids = {p.id: tokenizer.encode(tokenizer.apply_chat_template(p.text), add_bos=True)
         for p in chosen}
  gammas = [int(g) for g in GAMMAS.value]
  methods = [('autoregressive', None, 0)] + [
      (f'{d}@{g}', d, g) for d in DRAFTERS.value for g in gammas]
  drafters = {d: make_drafter(d, target=model, early_exit_layers=EARLY_EXIT_LAYERS.value)
              for d in DRAFTERS.value}

  rows_path = os.path.join(OUT.value, 'rows.jsonl')
  rows = _load_rows(rows_path)
  warmed = set()
  total = len(chosen) * len(methods)
  done_count = 0
  with open(rows_path, 'a') as out:
    for p in chosen:
      for method, drafter_name, gamma in methods:
        done_count += 1
        if (p.id, method) in rows:
          continue

        def run():
          if drafter_name is None:
            return autoregressive.generate(model, params, [ids[p.id]],
                                           max_new_tokens=MAX_NEW.value, eos_ids=eos)
          return speculative.generate(model, params, drafters[drafter_name], [ids[p.id]],
                                      gamma=gamma, max_new_tokens=MAX_NEW.value, eos_ids=eos)
        bucket = (method, max(16, 1 << (len(ids[p.id]) - 1).bit_length()))
        if bucket not in warmed:
          run()
          warmed.add(bucket)
        result = run()
        row = {'prompt_id': p.id, 'category': p.category, 'method': method,
               'drafter': drafter_name or 'autoregressive', 'gamma': gamma,
               'prompt_tokens': len(ids[p.id]), 'new_tokens': len(result.new_tokens[0]),
               'wall_s': result.wall_s, 'output_ids': result.new_tokens[0]}
        if drafter_name is not None:
          row.update(target_calls=result.target_calls[0], accepted=result.accepted_tokens[0],
                     drafted=result.drafted_tokens[0])
        else:
          row.update(target_calls=result.steps + 1)
        rows[(p.id, method)] = row
        out.write(json.dumps(row) + '\n')
        out.flush()
        logging.info('[%d/%d] %s %s: %d tokens, %.1f tok/s', done_count, total, p.id, method,
                     row['new_tokens'], row['new_tokens'] / row['wall_s'])

  # Step costs depend on the cache length, so each prompt is predicted from the
  # costs measured at its own cache bucket (the slots its program ran with).
  slots_of = {p.id: _num_slots(len(ids[p.id]), MAX_NEW.value, max(gammas) + 1, config)
              for p in chosen}
  costs_path = os.path.join(OUT.value, 'costs.json')
  costs = {}
  if os.path.exists(costs_path):  # measured by an earlier run of the same --out
    with open(costs_path) as f:
      costs = {(c.pop('method'), c.pop('slots')): c for c in json.load(f)}
  for slots in sorted(set(slots_of.values())):
    for d in DRAFTERS.value:
      for g in gammas:
        if (f'{d}@{g}', slots) in costs:
          continue
        costs[(f'{d}@{g}', slots)] = measure_costs(model, params, drafters[d], g, slots)
        logging.info('costs %s@%d at %d slots: %s', d, g, slots, costs[(f'{d}@{g}', slots)])
  report = summarize(rows, chosen, methods, costs, slots_of)
  if HF.value:
    report += '\n' + hf_side_by_side(chosen, ids, rows, eos)
  print(report)
  with open(os.path.join(OUT.value, 'report.md'), 'w') as f:
    f.write(report)
  with open(os.path.join(OUT.value, 'costs.json'), 'w') as f:
    json.dump([dict(method=m, slots=n, **c) for (m, n), c in costs.items()], f, indent=1)


def _num_slots(prompt_len, max_new, extra, config) -> int:
  return batch_lib.pack([[1] * prompt_len], max_new_tokens=max_new, extra_slots=extra,
                        max_slots=config.max_position).num_slots


def summarize(rows, chosen, methods, costs, slots_of) -> str:
  tasks = sorted({p.category for p in chosen})
  lines = ['| method | task | speedup | predicted | efficiency | acceptance | mean accepted | '
           'identical |', '|---|---|---|---|---|---|---|---|']
  for method, drafter_name, gamma in methods[1:]:
    for task in tasks + ['overall']:
      ps = [p for p in chosen if task in ('overall', p.category)]
      base = [rows[(p.id, 'autoregressive')] for p in ps]
      mine = [rows[(p.id, method)] for p in ps]
      base_tps = np.mean([r['new_tokens'] / r['wall_s'] for r in base])
      mine_tps = np.mean([r['new_tokens'] / r['wall_s'] for r in mine])
      mean_acc = sum(r['new_tokens'] for r in mine) / sum(r['target_calls'] for r in mine)
      acc_rate = sum(r['accepted'] for r in mine) / max(1, sum(r['drafted'] for r in mine))
      # Both methods share the prefill and the first token, so the prediction
      # keeps the baseline's measured prefill and replaces its decode steps.
      predicted_tps = []
      for p, a, m in zip(ps, base, mine):
        c = costs[(method, slots_of[p.id])]
        prefill_s = max(0.0, a['wall_s'] - (a['target_calls'] - 1) * c['decode_s'])
        step_s = c['verify_s'] + gamma * c['draft_step_s']
        predicted_tps.append(m['new_tokens'] / (prefill_s + (m['target_calls'] - 1) * step_s))
      predicted = np.mean(predicted_tps) / base_tps
      speedup = mine_tps / base_tps
      same = np.mean([a['output_ids'] == b['output_ids'] for a, b in zip(mine, base)])
      lines.append(f'| {method} | {task} | {speedup:.2f}x | {predicted:.2f}x | '
                   f'{speedup / predicted:.2f} | {acc_rate:.2f} | {mean_acc:.2f} | {same:.2f} |')
  cost_lines = ['', '| method | cache slots | decode step ms | verify ms | verify / decode | '
                'draft step ms |', '|---|---|---|---|---|---|']
  for (method, slots), c in sorted(costs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    cost_lines.append(f"| {method} | {slots} | {1e3 * c['decode_s']:.1f} | "
                      f"{1e3 * c['verify_s']:.1f} | {c['verify_s'] / c['decode_s']:.2f} | "
                      f"{1e3 * c['draft_step_s']:.2f} |")
  return '\n'.join(lines + cost_lines)


def hf_side_by_side(chosen, ids, rows, eos) -> str:
  sys.path.insert(0, _HERE)
  import hf_reference  # pylint: disable=g-import-not-at-top
  model, _ = hf_reference.load_hf_model(embedded.default_gguf_path(), num_threads=2)
  lines = ['', '| task | transformers tok/s | transformers PLD tok/s | specjax AR tok/s | '
           'specjax ngram@best tok/s | specjax ngram / transformers PLD |', '|---|---|---|---|---|---|']
  for task in HF_TASKS.value:
    ps = [p for p in chosen if p.category == task][:HF_PROMPTS.value]
    if not ps:
      continue
    hf_plain, hf_pld = [], []
    for p in ps:
      hf_reference.hf_greedy_generate(model, ids[p.id][:32], 4)  # warm-up
      new, secs = hf_reference.hf_greedy_generate(model, ids[p.id], MAX_NEW.value)
      hf_plain.append(len(new) / secs)
      new, secs = hf_reference.hf_greedy_generate(model, ids[p.id], MAX_NEW.value,
                                                  prompt_lookup_num_tokens=10)
      hf_pld.append(len(new) / secs)
    ngram_methods = sorted({m for (_, m) in rows if m.startswith('ngram@')})
    best = max((np.mean([rows[(p.id, m)]['new_tokens'] / rows[(p.id, m)]['wall_s'] for p in ps]), m)
               for m in ngram_methods)
    ar = np.mean([rows[(p.id, 'autoregressive')]['new_tokens'] / rows[(p.id, 'autoregressive')]['wall_s']
                  for p in ps])
    lines.append(f'| {task} | {np.mean(hf_plain):.1f} | {np.mean(hf_pld):.1f} | {ar:.1f} | '
                 f'{best[0]:.1f} ({best[1]}) | {best[0] / np.mean(hf_pld):.2f}x |')
  del eos
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main)
