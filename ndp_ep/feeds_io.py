"""Reading input feeds from ``.npz`` files and writing outputs atomically."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ndp_ep.errors import FeedError


def load_feeds(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise FeedError(f"no such feeds file: {path}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise FeedError(f"{path} is not an .npz archive of named arrays")
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise FeedError(f"{path} is not a readable .npz archive ({type(exc).__name__})") from None
    except AttributeError:
        raise FeedError(f"{path} is not an .npz archive of named arrays") from None


def save_arrays(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """``np.savez`` to ``path`` via a temporary file in the same directory, then rename."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FeedError(f"output directory does not exist: {path.parent}")
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path
