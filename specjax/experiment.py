"""`run_experiment(config)`: every method on every prompt, timed, written as it goes.

The library function behind `python -m specjax.run`, callable from a notebook
with `configs/gemma.py`'s `get_config()`. Every input is checked first: the
config, the prompt file, the tokenizer, each prompt's length against the
cache, the mesh against the devices; only then is the output directory
locked and, if a row is missing, the model loaded. The autoregressive baseline
runs first, then each drafter; rows land in `output_dir/results.jsonl` one by
one, so a killed run resumes where it stopped, and `summary.json` /
`summary.md` are written at the end.

Times exclude compilation: the first batch of each shape bucket is run once,
untimed, for one new token per row, before the batches that are timed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import platform
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging
import jax

from specjax.decoding import divergence as divergence_lib
from specjax.experiments import loading
from specjax.experiments import methods as methods_lib
from specjax.experiments import preflight
from specjax.experiments import prompt_format as prompt_format_lib
from specjax.experiments import prompts as prompts_lib
from specjax.experiments import results as results_lib
from specjax.experiments import summary as summary_lib
from specjax.experiments.config import BASELINE, ExperimentConfig

_SHOWN_CHARS = 240  # of each generation, on stdout
TIMING_NOTE = ('Times exclude compilation: the first batch of each shape bucket ran once, '
               'untimed, for one new token per row, before the timed run.')


def run_experiment(config: Mapping[str, Any]) -> dict[str, Any]:
  """Runs `config` (a ConfigDict or dict with every key of configs/gemma.py).

  Returns the summary that summary.json holds.
  """
  return run_experiment_with_rows(config)[0]


def run_experiment_with_rows(config: Mapping[str, Any]
                             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """`run_experiment`, also returning this run's rows (a sweep records them per cell)."""
  cfg = ExperimentConfig.from_config(config)
  preflight.check_config(cfg)
  prompts = prompts_lib.select(prompts_lib.load_prompts(cfg.prompts), cfg.categories, cfg.limit,
                              cfg.per_category)
  prompt_format = prompt_format_lib.resolve(cfg)
  tokenizer = loading.tokenizer(cfg)
  preflight.check_draft_vocab(cfg, tokenizer)
  token_ids = {p.id: tokenizer.encode(prompt_format.apply(tokenizer, p.text), add_bos=True)
               for p in prompts}
  skipped = preflight.fit_prompts(cfg, [p.id for p in prompts], token_ids)
  checkpoints = loading.checkpoint_digests(cfg)
  with results_lib.ResultsDir(cfg, checkpoints) as results:
    logging.info('prompt format: %s', prompt_format.reason)  # after the checks and the lock
    run = _Run(cfg, checkpoints, prompts, token_ids, skipped, tokenizer, results,
               functools.cache(lambda: _load(cfg, tokenizer)))  # loads only if a row is missing
    rows = {}
    for method in cfg.methods:
      rows[method] = _run_method(method, run, baseline=rows.get(BASELINE))
    all_rows = [row for method_rows in rows.values() for row in method_rows.values()]
    summary = _summary(cfg, [row for row in all_rows if 'skipped' not in row], skipped,
                       prompt_format)
    results.finish()
    summary_json = json.dumps(summary, indent=2) + '\n'
    results_lib.write_text(cfg.output_dir, results_lib.SUMMARY_JSON, summary_json)
    results_lib.write_text(cfg.output_dir, results_lib.SUMMARY_MD, summary_lib.markdown(summary))
  print(f'\n{summary["title"]}\n{TIMING_NOTE}\nPrompt format: {prompt_format.reason}\n\n'
        f'{summary_lib.table(summary["methods"])}\n\nWritten to {cfg.output_dir}/')
  return summary, all_rows


