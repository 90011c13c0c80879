"""Build (or load from cache) a built-in world: tokenizer, weaker junior, senior warm start.

Each world's recipe (its specs, tokenizer corpus and property gate) is the module its record names
(:mod:`tandem_rlvr.world.registry`: :mod:`~tandem_rlvr.world.arith_build`, :mod:`~tandem_rlvr.world.shorthand_build`);
this module builds any of them the same way. Layout under the cache root (``$TANDEM_RLVR_CACHE`` or
``~/.cache/tandem_rlvr``)::

    <key prefix>-v<VERSION>-<hash of the recipe>/   (world-v1-..., shorthand-v1-..., dialects-v1-..., slips-v1-...)
        tokenizer/   senior/   junior/   manifest.json

Each model folder is a standard Hugging Face checkpoint (safetensors + tokenizer files). A build is
written into a private temporary folder next to the final one and moved into place with one
``os.replace``; the manifest (with every file's size and SHA-256) is written last inside the
temporary folder, so a folder without a valid manifest is never trusted. An advisory file lock keeps
concurrent builders from duplicating work; a killed build leaves only a temporary folder, which the
next builder removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tandem_rlvr.data import PROMPT_SUFFIX
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import replace_durably
from tandem_rlvr.world.registry import DEFAULT_WORLD, get_world
from tandem_rlvr.world.rules import SEED, TOKENIZER_VOCAB
from tandem_rlvr.world.tokenizer import DIGIT_PATTERN, build_tokenizer

PREBUILT_DIR = Path(__file__).with_name("prebuilt")  # worlds shipped with the package, one folder per key
log = logging.getLogger(__name__)

@dataclass(frozen=True)
class WorldPaths:
    """Where a built world lives. ``self_junior_dir`` is the senior's warm start (the self-paired junior)."""

    root: Path
    tokenizer_dir: Path
    senior_dir: Path
    junior_dir: Path

    @property
    def self_junior_dir(self) -> Path:
        """The paper's self-paired junior: a frozen copy of the senior's starting checkpoint."""
        return self.senior_dir

    def junior(self, pairing: str = "weak") -> Path:
        """The junior checkpoint for ``pairing``: ``"weak"`` (plain-only, smaller) or ``"self"``."""
        if pairing not in ("weak", "self"):
            raise ValueError(f"pairing must be 'weak' or 'self', got {pairing!r}")
        return self.junior_dir if pairing == "weak" else self.self_junior_dir

    @property
    def manifest(self) -> dict:
        """The build manifest (recipe, parameter counts, build time, file hashes)."""
        return json.loads((self.root / "manifest.json").read_text())


def recipe(seed: int = SEED, world: str = DEFAULT_WORLD) -> dict:
    """Everything that determines the built world (its recipe module's ``recipe``); its hash names the cache folder."""
    return get_world(world).recipe_module().recipe(seed)


def world_key(seed: int = SEED, world: str = DEFAULT_WORLD) -> str:
    """The versioned cache folder name, ``<key prefix>-v<VERSION>-<hash>``: ``world-v1-3f2a9c01de`` for the arith
    world, ``shorthand-v1-...`` for the shorthand world."""
    w = get_world(world)
    digest = hashlib.sha256(json.dumps(recipe(seed, world), sort_keys=True).encode()).hexdigest()
    return f"{w.key_prefix}-v{w.recipe_module().VERSION}-{digest[:10]}"


