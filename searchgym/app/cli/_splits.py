"""The training commands' split check: every split a run will read exists in its dataset, before the run
writes anything into its folder."""

from __future__ import annotations

from typing import Any

__all__ = ["check_splits"]

#: The config fields that name a split, each with the field that turns its use off when 0 (``None``: always
#: used).
SPLIT_FIELDS: dict[str, str | None] = {
    "split": None,
    "eval_split": "eval_questions",
    "onpolicy_heldout_split": "onpolicy_probe_size",
}


def check_splits(config: Any) -> None:
    """Reads each split ``config`` (a training config, or a command's parsed options) will use, so that an
    unknown split or a bad slice stops the command at once, in one line, before the run folder is touched
    (the dataset is cached: the run does not read it twice).

    A held-out probe split must also share no question with the training split (``test[:2000]`` and
    ``test[2000:]`` do not; ``test`` and ``test[2000:]`` do).

    Raises:
        ConfigError: a split the dataset does not have, a malformed slice, one that selects nothing, or a
            held-out split that overlaps the training split.
    """
    import dataclasses
    from types import SimpleNamespace

    from searchgym.data import load_dataset, parse_split
    from searchgym.errors import ConfigError
    from searchgym.options import flat_values

    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = SimpleNamespace(**flat_values(config))  # a sectioned config: its options by name
    dataset = load_dataset(getattr(config, "dataset", None), world_seed=getattr(config, "world_seed", 0))
    used = {
        name: getattr(config, name)
        for name, switch in SPLIT_FIELDS.items()
        if getattr(config, name, None) is not None and (switch is None or getattr(config, switch, False))
    }
    if getattr(config, "demos", None) is not None:  # SFT on a demonstrations file reads no training split
        used.pop("split", None)
    for name, value in used.items():
        for split in value if isinstance(value, list | tuple) else [value]:  # `prepare verl` takes several
            try:
                dataset.questions(split)
            except ConfigError as e:
                raise ConfigError(f"--{name.replace('_', '-')}: {e}") from None
    if "onpolicy_heldout_split" not in used or not isinstance(used.get("split"), str):
        return
    train, heldout = parse_split(used["split"]), parse_split(used["onpolicy_heldout_split"])
    if train.name != heldout.name:  # different splits hold different questions
        return
    size = len(dataset.questions(train.name))
    shared = set(train.indices(size)) & set(heldout.indices(size))
    if shared:
        raise ConfigError(
            f"--onpolicy-heldout-split {heldout.spec!r} shares {len(shared)} questions with the training "
            f"split {train.spec!r}: held-out questions are ones the run never trains on (e.g. --split "
            "'test[:2000]' --onpolicy-heldout-split 'test[2000:]')"
        )
