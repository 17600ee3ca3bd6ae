"""The one progress bar of every long command: tqdm on a terminal, silent elsewhere.

Commands that also log to files or Slurm output (``mriprep run``) print their own
periodic lines when :attr:`ProgressBar.shown` is False; a bar never writes carriage
returns into a log.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class ProgressBar:
    """A tqdm bar on ``stream`` when it is a terminal (or ``terminal=True``).

    ``total`` may be given later, with the first :meth:`update_to` call (the check learns
    its number of entries only once it has read the index).
    """

    def __init__(self, desc: str, unit: str, total: int | None = None,
                 stream: TextIO | None = None, terminal: bool | None = None,
                 leave: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.shown = self.stream.isatty() if terminal is None else terminal
        self._options = dict(desc=desc, unit=unit, file=self.stream, leave=leave,
                             dynamic_ncols=True, smoothing=0.1)
        self._bar = None
        if self.shown and total is not None:
            self._start(total)

    def _start(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, **self._options)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Show ``done`` items of ``total`` (a ``progress(done, total)`` callback)."""
        if not self.shown:
            return
        if self._bar is None:
            self._start(total)
        self._bar.update(done - self._bar.n)

    def advance(self, postfix: dict[str, Any] | None = None) -> None:
        """One more item done, with counts shown after the bar."""
        if self._bar is not None:
            if postfix is not None:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def set_postfix(self, postfix: dict[str, Any]) -> None:
        """Change the counts shown after the bar without advancing it."""
        if self._bar is not None:
            self._bar.set_postfix(postfix)

    def write(self, line: str) -> None:
        """A line above the bar (or a plain line when no bar is shown)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