def default_cache_dir() -> Path:
    """``$TANDEM_RLVR_CACHE`` if set, else ``~/.cache/tandem_rlvr``."""
    env = os.environ.get("TANDEM_RLVR_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tandem_rlvr"


def _paths(root: Path) -> WorldPaths:
    """The WorldPaths of a world folder."""
    return WorldPaths(root=root, tokenizer_dir=root / "tokenizer", senior_dir=root / "senior", junior_dir=root / "junior")


# ------------------------------------------------------------------------------ integrity checks


def _file_table(root: Path) -> dict[str, dict]:
    """Size and SHA-256 of every file under ``root`` except the manifest."""
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json"):
        table[str(path.relative_to(root))] = {
            "size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    return table


def is_complete(root: Path, seed: int = SEED, world: str = DEFAULT_WORLD) -> bool:
    """Whether ``root`` holds a finished build: a manifest of this recipe whose files all match."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != json.loads(json.dumps(recipe(seed, world))):
        return False
    files = manifest.get("files") or {}
    for rel in ("senior/model.safetensors", "junior/model.safetensors", "tokenizer/tokenizer.json"):
        if rel not in files:
            return False
    for rel, info in files.items():
        path = root / rel
        if not path.is_file() or path.stat().st_size != info["size"]:
            return False
        if hashlib.sha256(path.read_bytes()).hexdigest() != info["sha256"]:
            return False
    return True


@contextlib.contextmanager
def _build_lock(cache_root: Path, key: str):
    """An exclusive advisory lock per world key (released by the kernel if the process dies)."""
    try:
        import fcntl
    except ImportError:  # non-POSIX: rely on the atomic rename alone
        yield
        return
    with open(cache_root / f".{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_temps(cache_root: Path, key: str) -> None:
    """Delete temporary folders of earlier, interrupted builds of ``key`` (call under the lock)."""
    for path in cache_root.glob(f".tmp-{key}-*"):
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------- the build


ENV_KEYS = ("local_files_only",)  # echoed into tokenizer_config.json from the environment (HF_HUB_OFFLINE)


def normalize_configs(root: Path) -> None:
    """Drop environment echoes from the saved tokenizer configs, so a build's bytes depend on the recipe only."""
    for path in sorted(root.rglob("tokenizer_config.json")):
        cfg = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ENV_KEYS}, indent=2, ensure_ascii=False) + "\n")


