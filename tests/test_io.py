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
from tandem_rlvr.errors import TandemError


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


def test_read_jsonl_drops_only_a_torn_last_line(tmp_path):
    """A kill mid-append tears the last line only (with or without its newline): it alone is dropped. A line
    that is not a JSON object with rows after it is damage, not a kill: one line naming the file and the line,
    never the rows before it as if the file ended there. A row holding a Unicode line separator is one row."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n{"step": 4}\n', encoding="utf-8")
    with pytest.raises(TandemError, match=r"line 2 is not a JSON object, and 2 more") as e:
        io.read_jsonl(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    for torn in ('{"step": 3, "loss', '{"step": 3, "loss\n', "[3]\n", '{"step": 3}\n\n'):
        path.write_text('{"step": 1}\n{"step": 2}\n' + torn, encoding="utf-8")
        assert [r["step"] for r in io.read_jsonl(path)] == [1, 2] + ([3] if torn == '{"step": 3}\n\n' else [])
    path.write_text('{"step": 1}\n[2]\n{"step": 3}\n', encoding="utf-8")
    with pytest.raises(TandemError, match="line 2"):
        io.read_jsonl(path)
    row = json.dumps({"step": 1, "text": "a\u2028b"}, ensure_ascii=False)  # str.splitlines() splits it in two
    path.write_text(row + '\n{"step": 2}\n', encoding="utf-8")
    assert [r["step"] for r in io.read_jsonl(path)] == [1, 2]
    assert io.read_jsonl(tmp_path / "none.jsonl") == []


def test_read_jsonl_names_a_file_with_bytes_that_are_not_utf8(tmp_path):
    """A byte that is not UTF-8 (no run writes one) is one line naming the file and the line, not a
    UnicodeDecodeError traceback; a folder in the file's place is one line too."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n\xff\xfe garbage\n')
    with pytest.raises(TandemError, match=r"line 3 holds a byte that is not UTF-8") as e:
        io.read_jsonl(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(TandemError, match="cannot be read"):
        io.read_jsonl(tmp_path / "dir.jsonl")
