"""specjax's own checkpoints: params saved with Orbax, the GemmaConfig as its metadata.

The config travels in the checkpoint's custom metadata, so a directory alone
says which model it is; restoring reads the config first and checks the
restored tree against it. Params come back as float32 numpy arrays on the
host whatever dtype they were saved in: callers place them on devices with
their own shardings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from specjax.checkpoints import param_tree
from specjax.checkpoints.config_io import config_from_dict, config_to_dict
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

METADATA_KEY = 'specjax'
FORMAT_VERSION = 1
# The file Orbax writes into every checkpoint directory it finishes.
ORBAX_MARKER = '_CHECKPOINT_METADATA'


def is_orbax_checkpoint(directory: str | os.PathLike) -> bool:
  return (Path(directory) / ORBAX_MARKER).is_file()


def _host_array(x: Any) -> Any:
  return x if isinstance(x, jax.Array) else np.asarray(x)


def save_orbax(directory: str | os.PathLike, config: GemmaConfig, params: dict[str, Any],
               overwrite: bool = False) -> Path:
  """Writes `params` and `config` to `directory` (which must not exist unless `overwrite`)."""
  directory = Path(directory).expanduser().resolve()
  param_tree.check_params(params, config, directory)
  metadata = {METADATA_KEY: {'format_version': FORMAT_VERSION, 'config': config_to_dict(config)}}
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      checkpointer.save(directory, jax.tree.map(_host_array, params), force=overwrite,
                        custom_metadata=metadata)
  except Exception as e:  # Orbax raises ValueError for an existing dir, OSError, ...
    raise CheckpointError(f'{directory}: cannot save Orbax checkpoint: {e}') from e
  return directory


def load_orbax(directory: str | os.PathLike) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, float32 numpy params) of a checkpoint `save_orbax` wrote."""
  directory = Path(directory).expanduser().resolve()
  if not directory.is_dir():
    raise CheckpointError(f'{directory}: no such checkpoint directory')
  if not is_orbax_checkpoint(directory):
    raise CheckpointError(f'{directory}: not a finished Orbax checkpoint (no {ORBAX_MARKER})')
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      metadata = checkpointer.metadata(directory)
      saved = (metadata.custom_metadata or {}).get(METADATA_KEY)
      if not saved or 'config' not in saved:
        raise CheckpointError(f'{directory}: Orbax checkpoint has no specjax config metadata')
      config = config_from_dict(saved['config'], directory)
      restore_args = jax.tree.map(
          lambda _: ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.float32),
          metadata.item_metadata.tree)
      params = checkpointer.restore(directory,
                                    args=ocp.args.PyTreeRestore(restore_args=restore_args))
  except CheckpointError:
    raise
  except Exception as e:  # tensorstore and Orbax raise many types on damaged files
    raise CheckpointError(f'{directory}: corrupt Orbax checkpoint: {type(e).__name__}: {e}') from e
  param_tree.check_params(params, config, directory)
  return config, params
