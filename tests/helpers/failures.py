"""What to show when a child process fails: its fatal-error stacks, not only the tail of its stderr."""

from __future__ import annotations


def fatal_section(stderr: str, tail: int = 3000) -> str:
    """The faulthandler dump(s) of a crashed child (``Fatal Python error`` up to its extension-module
    list, which alone fills a plain tail), then the last ``tail`` characters of ``stderr``."""
    parts, start = [], stderr.find("Fatal Python error")
    while start != -1:
        end = stderr.find("Extension modules:", start)
        parts.append(stderr[start:end if end != -1 else start + 8000])
        start = stderr.find("Fatal Python error", start + 1)
    return "\n".join(parts + ["---- stderr tail ----", stderr[-tail:]])
