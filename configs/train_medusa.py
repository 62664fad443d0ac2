r"""Medusa heads for the embedded Gemma 3 270M, trained on its own text.

  python -m specjax.train --config=configs/train_medusa.py
  python -m specjax.train --config=configs/train_medusa.py:tiny   # seconds; what CI runs

The data is self-distilled (specjax/training/distill_data.py): sequences the
target writes from BOS, starts sampled, continuations greedy (a quarter of the
shards sampled). No Spec-Bench prompt is used. The last `heldout_shards`
shards are held out for the mean-accepted-tokens figure. Rerun the command to
resume a killed run.
"""

import ml_collections

VARIANTS = {
    # A random tiny target: checks the whole recipe end to end in seconds.
    'tiny': dict(target='tiny-random', draft_vocab='', batch_size=4, steps=12, warmup_steps=2,
                 checkpoint_every=4, eval_every=6, log_every=2,
                 data=dict(num_shards=3, sequences_per_shard=8, seq_len=24, start_tokens=4,
                           sampled_fraction=0.34, seed=0, bos_id=2, eos_ids=(1,),
                           prompts='', prompted_fraction=0.0),
                 data_dir='', output_dir='results/train_medusa-tiny'),
}


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.target = 'embedded:gemma3-270m'   # the frozen target the heads draft for
  c.drafter = 'medusa'
  c.num_heads = 4                     # head k guesses the token k + 2 places ahead
  # The heads score a reduced draft vocabulary: 'embedded' = the ranked file shipped for the
  # embedded 270M (specjax/drafters/data), '' = the full 262,144 tokens, else a .npz path.
  c.draft_vocab = 'embedded'
  c.draft_vocab_size = 16384          # its first N (most frequent) tokens
  # Self-distillation data: num_shards x sequences_per_shard sequences of seq_len tokens.
  c.data = dict(num_shards=34, sequences_per_shard=32, seq_len=128, start_tokens=8,
                sampled_fraction=0.25, seed=0, bos_id=2, eos_ids=(1, 106),
                prompts='', prompted_fraction=0.0)   # '' = BOS only (see train_eagle.py)
  c.data_dir = 'results/distill-gemma3-270m'   # shared with configs/train_distilled.py
  c.heldout_shards = 2
  c.batch_size = 8
  c.steps = 1200
  c.learning_rate = 1e-3              # AdamW, linear warm-up then cosine decay
  c.warmup_steps = 50
  c.final_learning_rate = 1e-4
  c.weight_decay = 0.0
  c.clip_norm = 1.0
  c.checkpoint_every = 100            # Orbax checkpoints of heads and optimizer state
  c.keep = 3
  c.eval_every = 200                  # held-out mean accepted tokens, and curve.png
  c.log_every = 20
  c.seed = 0
  # '' starts from random weights; a drafter directory (or 'embedded') continues its training.
  c.init_from = ''
  c.output_dir = 'results/train_medusa'
  if arg:
    if arg not in VARIANTS:
      raise ValueError(f'unknown config variant {arg!r}; known: {", ".join(VARIANTS)}')
    c.update(VARIANTS[arg])
  return c
