r"""A distilled draft model for the embedded Gemma 3 270M (DistillSpec), trained on its own text.

  python -m specjax.train --config=configs/train_distilled.py
  python -m specjax.train --config=configs/train_distilled.py:tiny   # seconds; what CI runs

The student is the target's own architecture cut to its first `distilled.layers`
blocks, started from the target's weights and sharing its frozen tied embedding,
trained so that its next-token distribution matches the target's over the 16k
draft vocabulary (`distilled.loss`: 'tv', total variation, which is one minus
the acceptance rate; or 'kl', forward KL): specjax/training/distilled_objective.py.
The data is the self-distilled set configs/train_medusa.py makes too (the
same recipe and directory): the target's own text from BOS, no Spec-Bench
prompt (configs/train_eagle.py adds rows that continue calibration prompts).
Serve it with the draft_model drafter:

  python -m specjax.run --config=configs/gemma.py:drafters=draft_model \
      --config.draft_model.checkpoint=results/train_distilled/drafter

Rerun the training command to resume a killed run.
"""

import ml_collections

VARIANTS = {
    # A random tiny target: checks the whole recipe end to end in seconds.
    'tiny': dict(target='tiny-random', draft_vocab='', batch_size=4, steps=12, warmup_steps=2,
                 checkpoint_every=4, eval_every=6, log_every=2,
                 distilled=dict(layers=1, loss='tv'),
                 data=dict(num_shards=3, sequences_per_shard=8, seq_len=24, start_tokens=4,
                           sampled_fraction=0.34, seed=0, bos_id=2, eos_ids=(1,),
                           prompts='', prompted_fraction=0.0),
                 data_dir='', output_dir='results/train_distilled-tiny'),
}


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.target = 'embedded:gemma3-270m'   # the frozen target it drafts for
  c.drafter = 'distilled'
  # layers: the target's first blocks the student starts from (1: 11 MB in bfloat16);
  # loss: 'tv' (total variation = 1 - acceptance rate) or 'kl' (forward KL).
  c.distilled = dict(layers=1, loss='tv')
  c.draft_vocab = 'embedded'          # the ranked file shipped for the embedded 270M
  c.draft_vocab_size = 16384          # its first N (most frequent) tokens
  c.data = dict(num_shards=34, sequences_per_shard=32, seq_len=128, start_tokens=8,
                sampled_fraction=0.25, seed=0, bos_id=2, eos_ids=(1, 106),
                prompts='', prompted_fraction=0.0)   # '' = BOS only (see train_eagle.py)
  c.data_dir = 'results/distill-gemma3-270m'   # shared with train_medusa.py
  c.heldout_shards = 2
  c.batch_size = 8
  c.steps = 800
  c.learning_rate = 3e-4              # AdamW from the target's own blocks: a gentle start
  c.warmup_steps = 50
  c.final_learning_rate = 3e-5
  c.weight_decay = 0.0
  c.clip_norm = 1.0
  c.checkpoint_every = 100            # Orbax checkpoints of the student and optimizer state
  c.keep = 3
  c.eval_every = 200                  # held-out mean accepted tokens, and curve.png
  c.log_every = 25
  c.seed = 0
  c.export_dtype = 'bfloat16'
  # '' starts from random weights; a drafter directory (or 'embedded') continues its training.
  c.init_from = ''
  c.output_dir = 'results/train_distilled'
  if arg:
    if arg not in VARIANTS:
      raise ValueError(f'unknown config variant {arg!r}; known: {", ".join(VARIANTS)}')
    c.update(VARIANTS[arg])
  return c
