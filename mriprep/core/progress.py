"""The one progress bar of every long command: tqdm on a terminal, silent elsewhere.

Commands that also log to files or Slurm output (``mriprep run``) print their own
periodic lines when :attr:`ProgressBar.shown` is False; a bar never writes carriage
returns into a log.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


# The width of the bar on a terminal that reports no width (0 columns).
FALLBACK_COLUMNS = 80


def _columns(stream: TextIO) -> int | None:
    """The columns the terminal of ``stream`` reports, as tqdm reads them (0 or None when
    it reports none)."""
    from tqdm.std import _screen_shape_wrapper

    measure = _screen_shape_wrapper()
    try:
        return measure(stream)[0] if measure is not None else None
    except (OSError, ValueError, TypeError):
        return None


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

        # tqdm's monitor thread would make this process multi-threaded, and a pool of
        # worker processes started after it would have to spawn instead of fork
        # (mriprep.core.machine.process_context): seconds per worker, and a script
        # without a __main__ guard run again in each. The bars refresh on update anyway.
        tqdm.monitor_interval = 0

        options = dict(self._options)
        if _columns(self.stream) == 0:
            # Some CI and editor terminals report 0 columns, and tqdm then draws no bar
            # at all: a fixed width instead. (A stream with no width to ask, None, keeps
            # tqdm's own unlimited line.)
            options.update(ncols=FALLBACK_COLUMNS, dynamic_ncols=False)
        self._bar = tqdm(total=total, **options)

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
