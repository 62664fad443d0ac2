"""The one error every checkpoint loader raises.

Callers (the run entry point, notebooks) catch a single type and show its
message, which always names the offending file and what is wrong with it;
the underlying library error stays attached as `__cause__`.
"""


class CheckpointError(Exception):
  """A checkpoint is missing, malformed, or does not fit a Gemma model."""