def run_sweep(config: Mapping[str, Any], sweep: Sequence[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
  """`specjax.experiments.sweep_runner.run_sweep`, here too for notebooks that import it here."""
  # Imported here: sweep_runner imports this module.
  from specjax.experiments import sweep_runner  # pylint: disable=g-import-not-at-top
  return sweep_runner.run_sweep(config, sweep)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What every method of one run shares: inputs checked, output directory locked."""
  cfg: ExperimentConfig
  checkpoints: Mapping[str, str]             # 'model' / 'draft_model' -> content sha256
  prompts: Sequence[prompts_lib.Prompt]
  token_ids: Mapping[str, list[int]]         # prompt id -> ids, BOS and chat markup included
  skipped: Mapping[str, str]                 # prompt id -> why it is not run
  tokenizer: Any
  results: results_lib.ResultsDir
  loaded: Callable[[], tuple]                # -> (runners, eos_ids, (model, params))


def _load(cfg: ExperimentConfig, tokenizer):
  """Every method's runner, the stop ids and the target (model, params).

  All drafters are built here, so a bad drafter setting fails before the
  baseline has run, not after.
  """
  logging.info('Loading %s', cfg.model)
  model, params = loading.load(cfg)
  preflight.check_model(cfg, model.config.max_position)
  eos_ids = tuple(i for i in (tokenizer.eos_id, getattr(tokenizer, 'end_of_turn_id', None))
                  if i is not None)
  runners = {m: methods_lib.make_runner(m, model, params, cfg, eos_ids) for m in cfg.methods}
  return runners, eos_ids, (model, params)


def _run_method(method, run: _Run, baseline):
  """This method's row for every prompt: read back from results.jsonl, or computed now.

  A prompt in `run.skipped` gets a row that says why, and is never run.
  """
  cfg, prompts, token_ids, results = run.cfg, run.prompts, run.token_ids, run.results
  fingerprint = cfg.fingerprint(method, run.checkpoints)
  done = {p.id: results.get(p.id, method, fingerprint) for p in prompts}
  for p in prompts:
    if done[p.id] is None and p.id in run.skipped:
      done[p.id] = dict(prompt_id=p.id, category=p.category, method=method,
                        fingerprint=fingerprint, prompt_tokens=len(token_ids[p.id]),
                        skipped=run.skipped[p.id])
      results.append(done[p.id])
  pending = [p for p in prompts if done[p.id] is None]
  logging.info('%s: %d of %d prompts already in %s', method, len(prompts) - len(pending),
               len(prompts), results.path)
  if not pending:
    return done
  runners, eos_ids, target = run.loaded()
  runner = runners[method]
  position = {p.id: i + 1 for i, p in enumerate(prompts)}
  # Every batch's cache holds the run's longest prompt (done or not, so a resumed run
  # packs as the first did): one slot count, and a program per prefill bucket only.
  longest = max(len(token_ids[p.id]) for p in prompts if p.id not in run.skipped)
  compiled = set()
  for start in range(0, len(pending), cfg.batch_size):
    batch = pending[start:start + cfg.batch_size]
    ids = [token_ids[p.id] for p in batch]
    row_ids = [zlib.crc32(p.id.encode()) for p in batch]  # the rng stream follows the prompt
    packed = runner.pack(ids, row_ids, run_longest=longest)
    if packed.bucket not in compiled:
      logging.info('%s: compiling shape bucket %s (untimed warm-up run)', method, packed.bucket)
      runner.run(packed, warm_up=True)
      compiled.add(packed.bucket)
    out = runner.run(packed)
    for p, prompt_ids, new_ids, stats in zip(batch, ids, out.new_tokens, out.stats):
      row = _row(cfg, method, fingerprint, p, prompt_ids, new_ids, out.wall_s / len(batch),
                 out.wall_s, run.tokenizer, eos_ids, stats, baseline)
      if row.get('identical_to_baseline') is False and cfg.temperature == 0.0:
        row['divergence'] = _divergence(target, prompt_ids, baseline[p.id]['output_ids'], new_ids)
      results.append(row)
      done[p.id] = row
      _show(row, position[p.id], len(prompts))
  return done


def _row(cfg, method, fingerprint, prompt, prompt_ids, new_ids, wall_s, batch_wall_s, tokenizer,
         eos_ids, stats, baseline) -> dict[str, Any]:
  shown = new_ids[:-1] if new_ids and new_ids[-1] in eos_ids else new_ids
  row = dict(prompt_id=prompt.id, category=prompt.category, method=method,
             fingerprint=fingerprint, temperature=cfg.temperature,
             top_k=cfg.top_k, top_p=cfg.top_p,
             prompt_tokens=len(prompt_ids), new_tokens=len(new_ids),
             wall_s=wall_s,               # this row's share of its batch's time
             batch_wall_s=batch_wall_s, batch_size=cfg.batch_size,
             tokens_per_s=len(new_ids) / wall_s if wall_s > 0 else None,
             output_ids=list(new_ids), text=tokenizer.decode(shown))
  if method != BASELINE:
    row.update(stats)
    row['identical_to_baseline'] = new_ids == baseline[prompt.id]['output_ids']
  return row


def _divergence(target, prompt_ids, baseline_ids, new_ids) -> dict[str, Any]:
  """Where a greedy output left the baseline, and the target's top-2 logit margin there:
  a margin near 0 is a float tie between batched and one-token passes, a large one a bug."""
  model, params = target
  found = divergence_lib.explain(model, params, prompt_ids, baseline_ids, new_ids)
  logging.warning('greedy output differs from the baseline at token %d (target logit margin '
                  '%.2e)', found.position, found.logit_margin)
  return dataclasses.asdict(found)


def _show(row, index: int, total: int) -> None:
  rate = f'{row["tokens_per_s"]:.1f}' if row['tokens_per_s'] else '-'
  logging.info('prompt %d/%d %s %s: %d new tokens, %s tokens/s', index, total, row['method'],
               row['prompt_id'], row['new_tokens'], rate)
  text = row['text'] if len(row['text']) <= _SHOWN_CHARS else row['text'][:_SHOWN_CHARS] + ' ...'
  print(f'--- [{row["method"]}] {row["prompt_id"]} ({row["category"]}), {row["new_tokens"]} '
        f'tokens, {rate} tokens/s\n{text}', flush=True)


def _summary(cfg: ExperimentConfig, rows, skipped: Mapping[str, str],
             prompt_format: prompt_format_lib.PromptFormat) -> dict[str, Any]:
  device = jax.devices()[0]
  summary = dict(
      title=f'{cfg.model}: {", ".join(cfg.methods)} (temperature {cfg.temperature}, '
            f'max_new_tokens {cfg.max_new_tokens}, batch_size {cfg.batch_size})',
      timing=TIMING_NOTE,
      prompt_format=dataclasses.asdict(prompt_format),
      command=('python -m specjax.run ' + ' '.join(sys.argv[1:])
               if sys.argv and sys.argv[0].endswith('run.py') else 'run_experiment(config)'),
      device=dict(platform=device.platform, kind=device.device_kind, count=jax.device_count()),
      versions=dict(python=platform.python_version(), jax=jax.__version__),
      config=cfg.to_dict(),
      skipped=dict(skipped))  # prompt id -> why; in no figure below
  summary.update(summary_lib.summarize(rows, cfg.methods))
  return summary
