"""Rows of a Hugging Face dataset: a hub id ``org/name`` (``datasets.load_dataset``, the local ``datasets``
cache when offline) or a local dataset directory (``Dataset.save_to_disk`` output, or a folder of data
files that ``load_dataset`` reads). :func:`tandem_rlvr.data.load_examples` maps their columns.

Errors are one :class:`~tandem_rlvr.errors.DataError` line naming the config key (``data.train``,
``val.data``), the id and, for a split or subset, the key that picks it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tandem_rlvr.errors import DataError

__all__ = ["HUB_ID", "dataset_rows", "is_hub_id"]

# org/name as the hub spells repository ids: letters, digits, - _ . ; neither part starts with . or -
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# the keys that pick a split and a subset for each data key
SPLIT_KEYS = {"data.train": "data.train_split", "val.data": "val.split"}
SUBSET_KEYS = {"data.train": "data.subset", "val.data": "val.subset"}


def is_hub_id(source: str) -> bool:
    """``source`` reads as a hub dataset id (``org/name``) and is no local path."""
    return bool(HUB_ID.match(source)) and not Path(source).expanduser().exists()


def dataset_rows(source: str, split: str | None, subset: str | None, *, key: str = "data",
                 default_split: str | None = None) -> tuple[str, list[dict[str, Any]], list[str]]:
    """``(name, rows, column names)`` of one split of the dataset at ``source`` (a directory or a hub id).

    ``split`` None: ``default_split`` where the dataset has it, else its only split; several splits and
    neither is an error naming the split key."""
    path = Path(source).expanduser()
    ds = _open_dir(path, subset, key) if path.is_dir() else _open_hub(source, subset, split, key)
    ds, split = _pick_split(ds, source, split, default_split, key)
    rows = ds.to_list()
    return f"{source}[{split}]" if split else source, rows, list(ds.column_names)


def _open_dir(path: Path, subset: str | None, key: str) -> Any:
    import datasets as hf

    saved = any((path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))
    try:
        if saved:  # Dataset / DatasetDict.save_to_disk
            if subset:
                raise DataError(f"{key}: {path} is a saved dataset (save_to_disk), which has no subsets; "
                                f"unset {SUBSET_KEYS.get(key, 'subset')}")
            return hf.load_from_disk(str(path))
        return hf.load_dataset(str(path), subset or None)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a folder it cannot read
        raise DataError(f"{key}: {path}: not a dataset directory that datasets can read "
                        f"({type(e).__name__}: {_first_line(e)})") from e


_OPENED: dict = {}  # (repo, subset, cache folder) -> the loaded DatasetDict: a run reads its data several times


def _open_hub(repo: str, subset: str | None, split: str | None, key: str) -> Any:
    """The dataset ``repo`` (``subset``), loaded once per process and datasets cache folder: the checks before
    the first forward and the run itself read the same data without loading it (and printing datasets'
    offline notice) again."""
    import datasets as hf

    memo = (repo, subset or None, str(hf.config.HF_DATASETS_CACHE))
    if memo in _OPENED:
        return _OPENED[memo]
    try:
        ds = hf.load_dataset(repo, subset or None)
    except Exception as e:  # noqa: BLE001 - offline, missing, gated, bad subset: one clear line
        raise DataError(_hub_error(repo, subset, key, e)) from e
    if len(_OPENED) >= 8:
        _OPENED.clear()
    _OPENED[memo] = ds
    return ds


def _hub_error(repo: str, subset: str | None, key: str, e: Exception) -> str:
    import datasets as hf

    where = f"{key}: hub dataset {repo!r}" + (f" (subset {subset!r})" if subset else "")
    text = _first_line(e)
    if hf.config.HF_HUB_OFFLINE and ("offline" in text.lower() or "Couldn't reach" in text):
        return (f"{where} is not in the local datasets cache ({hf.config.HF_DATASETS_CACHE}) and the hub is "
                "offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): load it once online, or give a local file "
                "or a saved dataset directory")
    if "Couldn't find cache" in text or "config" in text.lower() and "available" in str(e).lower():
        listed = str(e).splitlines()[-1]
        return f"{where}: no such subset; {listed}; set {SUBSET_KEYS.get(key, 'the subset')}"
    return f"{where} cannot be loaded: {type(e).__name__}: {text}"


def _pick_split(ds: Any, source: str, split: str | None, default_split: str | None, key: str) -> tuple[Any, str]:
    import datasets as hf

    if not isinstance(ds, (hf.DatasetDict, dict)):  # a saved single Dataset has no split names
        if split:
            raise DataError(f"{key}: {source} is one saved split (a Dataset, not a DatasetDict); "
                            f"unset {SPLIT_KEYS.get(key, 'the split')}")
        return ds, ""
    names = list(ds)
    chosen = split or (default_split if default_split in names else names[0] if len(names) == 1 else None)
    if chosen is None or chosen not in names:
        what = f"no split {split!r}" if split else f"has several splits ({', '.join(names)})"
        raise DataError(f"{key}: {source}: {what}; set {SPLIT_KEYS.get(key, 'the split')} to one of "
                        f"{', '.join(names)}")
    return ds[chosen], chosen


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
