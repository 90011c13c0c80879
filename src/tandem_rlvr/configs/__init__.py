"""The configs shipped with tandem-rlvr, usable by name from an installed package (no checkout needed).

Training configs: ``tandem-rlvr train trlvr`` (the built-in world's runs: trlvr, grpo, kl_reg) and
``tandem-rlvr train paper/trlvr`` (the paper's runs, docs/scale-out.md); the evaluation's:
``tandem-rlvr eval --config paper/eval``; accelerate launch configs: ``accelerate/ddp``,
``accelerate/ddp_2nodes`` (``accelerate launch --config_file "$(tandem-rlvr config-show --path accelerate/ddp)"``).
``tandem-rlvr config-show NAME`` prints one to copy and edit; a file path always wins over a name.
"""

from __future__ import annotations

from pathlib import Path

from tandem_rlvr.errors import ConfigError

ROOT = Path(__file__).resolve().parent
KINDS = ("train", "eval", "accelerate")


def kind_of(name: str) -> str:
    """``accelerate`` for launch configs, ``eval`` for evaluation configs, else ``train``."""
    if name.startswith("accelerate/"):
        return "accelerate"
    return "eval" if Path(name).name == "eval" else "train"


def names(kind: str | None = None) -> list[str]:
    """The shipped configs' names (``trlvr``, ``paper/trlvr``, ...), of one kind or all, sorted."""
    found = sorted(p.relative_to(ROOT).with_suffix("").as_posix() for p in ROOT.rglob("*.yaml"))
    return [n for n in found if kind is None or kind_of(n) == kind]


def path_of(name: str) -> Path | None:
    """The file of the shipped config ``name`` (with or without ``.yaml``), else None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    return ROOT / f"{stem}.yaml" if stem in names() else None


def resolve(given: str | Path, kind: str | None = "train", what: str = "config file") -> Path:
    """``given`` as an existing file, else the shipped config of that name; else a one-line
    :class:`ConfigError` listing the shipped configs of ``kind``."""
    p = Path(given).expanduser()
    if p.is_file():
        return p
    shipped = path_of(str(given))
    if shipped is not None:
        return shipped
    raise ConfigError(f"{what} {str(given)!r} does not exist and is no shipped config's name "
                      f"(shipped: {', '.join(names(kind))}; tandem-rlvr config-show NAME prints one)")
