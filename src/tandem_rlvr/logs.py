"""Console output: readable in a terminal and in a log file.

- :func:`setup_logging`: our loggers (``tandem_rlvr.*``) at INFO (DEBUG with ``-v``), every other library's at
  WARNING (matplotlib's font cache and the Hub client's per-request lines stay out), each line printed through
  the progress bars (``tqdm.write``: a bar is cleared, the line printed, the bar drawn again below it).
- :func:`quiet_libraries`: other libraries' progress bars off inside our jobs (transformers' "Loading weights",
  datasets' map/filter bars; the Hub's download bars too unless asked for).
- :func:`progress`: a tqdm bar on a terminal; where stderr is no terminal (a SLURM log, a pipe, a file) a
  :class:`PlainProgress` instead, which prints one readable line every ``every`` units and never a carriage
  return (a tqdm bar there writes every redraw into the log).
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["PlainProgress", "is_terminal", "progress", "quiet_libraries", "setup_logging"]

OURS = "tandem_rlvr"
FORMAT = "%(levelname)s %(name)s: %(message)s"


class BarSafeHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` (looked up at every line, so a redirected stream is
    followed) with ``tqdm.write``, which keeps an open progress bar below the line instead of breaking it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must not raise (logging's own convention)
            self.handleError(record)


def setup_logging(verbose: bool = False, *, ours: int = logging.INFO) -> None:
    """Root logger at WARNING, ``tandem_rlvr`` at ``ours`` (DEBUG when ``verbose``), one :class:`BarSafeHandler`
    on the root logger unless it has handlers already (as :func:`logging.basicConfig`: an application's own
    logging setup is kept)."""
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    if not root.handlers:
        handler = BarSafeHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    logging.getLogger(OURS).setLevel(logging.DEBUG if verbose else ours)


def quiet_libraries(*, downloads: bool | None = None) -> None:
    """Other libraries' progress bars off in this process: transformers' (loading weights), datasets' (map,
    filter) and, unless ``downloads`` (default: only on a terminal), the Hub's download bars."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    hub_on = not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # (which turns the Hub's off too)
    if hub_on and (is_terminal() if downloads is None else downloads):
        enable_progress_bars()
    try:
        import datasets
    except ImportError:
        pass
    else:
        datasets.disable_progress_bars()
        datasets.logging.disable_propagation()  # its own handler prints its lines; through ours too, they came twice


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: the current ``sys.stderr``) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def progress(total: int, desc: str, *, unit: str = "it", initial: int = 0, enabled: bool = True,
             every: int = 1, leave: bool = True):
    """A progress display of ``total`` units: a tqdm bar on a terminal, else a :class:`PlainProgress` that prints
    a line every ``every`` units (and at the last); a disabled tqdm bar when not ``enabled``."""
    from tqdm.auto import tqdm

    if enabled and not is_terminal():
        return PlainProgress(total, desc, unit=unit, initial=initial, every=every)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True,
                leave=leave)


class PlainProgress:
    """A progress display for a log file: ``update`` prints one line whenever the count reaches the next
    multiple of ``every`` or the total, ``desc: step 20/200 (10%) reward=0.41 senior=0.52 | 3.1 s/step, eta
    9m18s`` (the postfix is the last :meth:`set_postfix`'s). The same calls as a tqdm bar."""

    def __init__(self, total: int, desc: str, *, unit: str = "it", initial: int = 0, every: int = 1):
        self.total, self.desc, self.unit, self.every = int(total), desc, unit, max(1, int(every))
        self.n = self._start = int(initial)
        self._t0 = time.monotonic()
        self._next = (self.n // self.every + 1) * self.every
        self.postfix: dict = {}

    def set_postfix(self, refresh: bool = True, **kw) -> None:
        self.postfix = kw

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n >= self._next or (self.total and self.n >= self.total > self.n - k):
            self._next = (self.n // self.every + 1) * self.every
            print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        done = self.n - self._start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        post = "".join(f" {k}={v}" for k, v in self.postfix.items())
        rate = ""
        if done > 0:
            per = (time.monotonic() - self._t0) / done
            rate = f" | {per:.3g} s/{self.unit}"
            if self.total and self.total > self.n:
                rate += f", eta {_duration(per * (self.total - self.n))}"
        return f"{self.desc}: {self.unit} {self.n}/{self.total or '?'}{pct}{post}{rate}"

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
