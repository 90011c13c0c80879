"""Console output (tandem_rlvr.logs): our loggers at INFO and everyone else's at WARNING, log lines through the
progress bars, plain lines instead of a bar where stderr is no terminal, other libraries' bars off in jobs."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys

import pytest

from tandem_rlvr import logs


@contextlib.contextmanager
def bare_logging():
    """The root logger as a fresh process has it (no handlers) inside the block; pytest's own handlers, the
    root's level and our logger's level come back after it."""
    root, ours = logging.getLogger(), logging.getLogger("tandem_rlvr")
    saved, level, our_level = root.handlers[:], root.level, ours.level
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = saved
        root.setLevel(level)
        ours.setLevel(our_level)


@pytest.fixture
def library_bars():
    """transformers' and the Hub's progress bars on before the test and again after it (global switches)."""
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    enable_progress_bars()
    yield hf_logging
    hf_logging.enable_progress_bar()
    enable_progress_bars()


def _emit_everything() -> None:
    logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
    logging.getLogger("httpx").info("HTTP Request: HEAD https://huggingface.co/x")
    logging.getLogger("tandem_rlvr.training.trainer").info("resumed from checkpoints/step-4 at step 4")
    logging.getLogger("tandem_rlvr.data").debug("read 12 rows")
    logging.getLogger("accelerate").warning("a library's warning")


def test_ours_at_info_others_at_warning_and_verbose_gives_our_debug(capsys):
    with bare_logging():
        logs.setup_logging()
        _emit_everything()
        err = capsys.readouterr().err
        logs.setup_logging(verbose=True)
        _emit_everything()
        err_v = capsys.readouterr().err
        assert len(logging.getLogger().handlers) == 1  # a second setup adds no second handler (no doubled lines)
    assert "INFO tandem_rlvr.training.trainer: resumed from" in err
    assert "WARNING accelerate: a library's warning" in err
    assert "fontManager" not in err and "HTTP Request" not in err and "read 12 rows" not in err, err
    assert "DEBUG tandem_rlvr.data: read 12 rows" in err_v
    assert "fontManager" not in err_v and "HTTP Request" not in err_v, err_v


def test_the_cli_sets_the_levels(capsys):
    from tandem_rlvr.cli import main

    with bare_logging():
        logging.getLogger().setLevel(logging.DEBUG)  # whatever it was before
        assert main(["config-help"]) == 0
        levels = [logging.getLogger().level, logging.getLogger("tandem_rlvr").getEffectiveLevel()]
        assert main(["-v", "config-help"]) == 0
        levels.append(logging.getLogger("tandem_rlvr").getEffectiveLevel())
    assert levels == [logging.WARNING, logging.INFO, logging.DEBUG]
    capsys.readouterr()


def test_an_application_logging_setup_is_kept(monkeypatch):
    root = logging.getLogger()
    own = logging.StreamHandler(io.StringIO())
    monkeypatch.setattr(root, "handlers", [own])
    level = root.level
    try:
        logs.setup_logging()
        assert root.handlers == [own]
    finally:
        root.setLevel(level)
        logging.getLogger("tandem_rlvr").setLevel(logging.NOTSET)


def test_a_log_line_does_not_break_the_bar(monkeypatch):
    from tqdm import tqdm

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with bare_logging():
        logs.setup_logging()
        bar = tqdm(total=10, desc="train trlvr", file=sys.stderr)
        bar.update(3)
        logging.getLogger("tandem_rlvr.x").info("a line of ours")
        bar.update(1)
        bar.close()
    pieces = re.split(r"[\r\n]", term.getvalue())
    assert "INFO tandem_rlvr.x: a line of ours" in pieces, term.getvalue()  # on a line of its own, not after the bar


def test_plain_progress_prints_a_line_every_n_and_at_the_last(capsys):
    bar = logs.progress(7, "train trlvr", unit="step", every=3)  # capsys' stderr is no terminal
    assert isinstance(bar, logs.PlainProgress)
    for k in range(7):
        bar.set_postfix(refresh=False, reward=f"{k / 10:.3f}")
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["train trlvr"] * 3, lines
    assert [re.search(r"step (\d+)/7", ln).group(1) for ln in lines] == ["3", "6", "7"], lines
    assert "reward=0.200" in lines[0] and "reward=0.600" in lines[2] and "s/step" in lines[0] and "eta" in lines[0]


def test_plain_progress_counts_jumps_and_resumes(capsys):
    bar = logs.PlainProgress(100, "demo", unit="step", initial=40, every=20)
    bar.update(0)
    bar.update(15)  # 55: no multiple of 20 reached
    bar.update(30)  # 85: past 60 and 80, one line
    bar.update(15)  # 100: the last
    lines = capsys.readouterr().err.splitlines()
    assert [re.search(r"step (\d+)/100", ln).group(1) for ln in lines] == ["85", "100"], lines


def test_a_terminal_gets_a_tqdm_bar_and_disabled_gets_nothing(monkeypatch, capsys):
    from tqdm import tqdm

    monkeypatch.setattr(logs, "is_terminal", lambda stream=None: True)
    bar = logs.progress(3, "x")
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()
    capsys.readouterr()
    monkeypatch.setattr(logs, "is_terminal", lambda stream=None: False)
    bar = logs.progress(3, "x", enabled=False)
    assert isinstance(bar, tqdm) and bar.disable
    bar.update(3)
    bar.close()
    assert capsys.readouterr().err == ""


def test_quiet_libraries_turns_transformers_and_datasets_bars_off(library_bars):
    import datasets
    from huggingface_hub.utils import are_progress_bars_disabled

    datasets.enable_progress_bars()
    try:
        logs.quiet_libraries(downloads=True)
        assert not library_bars.is_progress_bar_enabled()
        assert not datasets.is_progress_bar_enabled()
        assert not are_progress_bars_disabled()  # downloads asked for: the Hub's bars stay
        logs.quiet_libraries(downloads=False)
        assert are_progress_bars_disabled()
    finally:
        datasets.enable_progress_bars()


def test_eval_no_progress_silences_transformers_and_hub_bars(tmp_path, library_bars, monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled

    from tandem_rlvr.cli import build_parser
    from tandem_rlvr.errors import TandemError
    from tandem_rlvr.evaluation import eval_cli

    seen = []

    def fake_run_eval(opts):
        seen.append({"transformers": library_bars.is_progress_bar_enabled(), "hub": not are_progress_bars_disabled(),
                     "progress": opts.progress})
        raise TandemError("stopped by the test")

    monkeypatch.setattr(eval_cli, "run_eval", fake_run_eval)
    monkeypatch.setattr(logs, "is_terminal", lambda stream=None: True)  # on a terminal the Hub's bars may stay
    argv = ["eval", "--benchmark", "b.jsonl", "--senior", "s", "--junior", "j", "--out", str(tmp_path / "o")]
    for extra in ([], ["--no-progress"]):
        with pytest.raises(TandemError, match="stopped by the test"):
            eval_cli.run_from_args(build_parser().parse_args([*argv, *extra]))
    assert seen == [{"transformers": False, "hub": True, "progress": True},
                    {"transformers": False, "hub": False, "progress": False}]


def test_saving_weights_keeps_the_bars_off(tmp_path, tokenizer, library_bars):
    from helpers.tiny_models import make_tiny_model
    from tandem_rlvr.training import checkpoint

    library_bars.disable_progress_bar()
    checkpoint._save_weights(make_tiny_model(len(tokenizer), 0, 16), tmp_path / "w")
    assert not library_bars.is_progress_bar_enabled()
    library_bars.enable_progress_bar()
    checkpoint._save_weights(make_tiny_model(len(tokenizer), 0, 16), tmp_path / "w2")
    assert library_bars.is_progress_bar_enabled()


def test_demo_workers_print_no_library_bars_and_only_warnings(library_bars, monkeypatch):
    from tandem_rlvr.demo import jobs

    seen = {}

    def fake_run_job(ctx, job, progress):
        seen.update(transformers=library_bars.is_progress_bar_enabled(), progress=progress,
                    info=logging.getLogger("tandem_rlvr.demo").isEnabledFor(logging.INFO))
        return None, {}

    monkeypatch.setattr(jobs, "_run_job", fake_run_job)
    with bare_logging():
        jobs._worker_job(None, (None, 0))
    assert seen == {"transformers": False, "progress": False, "info": False}
