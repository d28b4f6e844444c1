"""Datasets: the generated world (the embedded default), FlashRAG folders, and Search-R1 parquet files."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from searchgym.data.flashrag import load_flashrag
from searchgym.data.searchr1 import load_searchr1
from searchgym.data.types import Dataset, Passage, Question, SplitSelection, parse_split
from searchgym.data.world import WORLD_VERSION, WorldConfig, generate_world
from searchgym.errors import ConfigError

__all__ = [
    "WORLD_VERSION",
    "Dataset",
    "Passage",
    "Question",
    "SplitSelection",
    "WorldConfig",
    "generate_world",
    "load_dataset",
    "load_flashrag",
    "load_searchr1",
    "parse_split",
]


@lru_cache(maxsize=8)
def _cached_world(seed: int) -> Dataset:
    return generate_world(WorldConfig(seed=seed))


@lru_cache(maxsize=8)
def _cached_folder(path: str) -> Dataset:
    root = Path(path)
    # Search-R1 questions come as parquet files next to a FlashRAG corpus.jsonl.
    if root.is_file() or any(root.glob("*.parquet")):
        return load_searchr1(root)
    return load_flashrag(root)


def load_dataset(spec: str | Path | Dataset | None = None, *, world_seed: int = 0) -> Dataset:
    """Resolves a dataset argument as the environments accept it.

    Args:
        spec: ``None`` or ``"world"`` for the generated world; a :class:`Dataset` (returned as is); the
            path of a FlashRAG-format folder (a folder holding Search-R1 ``{split}.parquet`` files next to
            its ``corpus.jsonl`` is read with :func:`load_searchr1`); or the path of one Search-R1
            ``.parquet`` file with a ``corpus.jsonl`` beside it. Loaded datasets are cached per process,
            so many envs over the same data share one copy.
        world_seed: Seed of the generated world.

    Raises:
        ConfigError: ``spec`` is neither ``"world"`` nor an existing folder or parquet file.
    """
    if isinstance(spec, Dataset):
        return spec
    if spec is None or spec == "world":
        return _cached_world(world_seed)
    path = Path(spec).expanduser()
    if not (path.is_dir() or (path.is_file() and path.suffix == ".parquet")):
        raise ConfigError(
            f"dataset {str(spec)!r} is neither 'world' nor an existing FlashRAG folder or Search-R1 parquet file"
            + _nearby_hint(str(spec))
        )
    return _cached_folder(str(path.resolve()))


def _nearby_hint(spec: str) -> str:
    """``" (did you mean …?)"`` naming the datasets beside a missing one whose names start with, or are close
    to, its name (``../shared/data/hotpotqa`` → ``../shared/data/hotpotqa_dev_distractor_1100``); ``""`` when
    its folder is missing or holds none."""
    import difflib

    parent, _, name = spec.rstrip("/").rpartition("/")
    folder = Path(parent or ".").expanduser()
    try:
        beside = sorted(
            p.name
            for p in folder.iterdir()
            if not p.name.startswith(".") and (p.is_dir() or (p.is_file() and p.suffix == ".parquet"))
        )
    except OSError:
        return ""
    lowered = name.lower()
    matches = [b for b in beside if lowered and b.lower().startswith(lowered)]
    matches = matches or difflib.get_close_matches(name, beside, n=3, cutoff=0.6)
    if not matches:
        return ""
    shown = " or ".join(f"{parent}/{m}" if parent else m for m in matches[:3])
    return f" (did you mean {shown}?)"
