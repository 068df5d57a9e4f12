"""Writing a file so that a reader never sees half of it."""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable

__all__ = ["replace_atomically"]


def replace_atomically(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """``write`` a temporary file beside ``path``, then rename it to ``path``: a reader never
    sees half a file, and a failed write leaves what was at ``path`` before."""
    path = os.fspath(path)
    # named here rather than by mkstemp, so that the file gets the umask's mode like any
    # other the user writes, not mkstemp's 0600
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
