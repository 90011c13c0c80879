"""A Hugging Face hub dataset in a local ``datasets`` cache, built offline: what ``load_dataset("org/name")``
leaves behind after a download, so the offline code path (``HF_HUB_OFFLINE=1``) finds it there; and a hub model
repo in the hub cache (:func:`cache_hub_model`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def cache_hub_dataset(cache_dir: Path, repo_id: str, splits: dict[str, list[dict]], subset: str = "default") -> Path:
    """Write ``splits`` (split name -> rows) as the cached dataset ``repo_id`` (config ``subset``) under
    ``cache_dir`` (``HF_DATASETS_CACHE``'s layout: ``org___name/<subset>/<version>/<hash>/``, Arrow files
    named after the dataset and a ``dataset_info.json``); returns that directory."""
    from datasets.packaged_modules.json.json import Json

    work = Path(cache_dir).parent / f".build-{repo_id.replace('/', '___')}-{subset}"
    files = {}
    for split, rows in splits.items():
        f = work / "src" / f"{split}.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        files[split] = str(f)
    builder = Json(cache_dir=str(work / "build"), dataset_name=repo_id.split("/")[-1], config_name=subset,
                   data_files=files)
    builder.download_and_prepare()
    out = Path(cache_dir) / repo_id.replace("/", "___") / subset / "0.0.0" / "0123456789abcdef0123"
    shutil.copytree(builder.cache_dir, out)
    return out


def use_cache(monkeypatch, cache_dir: Path) -> None:
    """Point ``datasets`` at ``cache_dir`` and keep it (and the hub client) offline for this test."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(cache_dir))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache_dir))


def cache_hub_model(cache: Path, monkeypatch, repo: str, commits: dict[str, str], files: dict[str, str]) -> Path:
    """``repo`` in the cache ``cache`` (made this process's offline hub cache): one snapshot per ``ref -> commit``,
    each holding ``files`` (name -> text, the ref appended), and refs naming them. Returns the cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    base = cache / f"models--{repo.replace('/', '--')}"
    for ref, commit in commits.items():
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (snap / name).write_text(f"{text} {ref}")
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / ref).write_text(commit)
    return cache
