"""One progress bar for every long run (benchmarks, traces, generation, training), drawn on stderr.

The bar lives on stderr so that what a command prints on stdout (text, a markdown table, JSON) stays byte for byte
what it would be without it. It is on by default only where stderr is a terminal; `enabled=True` forces it (a
non-terminal console then gets no animation, rich's own rule), `enabled=False` turns it off. Disabled, the bar
is a no-op object with the same methods, so callers never branch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Bar", "progress_bar", "LONG_RUN_TOKENS"]

LONG_RUN_TOKENS = 64  # CLI runs asking for more new tokens than this get a bar by default (when stderr is a tty)


class Bar:
    """The handle `progress_bar` yields: `advance()` after each unit of work, `update()` to set counts or the
    status text shown after the bar. `completed` counts what was reported, drawn or not."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None, *, manual: bool = False) -> None:
        self._progress, self._task, self._manual = progress, task, manual
        self.completed = 0.0

    @property
    def enabled(self) -> bool:
        return self._progress is not None

    def advance(self, n: float = 1, *, status: str | None = None) -> None:
        self.completed += n
        self._draw(advance=n, status=status)

    def update(self, *, completed: float | None = None, total: float | None = None, status: str | None = None) -> None:
        if completed is not None:
            self.completed = completed
        self._draw(completed=completed, total=total, status=status)

    def _draw(self, *, status: str | None, **counts: float | None) -> None:
        if self._progress is None or self._task is None:
            return
        fields: dict[str, Any] = {k: v for k, v in counts.items() if v is not None}
        if status is not None:
            fields["status"] = status
        # without the refresh thread (benchmarks) the bar is drawn here, i.e. only where the caller reports
        self._progress.update(self._task, refresh=self._manual, **fields)


@contextmanager
def progress_bar(
    total: float | None,
    description: str,
    enabled: bool | None = None,
    *,
    console: Console | None = None,
    transient: bool = True,
    auto_refresh: bool = True,
) -> Iterator[Bar]:
    """A rich progress bar over `total` units (None: unknown, the bar pulses) as a context manager.

    enabled: None = on when `console` (default: a new stderr Console) is a terminal; True/False force it.
    auto_refresh=False draws only on `advance()`/`update()`: no refresh thread runs, so a benchmark's timed
    regions share the interpreter with nothing of ours. transient=True erases the bar when done.
    Writes to stdout go straight through, except when stdout and the bar are on the same terminal: there rich
    prints them above the bar (on the bar's console) so that the two do not garble each other.
    """
    console = console if console is not None else Console(stderr=True)
    if enabled is None:
        enabled = console.is_terminal
    if not enabled:
        yield Bar()
        return
    ours = console.is_terminal and console.file is sys.stderr  # a console of the caller's (tests): no redirects
    isatty = getattr(sys.stdout, "isatty", None)
    same_terminal = ours and bool(isatty and isatty())
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=transient,
        auto_refresh=auto_refresh,
        redirect_stdout=same_terminal,
        redirect_stderr=ours,
    )
    with progress:
        task = progress.add_task(description, total=total, status="")
        yield Bar(progress, task, manual=not auto_refresh)
