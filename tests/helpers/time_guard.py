"""An autouse fixture for modules whose cases must fail, not hang: import ``no_hang`` into the module."""

from __future__ import annotations

import signal

import pytest

TEST_SECONDS = 60


@pytest.fixture(autouse=True)
def no_hang():
    """Fail (instead of hanging the suite) if one case runs for over a minute."""

    def boom(*_):
        raise TimeoutError(f"test ran over {TEST_SECONDS} s: a hang?")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(TEST_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
