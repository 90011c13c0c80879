"""Experiment trackers (``train.trackers``): checked before training, so a missing one is an error.

accelerate silently drops a tracker whose package is not installed (one warning in the middle of
the progress bar); a run asked to log to TensorBoard that writes nothing is a failure, so
:func:`check_trackers` refuses it up front and names what to install.
"""

from __future__ import annotations

import importlib.util

from tandem_rlvr.errors import TandemError

# tracker name -> (modules of which one must import, what to install)
TRACKERS = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install 'tandem-rlvr[tensorboard]' (or tensorboard)"),
    "wandb": (("wandb",), "pip install 'tandem-rlvr[wandb]' (or wandb)"),
    "trackio": (("trackio",), "pip install 'tandem-rlvr[trackio]' (or trackio)"),
    "mlflow": (("mlflow",), "pip install mlflow"),
    "comet_ml": (("comet_ml",), "pip install comet_ml"),
    "aim": (("aim",), "pip install aim"),
    "clearml": (("clearml",), "pip install clearml"),
    "dvclive": (("dvclive",), "pip install dvclive"),
    "swanlab": (("swanlab",), "pip install swanlab"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_trackers(names: list) -> None:
    """Raise :class:`TandemError` unless every requested tracker is known and its package importable."""
    for name in names:
        if not isinstance(name, str) or name not in TRACKERS:
            raise TandemError(f"train.trackers: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}")
        modules, install = TRACKERS[name]
        if not any(_importable(m) for m in modules):
            raise TandemError(f"train.trackers=[{name}] needs the {modules[0]} package, which is not installed: "
                              f"{install}, or drop it from train.trackers")


def flat_config(cfg: dict, prefix: str = "") -> dict:
    """The config as flat ``section.key`` → int/float/str/bool (what every tracker's hparams accept)."""
    out: dict = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:  # None, lists
            out[name] = str(value)
    return out
