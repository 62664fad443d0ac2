r"""An EAGLE-3-style drafter for the embedded Gemma 3 270M, trained on its own text.

  python -m specjax.train --config=configs/train_eagle.py
  python -m specjax.train --config=configs/train_eagle.py:tiny   # seconds; what CI runs
  python -m specjax.train --config=configs/train_eagle.py:instructions   # the second run,
      # continuing the drafter the first command wrote
  python -m specjax.train --config=configs/train_eagle.py:requests   # the third, continuing
      # the second's: together, the shipped drafter

One decoder layer over the target's residual stream at layers 2, 9 and 15
(EAGLE-3's low, middle and high), fused, and the next token's embedding;
scored through the target's tied head on the shipped 16k draft vocabulary,
with EAGLE-3's training-time test over `eagle.steps` drafts
(specjax/training/eagle_objective.py). The data is self-distilled: the
target's own text, half of it from BOS alone and half continuing the
hand-written calibration prompts, each row with 8 tokens sampled from the
nucleus (top-p 0.9) before the continuation, so no two rows are alike:
256 shards of 32 rows of 128 tokens, 1M tokens, the last 4 shards held out;
only tokens the target wrote are scored. No Spec-Bench prompt. 2000 steps of 8
rows, two passes over the data (the 262k-token recipe before it, 4 passes in
1000 steps, fitted its training text far better than held-out text). On 2 CPU
cores the data takes about 2 hours and the steps about 1.5; on a lent GPU,
benchmarks/gpu_train.sh. Rerun the command to resume a killed run: shards,
the target's features (output_dir/teacher) and Orbax checkpoints are kept.
"""

import ml_collections

VARIANTS = {
    # A random tiny target: checks the whole recipe end to end in seconds.
    'tiny': dict(target='tiny-random', draft_vocab='', batch_size=4, steps=12, warmup_steps=2,
                 checkpoint_every=4, eval_every=6, log_every=2,
                 eagle=dict(steps=3, mlp_width=32, hidden_layers=()),
                 data=dict(num_shards=3, sequences_per_shard=8, seq_len=24, start_tokens=4,
                           sampled_fraction=0.34, seed=0, bos_id=2, eos_ids=(1,),
                           prompts='', prompted_fraction=0.0, start_top_p=1.0),
                 heldout_shards=1, data_dir='', output_dir='results/train_eagle-tiny'),
    # The shipped drafter's second run: the default recipe's drafter
    # (results/train_eagle/drafter after `python -m specjax.train --config=configs/train_eagle.py`)
    # trained further on the target's text after hand-written requests and questions
    # (specjax/prompts/instructions.jsonl, 128 of the kinds Spec-Bench measures, none from
    # it) for 3 rows in 4, BOS alone for the rest; 256 tokens a row, so a passage and its
    # summary or answer fit. 128 shards of 32 rows, 1M tokens, 4 held out; 1000 steps of 8
    # rows are two passes, at half the first recipe's learning rate. The first run's drafter
    # accepted 1.82 tokens per call on raw-text Spec-Bench (a chain of 4 as served) against
    # 2.58 on its own held-out text; after this run, 1.96. On a 2-core Zen 4 the data took
    # about 80 min (written with the target's int8 forms), the teacher's features about 30
    # and the steps 116 (experiments/2026-12-eagle-instructions-gemma270m-cpu).
    'instructions': dict(
        data=dict(num_shards=128, sequences_per_shard=32, seq_len=256, start_tokens=8,
                  sampled_fraction=0.25, seed=0, bos_id=2, eos_ids=(1, 106),
                  prompts='instructions', prompted_fraction=0.75, start_top_p=0.9),
        data_dir='results/distill-gemma3-270m-instructions-1m', steps=1000,
        init_from='results/train_eagle/drafter', learning_rate=5e-4, final_learning_rate=5e-5,
        output_dir='results/train_eagle-instructions'),
    # The third run: the second run's drafter trained further on the target's text after 128
    # other hand-written requests (specjax/prompts/requests.jsonl, other topics than the
    # instructions, none from Spec-Bench), 3 rows in 4, BOS alone for the rest (seed 1: not
    # the second run's BOS rows); 64 shards of 32 rows of 256 tokens, 512k tokens, 4 held
    # out; 500 steps of 8 rows, two passes, at the second run's learning rate. Raw-text
    # Spec-Bench's chain of 4 as served: 1.96 after the second run, 2.00 after this one, the
    # shipped drafter. On a 2-core Zen 4 the data took 52 min, the features 14 and the steps 57
    # (experiments/2026-12-eagle-requests-gemma270m-cpu).
    'requests': dict(
        data=dict(num_shards=64, sequences_per_shard=32, seq_len=256, start_tokens=8,
                  sampled_fraction=0.25, seed=1, bos_id=2, eos_ids=(1, 106),
                  prompts='requests', prompted_fraction=0.75, start_top_p=0.9),
        data_dir='results/distill-gemma3-270m-requests-512k', steps=500,
        init_from='results/train_eagle-instructions/drafter', learning_rate=5e-4,
        final_learning_rate=5e-5, output_dir='results/train_eagle-requests'),
}


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.target = 'embedded:gemma3-270m'   # the frozen target it drafts for
  c.drafter = 'eagle'
  # steps: drafts ahead the training-time test scores (the chain length it learns);
  # hidden_layers: () = EAGLE-3's low / middle / high layers of the target;
  # soft_labels: J > 0 scores each step on the target's J likeliest next tokens
  # (distillation), 0 on the one token the sequence holds.
  c.eagle = dict(steps=4, mlp_width=1024, hidden_layers=(), soft_labels=0)
  c.draft_vocab = 'embedded'          # the ranked file shipped for the embedded 270M
  c.draft_vocab_size = 16384          # its first N (most frequent) tokens
  # Half the rows start from a calibration prompt (specjax/prompts/calibration.jsonl: code,
  # news, dialogue, questions, maths, translation; none from Spec-Bench), half from BOS.
  c.data = dict(num_shards=256, sequences_per_shard=32, seq_len=128, start_tokens=8,
                sampled_fraction=0.25, seed=0, bos_id=2, eos_ids=(1, 106),
                prompts='calibration', prompted_fraction=0.5, start_top_p=0.9)
  c.data_dir = 'results/distill-gemma3-270m-prompted-1m'
  c.heldout_shards = 4
  c.batch_size = 8
  c.steps = 2000
  c.learning_rate = 1e-3              # AdamW, linear warm-up then cosine decay
  c.warmup_steps = 50
  c.final_learning_rate = 1e-4
  c.weight_decay = 0.0
  c.clip_norm = 1.0
  c.checkpoint_every = 100            # Orbax checkpoints of the layer and optimizer state
  c.keep = 3
  c.eval_every = 200                  # held-out mean accepted tokens, and curve.png
  c.log_every = 25
  c.seed = 0
  c.export_dtype = 'bfloat16'         # the shipped weights: 11.7 MB instead of 23 MB
  # '' starts from random weights; a drafter directory (or 'embedded') continues its training.
  c.init_from = ''
  c.output_dir = 'results/train_eagle'
  if arg:
    if arg not in VARIANTS:
      raise ValueError(f'unknown config variant {arg!r}; known: {", ".join(VARIANTS)}')
    c.update(VARIANTS[arg])
  return c
