"""docs/results.md, the one page of measured results: each bench writes its own section.

A bench run with ``--results-page`` prints as it always does and then replaces its section
of the page (keyed by the bench's name) with what it printed, headed by the date, the
commit (``git rev-parse --short HEAD``, marked when the tree had uncommitted changes), the
CPU model and the command line that made it. The page's other sections, and the prose
above each section's block, are left as they are. Without the flag nothing is written, so
a partial or exploratory run never replaces a full one.

A section's block lies between two HTML comments, ``<!-- results:KEY -->`` and
``<!-- /results:KEY -->``; a bench whose key the page does not hold yet gets a new
``## KEY`` section at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
FLAG_HELP = "replace this bench's section of docs/results.md with what this run prints"


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    """The checked-out commit, with a note when tracked files differ from it."""

    def git(*arguments: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if changed else head


def command_line(argv: list[str]) -> str:
    """``argv`` as a command to paste, the script's path relative to the repository."""
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(argv[0])
    return shlex.join(["python", str(shown), *argv[1:]])


def block(key: str, text: str, *, date: str, revision: str, cpu: str, command: str) -> str:
    """A section's block: the markers, where the figures come from, and ``text``."""
    return (f"<!-- results:{key} -->\n"
            f"Measured {date} at commit `{revision}` on {cpu} by `{command}`:\n\n"
            f"```text\n{text.rstrip()}\n```\n"
            f"<!-- /results:{key} -->")


def replace_section(page: str, key: str, new_block: str) -> str:
    """``page`` with ``key``'s block replaced by ``new_block`` (appended as a new section
    when the page has none); everything else stays as it was."""
    begin, end = f"<!-- results:{key} -->", f"<!-- /results:{key} -->"
    start = page.find(begin)
    stop = page.find(end, start)
    if start < 0 or stop < 0:
        return f"{page.rstrip()}\n\n## {key}\n\n{new_block}\n"
    return page[:start] + new_block + page[stop + len(end):]


def write_section(key: str, text: str, argv: list[str], page: Path = PAGE) -> Path:
    """Replace ``key``'s section of ``page`` with ``text`` and its provenance."""
    new_block = block(key, text, date=datetime.date.today().isoformat(), revision=commit(),
                      cpu=f"{cpu_model()} ({os.cpu_count()} CPUs, {platform.machine()})",
                      command=command_line(argv))
    current = page.read_text() if page.is_file() else "# Measured results\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    temporary = page.with_name(f".{page.name}.{os.getpid()}")
    temporary.write_text(replace_section(current, key, new_block))
    temporary.replace(page)
    return page


class _Tee(io.TextIOBase):
    """Writes through to ``stream`` and keeps a copy."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.copy.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@dataclass
class Recording:
    """What a ``recording`` block printed; ``keep = False`` leaves the page alone (a bench
    that failed half-way)."""

    keep: bool = True
    text: str = field(default="")


@contextlib.contextmanager
def recording(key: str, enabled: bool, argv: list[str] | None = None,
              page: Path = PAGE) -> Iterator[Recording]:
    """Print through as usual; at the end (no exception, ``keep`` still set) write what was
    printed as ``key``'s section of ``page`` when ``enabled``."""
    result = Recording()
    if not enabled:
        yield result
        return
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield result
    result.text = tee.copy.getvalue()
    if result.keep:
        path = write_section(key, result.text, argv if argv is not None else sys.argv, page)
        print(f"results page: section '{key}' of {path}")
