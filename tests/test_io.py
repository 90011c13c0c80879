"""``tandem_rlvr.io``: result files are strict JSON, and new files get the process umask's mode without the umask
being changed to read it."""

from __future__ import annotations

import json
import math
import os
import threading

import pytest
import torch

from tandem_rlvr import io


def _strict_load(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is no JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_non_finite_float_is_written_as_null_at_any_depth(tmp_path):
    """eval.json's deciles with no token, a metric of no chain: null, not a bare NaN that jq, JavaScript and
    pandas' strict readers refuse; tensors and numpy scalars too. The chains' rows alike."""
    import numpy as np

    obj = {"ce": float("nan"), "deciles": [1.0, float("nan"), (float("inf"), 2)], "nested": {"x": -math.inf},
           "t": torch.tensor(float("nan")), "n": np.float32("nan"), "ok": 0.5, "count": 3}
    path = tmp_path / "eval.json"
    io.atomic_write_json(path, obj)
    got = _strict_load(path.read_text(encoding="utf-8"))
    assert got == {"ce": None, "deciles": [1.0, None, [None, 2]], "nested": {"x": None}, "t": None, "n": None,
                   "ok": 0.5, "count": 3}
    with io.AtomicJsonl(tmp_path / "chains.jsonl") as sink:
        sink.write({"junior_bpb": float("nan"), "reward": 1.0})
    assert _strict_load((tmp_path / "chains.jsonl").read_text(encoding="utf-8")) == {"junior_bpb": None, "reward": 1.0}


def test_file_mode_reads_the_umask_without_setting_it_per_call(tmp_path, monkeypatch):
    """Setting the umask to 0 to read it gave a file another thread made meanwhile mode 0666: the umask is read
    once, and every later call (another thread's writes too) leaves it alone, with the same modes."""
    mask = os.umask(0o022)
    os.umask(mask)
    want = 0o666 & ~mask
    assert io.file_mode() == want  # read (once) here at the latest
    calls = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda m: calls.append(m) or real(m))
    modes = []
    threads = [threading.Thread(target=lambda: modes.append(io.file_mode())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    io.atomic_write_json(tmp_path / "a.json", {"a": 1})
    assert calls == [] and modes == [want] * 4
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == want


def _kernel_shows_umask() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return any(line.startswith("Umask:") for line in f)
    except OSError:
        return False


@pytest.mark.skipif(not _kernel_shows_umask(), reason="no Umask line in /proc/self/status (not Linux 4.7+)")
def test_the_umask_is_read_without_changing_it_where_the_kernel_shows_it(monkeypatch):
    mask = os.umask(0o022)
    os.umask(mask)
    monkeypatch.setattr(os, "umask", lambda m: pytest.fail("the umask was set to read it"))
    assert io._read_umask() == mask
