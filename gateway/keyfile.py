"""Secret keys kept in files: made once (0600) and shared by every worker and restart."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create(path: Path) -> bytes:
    """The 32-byte key in `path`, made on first use.

    Written whole to a private file and linked into place, so a worker starting at the same
    moment reads either no file or the whole key, never an empty one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another worker won; use its key
        finally:
            tmp.unlink()
    return bytes.fromhex(path.read_text().strip())
