"""Running ``tandem_rlvr.cli.main`` in-process."""

from __future__ import annotations

from tandem_rlvr.cli import main


def cli_lines(capsys, argv):
    """Run the CLI; return (exit code, the lines of stderr)."""
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def refused(capsys, argv, *words):
    """Run the CLI and require a refusal: exit 2 and one line ``tandem-rlvr COMMAND: error: ...`` holding every
    one of ``words``; returns that line."""
    rc, err = cli_lines(capsys, argv)
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith(f"tandem-rlvr {argv[0]}: error: "), err
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]
