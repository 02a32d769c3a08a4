"""Errors shared by the dataset loaders."""

from __future__ import annotations

__all__ = ["DatasetDownloadError", "DatasetNotFoundError"]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not on disk; the message says how to get them.

    Loaders never download implicitly (runs must work offline and be reproducible),
    so this error is the user's cue to fetch the data explicitly.
    """


class DatasetDownloadError(RuntimeError):
    """An explicit download failed (network error or checksum mismatch)."""
