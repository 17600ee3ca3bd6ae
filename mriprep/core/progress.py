"""The one progress bar of every long command: tqdm on a terminal, plain lines on a
terminal that reports no size, silent elsewhere (unless asked for log lines).

A terminal that reports no usable width (``docker exec -t``, ``script``, some CI
runners: tqdm then reads -1 or 0 columns, or none) draws no bar: it gets a plain line
every :data:`LINE_EVERY_S` seconds instead (done/total, rate, time left), never a
carriage return. Commands that also log to files or Slurm output (``mriprep run``) print
their own periodic lines when :attr:`ProgressBar.shown` is False; a bar never writes
carriage returns into a log.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


# A terminal with no usable width gets a plain progress line this often; a log asked for
# lines (``log_lines=True``) gets one every LOG_EVERY_S, the pace of `mriprep run`'s.
LINE_EVERY_S = 10.0
LOG_EVERY_S = 30.0


def _columns(stream: TextIO) -> int | None:
    """The columns the terminal of ``stream`` reports, as tqdm reads them (None when it
    reports none; tqdm reads a terminal of 0 columns as -1)."""
    from tqdm.std import _screen_shape_wrapper

    measure = _screen_shape_wrapper()
    try:
        return measure(stream)[0] if measure is not None else None
    except (OSError, ValueError, TypeError):
        return None


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a time left: "40 s", "12 min", "2.5 h"."""
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def rate_text(done: float, elapsed: float, unit: str) -> str:
    """Items per second, or per minute when fewer than one a second: "2.5 entry/s"."""
    per_s = done / elapsed if elapsed > 0 else 0.0
    return f"{per_s:.1f} {unit}/s" if per_s >= 1 else f"{per_s * 60:.1f} {unit}/min"


class ProgressBar:
    """Progress of one long command on ``stream`` (stderr by default), in one of three
    ways, chosen when it is made:

    * a tqdm bar (:attr:`shown`) on a terminal that reports its width;
    * a plain line every ``every_s`` seconds (:attr:`lines`): the start, done/total with
      the counts of :meth:`advance`, the rate and the time left, and a last line, on a
      terminal that reports no usable width, or on any stream with ``log_lines=True``;
    * nothing, on a stream that is not a terminal (a pipe, a file) unless
      ``log_lines``.

    ``terminal`` overrides whether ``stream`` is a terminal (``False`` keeps a command's
    JSON output free of progress). ``total`` may be given later, with the first
    :meth:`update_to` call (the check learns its number of entries only once it has read
    the index).
    """

    def __init__(self, desc: str, unit: str, total: int | None = None,
                 stream: TextIO | None = None, terminal: bool | None = None,
                 leave: bool = True, *, log_lines: bool = False,
                 every_s: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        on_terminal = self.stream.isatty() if terminal is None else terminal
        width = _columns(self.stream) if on_terminal else None
        #: A tqdm bar is drawn.
        self.shown = bool(on_terminal and width is not None and width > 0)
        #: Plain periodic lines are printed instead of a bar.
        self.lines = (on_terminal and not self.shown) or (not on_terminal and log_lines)
        #: Seconds between two plain lines.
        self.every_s = every_s if every_s is not None else (
            LINE_EVERY_S if on_terminal else LOG_EVERY_S)
        self.desc, self.unit = desc, unit
        self._options = dict(desc=desc, unit=unit, file=self.stream, leave=leave,
                             dynamic_ncols=True, smoothing=0.1)
        self._bar = None
        # Plain lines: the count, when counting began, and what the last line said.
        self.total, self.done = total, 0
        self._postfix: dict[str, Any] | None = None
        self._began: float | None = None
        self._began_done = 0
        self._last_line_at = 0.0
        self._said: tuple | None = None
        if total is not None:
            self._start(total, 0)

    def _start(self, total: int | None, done: int) -> None:
        if self.lines:
            self.total = total
            self._began, self._began_done = time.monotonic(), done
            self.done = done
            self._line()
            return
        if not self.shown:
            return
        from tqdm import tqdm

        # tqdm's monitor thread would make this process multi-threaded, and a pool of
        # worker processes started after it would have to spawn instead of fork
        # (mriprep.core.machine.process_context): seconds per worker, and a script
        # without a __main__ guard run again in each. The bars refresh on update anyway.
        tqdm.monitor_interval = 0
        self._bar = tqdm(total=total, **self._options)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Show ``done`` items of ``total`` (a ``progress(done, total)`` callback)."""
        if self.lines:
            if self._began is None:
                self._start(total, done)
                return
            if total is not None:
                self.total = total
            self.done = done
            self._maybe_line()
            return
        if not self.shown:
            return
        if self._bar is None:
            self._start(total, 0)
        self._bar.update(done - self._bar.n)

    def advance(self, postfix: dict[str, Any] | None = None) -> None:
        """One more item done, with counts shown after the bar."""
        if self.lines:
            if self._began is None:
                self._start(self.total, 0)
            if postfix is not None:
                self._postfix = dict(postfix)
            self.done += 1
            self._maybe_line()
        elif self._bar is not None:
            if postfix is not None:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def set_postfix(self, postfix: dict[str, Any]) -> None:
        """Change the counts shown after the bar without advancing it."""
        if self.lines:
            self._postfix = dict(postfix)
        elif self._bar is not None:
            self._bar.set_postfix(postfix)

    def _maybe_line(self) -> None:
        finished = self.total is not None and self.done >= self.total
        if finished or time.monotonic() - self._last_line_at >= self.every_s:
            self._line()

    def _line(self) -> None:
        now = time.monotonic()
        said = (self.done, self.total, tuple(sorted((self._postfix or {}).items())))
        if said == self._said:
            return
        self._last_line_at, self._said = now, said
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        text = f"{self.desc}: {count} {self.unit}"
        if self._postfix:
            text += " (" + ", ".join(f"{k}={v}" for k, v in self._postfix.items()) + ")"
        counted, elapsed = self.done - self._began_done, now - self._began
        if counted > 0 and elapsed > 0:
            text += f", {rate_text(counted, elapsed, self.unit)}"
            if self.total is not None and self.done < self.total:
                left = (self.total - self.done) * elapsed / counted
                text += f", about {duration(left)} left"
        print(text, file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """A line above the bar (or a plain line when no bar is shown)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar; plain lines end with the last count, unless a line said it."""
        if self._bar is not None:
            self._bar.close()
        elif self.lines and self._began is not None:
            self._line()
