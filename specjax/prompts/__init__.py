"""Package data: `builtin.jsonl`, the prompt set used when no file is given."""
