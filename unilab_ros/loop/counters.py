"""Event counters: one form for every node and loop (status JSON, diagnostics, CSV)."""

from __future__ import annotations

from collections.abc import Iterable


class Counters(dict[str, int]):
    """Counts of named events, each starting at 0; a plain dict to report (JSON-ready).

    The names are fixed when it is made, so a misspelt name fails at once (KeyError)
    instead of starting a counter nobody reports.
    """

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__(dict.fromkeys(names, 0))

    def add(self, name: str, count: int = 1) -> int:
        """Add ``count`` to ``name``; returns its new value."""
        self[name] += count
        return self[name]

    @classmethod
    def summed(cls, parts: Iterable[dict[str, int]]) -> Counters:
        """The counts of several counters added name by name (the first one's names)."""
        parts = list(parts)
        total = cls(parts[0] if parts else ())
        for part in parts:
            for name, value in part.items():
                total[name] += value
        return total
