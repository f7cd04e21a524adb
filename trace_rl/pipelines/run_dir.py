"""Run directories: checked before anything is written, locked while a run writes to them.

- A new run refuses a directory that already holds files (it would append to another run's metrics and
  replace its checkpoint) unless told `overwrite` (which only ever deletes a trace-rl run directory) or
  `resume`.
- A lock (`.lock`, an advisory `flock` held for the life of the process, released by the OS even when the
  process is killed) stops a second process from writing into a directory a run is using.
- `check_run_dir` is the cheap part (path usable, mode allowed), run before the model is built;
  `RunDirectory.acquire` creates, locks and re-checks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trace_rl.config import ConfigError

LOCK_FILE = ".lock"
# files that mark a trace-rl run directory (only such a directory is ever emptied by --overwrite)
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint", "checkpoint.tmp", "checkpoint.old")


class RunDirError(ConfigError):
    """The run directory cannot be used as asked: exit code 2, nothing written."""


def _contents(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE) if path.is_dir() else []


def check_run_dir(path: Path, mode: str = "new") -> None:
    """Refuse, before anything is written, a run directory that cannot be used in `mode`
    ('new', 'overwrite' or 'resume')."""
    path = Path(path)
    if mode not in ("new", "overwrite", "resume"):
        raise ValueError(f"mode must be 'new', 'overwrite' or 'resume', got {mode!r}")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run directory {path}: exists and is not a folder; choose another --out")
    if mode == "resume":
        if not path.is_dir():
            raise RunDirError(f"--resume {path}: no such run directory")
        return
    if path.is_dir():
        contents = _contents(path)
        if contents and mode == "new":
            raise RunDirError(f"run directory {path} already holds {', '.join(contents[:4])}"
                              f"{', ...' if len(contents) > 4 else ''}; continue it with --resume {path}, replace it "
                              f"with --overwrite, or choose another --out")
        if contents and mode == "overwrite" and not any(name in RUN_MARKERS for name in contents):
            raise RunDirError(f"--overwrite {path}: not a trace-rl run directory (no config.yaml, metrics.jsonl or "
                              f"checkpoint/ there), so nothing is deleted; choose another --out")
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunDirError(f"run directory {path}: not writable; choose another --out")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"run directory {path}: {parent} is a file, not a folder; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"run directory {path}: cannot be created ({parent} is not writable); choose another "
                          f"--out or logging.dir")


class RunDirectory:
    """A run directory held by this process: created, locked and checked (`acquire`), released (`release`)."""

    def __init__(self, path: Path, mode: str = "new"):
        self.path, self.mode = Path(path), mode
        self._fd: int | None = None

    def acquire(self) -> RunDirectory:
        check_run_dir(self.path, self.mode)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        # re-check under the lock: another run may have written here between the check and the lock
        contents = _contents(self.path)
        if self.mode == "new" and contents:
            self.release()
            check_run_dir(self.path, "new")       # raises, naming what is there
        if self.mode == "overwrite":
            for name in contents:
                target = self.path / name
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        return self

    def _lock(self) -> None:
        lock = self.path / LOCK_FILE
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl
        except ImportError:          # no flock (Windows): the lock file's presence is the lock
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunDirError(f"run directory {self.path}: another trace-rl process (pid {holder}) is writing "
                                  f"to it; wait for it to finish or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)       # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunDirectory:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` whole (tmp file, fsync, rename): a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
