"""Running ``tandem_rlvr.cli.main`` in-process."""

from __future__ import annotations

from tandem_rlvr.cli import main


def cli_lines(capsys, argv):
    """Run the CLI; return (exit code, the lines of stderr)."""
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err
