"""One run per output directory: an exclusive `fcntl.flock` on `<output_dir>/.lock`.

Two runs appending to one `results.jsonl` both compute every missing row and
write it twice. The lock is taken before any row is read and held until the
run ends; a second run is refused at once, naming the holder. flock belongs to
the open file, so the kernel drops it however the holder ends (Ctrl-C, kill -9,
a crash): a stale lock file never blocks a rerun. flock is advisory and, on
some network file systems, local to one machine.
"""

from __future__ import annotations

import fcntl
import os
import socket

LOCK = '.lock'


class DirectoryLock:
  """Held from construction until `release` (or the end of a `with` block)."""

  def __init__(self, directory: str, error: type[Exception] = RuntimeError):
    self.path = os.path.join(directory, LOCK)
    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(self._fd, 200, 0).decode(errors='replace').strip() or 'another process'
      os.close(self._fd)
      raise error(f'config.output_dir {directory!r} is in use by another run ({holder}); wait '
                  'for it to end, or choose another output_dir') from None
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, f'pid {os.getpid()} on {socket.gethostname()}\n'.encode(), 0)

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor drops the flock
      self._fd = None

  def __enter__(self) -> DirectoryLock:
    return self

  def __exit__(self, *exc) -> None:
    self.release()
