"""How every command words a file it cannot read: one wording for a missing file, whichever
layer found it (the policy loader, the certificate tools, the manifest readers)."""

from __future__ import annotations

from pathlib import Path


def missing_file(path: str | Path) -> str:
    return f"{path}: no such file or directory"


def unreadable_file(path: str | Path, exc: OSError) -> str:
    """The message for an ``OSError`` raised reading ``path``."""
    if isinstance(exc, FileNotFoundError):
        return missing_file(path)
    if isinstance(exc, IsADirectoryError):
        return f"{path}: is a directory, expected a file"
    return f"{path}: cannot read: {(exc.strerror or str(exc)).lower()}"
