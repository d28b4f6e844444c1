"""The parquet files verl trains on, written from any searchgym dataset (``searchgym prepare verl``).

verl reads its prompts through ``RLHFDataset``: one row per question with ``data_source``, ``prompt`` (a
chat message list), ``ability``, ``reward_model`` and ``extra_info``. The rows written here also name the
agent loop that plays them (``agent_name``, the one :mod:`searchgym.agents.integrations.verl` registers)
and carry, in ``extra_info``, what that loop needs to play the question as a SearchQA episode: the
question id and the env's settings (``searchgym_env``, JSON). The ``prompt`` column holds Search-R1's
prompt text, so that verl's prompt-length filter and its logs see the real prompt; the agent loop does not
re-encode it: the env renders the prompt in the policy's tokenizer, as every searchgym engine does.

Needs pyarrow (the ``parquet`` extra), not verl: the data can be prepared on a machine without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.data import load_dataset, parse_split
from searchgym.envs.spec import EnvSpec
from searchgym.errors import ConfigError, MissingDependencyError
from searchgym.protocol import format_prompt

__all__ = [
    "AGENT_NAME",
    "ENV_KEYS",
    "PLUGIN_MODULE",
    "check_verl_plugin",
    "question_rows",
    "write_verl_parquet",
]

PLUGIN_MODULE = "searchgym.agents.integrations.verl"
"""The module the ``searchgym`` entry point of the ``verl.plugins`` group names (``setup.cfg``)."""

AGENT_NAME = "searchgym"
"""The name the SearchQA agent loop is registered under in verl (the rows' ``agent_name``)."""

ENV_KEYS: tuple[str, ...] = EnvSpec.field_names()
"""The :class:`~searchgym.envs.search_qa.SearchQAEnv` settings a row may carry (``extra_info.searchgym_env``)."""


def question_rows(spec: EnvSpec, *, limit: int | None = None) -> list[dict[str, Any]]:
    """One verl row per question of ``spec.split``.

    Args:
        spec: The episodes' environment (``dataset`` a path, ``"world"`` or ``None``); every row carries its
            record (:meth:`EnvSpec.to_record`), which the agent loop reads back with
            :meth:`EnvSpec.from_record`.
        limit: Keep only the first ``limit`` questions.

    Returns:
        Rows with ``data_source``, ``prompt``, ``ability``, ``reward_model`` (``{"style": "rule",
        "ground_truth": {"target": golden answers}}``, Search-R1's layout), ``extra_info`` (``index``,
        ``split``, ``question_id``, ``searchgym_env``) and ``agent_name``.

    Raises:
        ConfigError: ``spec`` is not an :class:`EnvSpec`, holds a dataset object (rows need a path the
            workers can open), or names a split the dataset does not have.
    """
    if not isinstance(spec, EnvSpec):
        raise ConfigError(f"question_rows takes an EnvSpec, got {type(spec).__name__}")
    dataset_name = spec.dataset
    if dataset_name is not None and not isinstance(dataset_name, str):
        raise ConfigError("prepare verl needs the dataset as a path (or 'world'): verl's workers reopen it")
    if dataset_name not in (None, "world") and Path(dataset_name).exists():
        # Workers may start in another folder: store the absolute path.
        spec = spec.replace(dataset=str(Path(dataset_name).resolve()))
    env, split = spec, spec.split
    spec_name = None if dataset_name is None else str(dataset_name)
    dataset = load_dataset(spec_name, world_seed=env.world_seed)
    questions = dataset.questions(split)
    if limit is not None:
        questions = questions[:limit]
    env_json = json.dumps(env.to_record(), sort_keys=True)
    mark = env.append_question_mark
    return [
        {
            "data_source": f"searchgym/{dataset.name}",
            "prompt": [{"role": "user", "content": format_prompt(q.question, mark)}],
            "ability": "search-qa",
            "reward_model": {"style": "rule", "ground_truth": {"target": list(q.golden_answers)}},
            "extra_info": {
                "index": i,
                "split": split,
                "question_id": q.id,
                "searchgym_env": env_json,
            },
            "agent_name": AGENT_NAME,
        }
        for i, q in enumerate(questions)
    ]


def write_verl_parquet(
    out_dir: str | Path,
    spec: EnvSpec,
    splits: Sequence[str] = ("train",),
    *,
    limit: int | None = None,
) -> dict[str, Path]:
    """Writes ``OUT_DIR/{split}.parquet`` for each split (atomically: a temporary file moved into place); a
    sliced split (``test[:2000]``) is written as ``test_0-2000.parquet``, a name Hydra overrides take as is.

    Args:
        out_dir: The folder to write (created).
        spec: The episodes' environment (see :func:`question_rows`; its ``split`` is set per file).
        splits: The dataset splits to write, e.g. ``("train", "test")`` or ``("test[:2000]", "test[2000:]")``.
        limit: Keep only the first ``limit`` questions of each split.

    Returns:
        ``{split: path}``.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("pyarrow", "parquet", "Writing verl's parquet files") from e
    if not splits:
        raise ConfigError("give at least one split to write")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    stems = [parse_split(split).file_stem for split in splits]
    if len(set(stems)) != len(stems):
        raise ConfigError(f"splits {list(splits)} would write the same file twice")
    for split, stem in zip(splits, stems, strict=True):
        rows = question_rows(spec.replace(split=split), limit=limit)
        path = out / f"{stem}.parquet"
        tmp = out / f".{stem}.parquet.tmp"
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
        written[split] = path
    return written


def check_verl_plugin() -> str | None:
    """Loads the searchgym plugin the way ``import verl`` does, and says what is wrong with it.

    verl imports the modules of the ``verl.plugins`` entry-point group when it is imported, and logs a
    failure only at debug level: a plugin that cannot be imported shows up much later, in a Ray worker, as
    "Agent loop searchgym not registered". This makes the real error visible where the data is prepared.

    Returns:
        ``None`` when the plugin loads, or when verl is not installed here (nothing to check); otherwise
        the problem: a missing entry point, or the import's traceback.
    """
    import importlib
    import importlib.metadata
    import importlib.util
    import traceback

    if importlib.util.find_spec("verl") is None:
        return None
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="verl.plugins")}
    if names.get(AGENT_NAME) != PLUGIN_MODULE:
        return (
            f"the verl.plugins entry point {AGENT_NAME!r} -> {PLUGIN_MODULE} is not installed (found "
            f"{names or 'none'}): install searchgym with pip (pip install 'searchgym[verl]', or -e '.[verl]')"
        )
    try:
        importlib.import_module(PLUGIN_MODULE)
    except Exception:
        return traceback.format_exc()
    return None
