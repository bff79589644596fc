"""Errors meant for people: one line naming the file, offset or key, never a traceback.

Every error graphcost raises for bad input derives from :class:`GraphcostError`; the CLI
prints ``str(err)`` on one line and exits with code 2.
"""
from __future__ import annotations


class GraphcostError(Exception):
    """Bad input or impossible settings; ``str()`` is the whole one-line message."""


class GGUFError(GraphcostError):
    """A GGUF file that cannot be read: truncated, corrupted, hostile or unsupported."""

    def __init__(self, path: object, offset: int | None, what: str):
        self.path = str(path)
        self.offset = offset
        self.what = what
        where = f"{self.path}" if offset is None else f"{self.path}: offset {offset}"
        super().__init__(f"{where}: {what}")


class UnsupportedError(GraphcostError):
    """A model or setting graphcost does not model (unknown architecture, op, type)."""


class SettingsError(GraphcostError):
    """Run settings that llama.cpp would reject, or that contradict each other."""