def _build_into(tmp: Path, progress: bool, seed: int = SEED, world: str = DEFAULT_WORLD) -> None:
    """Build every artefact of the world into ``tmp`` (models retrained until the promised properties hold)
    and write its manifest last."""
    start = time.time()
    corpus = get_world(world).recipe_module().tokenizer_corpus(seed)
    tokenizer = build_tokenizer(
        corpus, TOKENIZER_VOCAB, tmp / "tokenizer", pattern=DIGIT_PATTERN, extra_tokens=[PROMPT_SUFFIX]
    )
    stats, tries = _train_until_properties_hold(tmp, progress, seed, world)
    manifest = {
        "recipe": recipe(seed, world),
        "vocab_size": len(tokenizer),
        "models": stats,
        "tries": tries,
        "build_seconds": round(time.time() - start, 2),
        "files": _file_table(tmp),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


class WorldBuildError(TandemError):
    """No try of a world build kept the promised properties; the message lists what each try measured."""


def _gate(world: str):
    """``(specs, measure, failures, retrain, values, count, max tries)`` of a world's property gate."""
    mod = get_world(world).recipe_module()
    return (mod.model_specs, mod.measure_models, mod.property_failures, mod.models_to_retrain, mod.property_values,
            mod.PROPERTY_COUNT, mod.MAX_TRIES)


def _train_until_properties_hold(tmp: Path, progress: bool, seed: int, world: str = DEFAULT_WORLD) -> tuple[dict, list[dict]]:
    """Train the junior and the senior, measure the properties, and retrain each model whose properties
    fail with its next seed (the other model is kept) until they all hold."""
    from tandem_rlvr.world import train_workers

    specs, measure, property_failures, models_to_retrain, property_values, count, max_tries = _gate(world)
    attempt, todo, stats, tries = {"junior": 0, "senior": 0}, ["junior", "senior"], {}, []
    for round_ in range(max_tries):
        stats.update(train_workers.train_models({n: specs(seed, attempt[n])[n] for n in todo}, tmp / "tokenizer", tmp,
                                                progress=progress, world=world))
        normalize_configs(tmp)
        measured = measure(_paths(tmp), count)
        failures = property_failures(measured)
        tries.append({"try": round_, "trained": todo, "seeds": {n: specs(seed, attempt[n])[n].seed for n in attempt},
                      "failures": failures,
                      "properties": {k: round(v, 4) for k, v in property_values(measured).items()}})
        log.info("world build try %d (seeds %s): %s; measured %s", round_, tries[-1]["seeds"],
                 "; ".join(failures) or "properties hold", tries[-1]["properties"])
        if not failures:
            return stats, tries
        todo = models_to_retrain(measured)
        for name in todo:
            attempt[name] += 1
    summary = " | ".join(f"try {t['try']}: {'; '.join(t['failures'])}" for t in tries)
    raise WorldBuildError(f"world build: no try of {max_tries} kept the promised properties ({world} world): "
                          f"{summary}")


def _install(tmp: Path, final: Path) -> None:
    """Move a finished build into place; an existing folder is swapped out first and removed."""
    if final.exists():
        trash = final.with_name(f".trash-{final.name}-{os.getpid()}-{time.time_ns()}")
        replace_durably(final, trash)
        replace_durably(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        replace_durably(tmp, final)


def build_id(root: Path) -> str:
    """A short digest of a built world's file table (its manifest): two builds of one recipe that differ in any
    byte (a rebuild on another CPU) have different ids."""
    files = json.loads((Path(root) / "manifest.json").read_text()).get("files") or {}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def is_shipped(root: Path, world: str = DEFAULT_WORLD) -> bool:
    """Whether the world in ``root`` is, byte for byte, the copy shipped with the package."""
    shipped = prebuilt_world(world)
    return shipped is not None and build_id(shipped) == build_id(root)


def prebuilt_world(world: str = DEFAULT_WORLD) -> Path | None:
    """The copy of the world's current recipe shipped with the package (``world/prebuilt/<key>``), if intact."""
    root = PREBUILT_DIR / world_key(world=world)
    return root if is_complete(root, world=world) else None


def build_world(cache_dir: str | Path | None = None, *, force: bool = False, progress: bool = True,
                prebuilt: bool = True, seed: int = SEED, world: str = DEFAULT_WORLD) -> WorldPaths:
    """Return the world's paths in the cache, installing it first if absent or incomplete.

    It is copied from the package's shipped copy when that one matches the recipe and verifies
    (``prebuilt``), else built: the two warm starts train in parallel worker processes, one thread
    each, seeded, so a rebuild on one machine gives the same bytes (another CPU model may round
    differently); a build whose models miss a promised property retrains them with the next seeds
    (``MAX_TRIES``, every try recorded in the manifest). ``force`` rebuilds from scratch; ``seed``
    builds another world of the same recipe (other tokenizer corpus order and model seeds); ``world``
    names the built-in world (a key of :data:`tandem_rlvr.world.registry.WORLDS`: ``arith``, the default,
    ``shorthand``, ``dialects`` or ``slips``); another name is an
    :class:`~tandem_rlvr.world.registry.UnknownWorldError`.
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache_root.mkdir(parents=True, exist_ok=True)
    key = world_key(seed, world)
    final = cache_root / key
    if not force and is_complete(final, seed, world):
        return _paths(final)
    with _build_lock(cache_root, key):
        if not force and is_complete(final, seed, world):  # another process finished it while we waited
            return _paths(final)
        _remove_stale_temps(cache_root, key)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache_root))
        tmp.chmod(0o755)  # mkdtemp makes it private; the installed world should be readable like a cache
        shipped = prebuilt_world(world) if prebuilt and not force and seed == SEED else None
        try:
            if shipped is not None:
                log.info("installing the shipped world %s into %s", shipped.name, cache_root)
                shutil.copytree(shipped, tmp, dirs_exist_ok=True)
            else:
                _build_into(tmp, progress, seed, world)
            _install(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not is_complete(final, seed, world):
        raise RuntimeError(f"world build at {final} did not verify")
    return _paths(final)
