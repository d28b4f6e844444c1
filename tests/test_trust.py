"""Hostile and broken inputs, fed as an attacker or an accident would make them, give a typed error or a safe
result: crafted checkpoints, SB3 archives, index files, server traffic, run folders.

``test_safety.py`` holds the file-format and no-results-lost checks; the random mutations are in
``test_fuzz_files.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.data import Passage
from searchgym.errors import CheckpointError, ConfigError, DataFormatError
from searchgym.retrieval import BM25Retriever

torch = pytest.importorskip("torch")

from searchgym.agents.grpo.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from searchgym.agents.grpo.checkpoint_checks import MAX_CONTEXT_TOKENS, check_config  # noqa: E402
from searchgym.agents.grpo.training_state import load_training_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def linear_run(seed: int = 0) -> tuple[Any, Any, Any]:
    """A model, its AdamW after one step, and a scheduler: the states a GRPO checkpoint holds."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def grpo_payload(**changes: Any) -> dict[str, Any]:
    model, optimizer, scheduler = linear_run()
    payload = {
        "kind": "grpo",
        "step": 1,
        "model": model.state_dict(),
        "arch": {"kind": "tiny", "layers": 1, "hidden": 4, "tokenizer": None},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "config": {"lr": 1e-3, "seed": 0, "max_turn_tokens": 48, "max_context_tokens": 1024},
    }
    payload.update(changes)
    return payload


# -- 2. unbounded model construction ------------------------------------------------------------------------------


def test_a_small_checkpoint_describing_a_huge_tiny_model_is_refused(tmp_path: Path) -> None:
    from searchgym.agents.grpo.config import SFTConfig
    from searchgym.agents.grpo.runtime import build_policy

    arch = {"kind": "tiny", "layers": 65536, "hidden": 65536, "tokenizer": None}
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch=arch))
    assert path.stat().st_size < 8 << 10
    with pytest.raises(CheckpointError, match="'layers'"):
        load_checkpoint(path)
    # Within the layer bound, the size is checked against the weights the file stores.
    arch = {"kind": "tiny", "layers": 2, "hidden": 65536, "tokenizer": None}
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch=arch))
    with pytest.raises(CheckpointError, match=r"at least 17,179,869,184 parameters.*stores 72 weights"):
        build_policy(SFTConfig(init=str(path)))


def test_a_config_architecture_is_bounded_before_it_is_built(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    }
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch={"kind": "config", "config": config}))
    with pytest.raises(CheckpointError, match=r"parameters but the checkpoint stores 72 weights"):
        load_checkpoint(path)
    for field, value in (("num_hidden_layers", 10**6), ("hidden_size", 10**12), ("hidden_size", 2**40)):
        bomb = {**config, field: value}
        path = save_checkpoint(tmp_path / "c.pt", grpo_payload(arch={"kind": "config", "config": bomb}))
        with pytest.raises(CheckpointError, match=field):
            load_checkpoint(path)


def test_a_real_tiny_checkpoint_passes_the_size_check(tmp_path: Path) -> None:
    from searchgym.agents.grpo.config import SFTConfig
    from searchgym.agents.grpo.runtime import build_policy

    policy, arch = build_policy(SFTConfig(tiny_layers=2, tiny_hidden=32))
    path = save_checkpoint(
        tmp_path / "c.pt", {"kind": "sft", "step": 0, "model": policy.model.state_dict(), "arch": arch}
    )
    loaded, _ = build_policy(SFTConfig(init=str(path)))
    assert all(
        torch.equal(a, b) for a, b in zip(policy.model.parameters(), loaded.model.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_turn_tokens", "abc", r"'max_turn_tokens' is 'abc' \(str\), expected int"),
        (
            "max_context_tokens",
            10**12,
            rf"'max_context_tokens' is 1000000000000, more than the {MAX_CONTEXT_TOKENS}",
        ),
        ("max_turn_tokens", 0, "max_turn_tokens must be >= 1"),
        ("lr", float("nan"), "'lr' is nan, not a finite number"),
        ("lr", "0.1", r"'lr' is '0.1' \(str\), expected float"),
        ("progress", 1, r"'progress' is 1 \(int\), expected bool"),
        ("seed", 10**30, "does not fit in 64 bits"),
        ("dtype", "float64", r"'dtype' is 'float64'.*Literal\['float32', 'bfloat16', 'float16'\]"),
    ],
)
def test_a_bad_checkpoint_config_field_is_named(tmp_path: Path, field: str, value: Any, message: str) -> None:
    payload = grpo_payload()
    payload["config"] = {**payload["config"], field: value}
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_fields_added_to_the_config_dataclass_are_checked_by_their_type_hint() -> None:
    from searchgym.agents.grpo.config import GRPOConfig

    hints = {f.name: f.type for f in __import__("dataclasses").fields(GRPOConfig)}
    # Every int field refuses a string: no hard-coded list decides which fields are checked.
    int_fields = [name for name, hint in hints.items() if hint == "int"]
    assert len(int_fields) >= 10
    for name in int_fields:
        with pytest.raises(CheckpointError, match=repr(name)):
            check_config({name: "7"}, "grpo", "c.pt")
    check_config({"unknown_field_of_another_version": "x"}, "grpo", "c.pt")  # ignored, not an error


def test_eval_with_a_bad_checkpoint_config_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.cli import main

    for field, value in (("max_turn_tokens", "abc"), ("max_context_tokens", 10**12)):
        payload = grpo_payload()
        payload["config"] = {**payload["config"], field: value}
        path = save_checkpoint(tmp_path / "c.pt", payload)
        code = main(["eval", "--agent", f"checkpoint:{path}", "--episodes", "1", "--no-progress"])
        err = capsys.readouterr().err
        assert code != 0 and field in err and "Traceback" not in err


# -- 4. non-finite and mis-shaped optimizer state --------------------------------------------------------------


def test_a_nan_optimizer_state_is_refused_on_load(tmp_path: Path) -> None:
    payload = grpo_payload()
    payload["optimizer"]["state"][0]["exp_avg"] = torch.full((8, 8), float("nan"))
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(
        CheckpointError, match=r"optimizer\['state'\]\[0\]\['exp_avg'\] holds non-finite values"
    ):
        load_checkpoint(path)
    payload = grpo_payload()
    payload["model"]["weight"] = torch.full((8, 8), float("inf"))
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=r"model\['weight'\] holds non-finite"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["state"][0].update(exp_avg=torch.zeros(4, 4)),
            r"state 0\['exp_avg'\] has shape \(4, 4\)",
        ),
        (lambda s: s["param_groups"][0].update(lr="0.001"), r"\['lr'\] is '0.001', expected a finite number"),
        (lambda s: s["param_groups"][0].update(betas=(0.9,)), r"\['betas'\] is \(0.9,\), expected 2 values"),
        (lambda s: s["param_groups"][0].update(amsgrad="no"), r"\['amsgrad'\] is 'no', expected a bool"),
        (lambda s: s["state"][0].update(step="x"), r"state 0\['step'\] is a str"),
        (lambda s: s["state"].update({7: {}}), "entry 7 names no parameter"),
    ],
    ids=["shape", "lr type", "betas", "amsgrad", "step", "extra entry"],
)
def test_a_mis_shaped_or_mistyped_optimizer_state_is_refused_before_training(
    tmp_path: Path, change: Any, message: str
) -> None:
    payload = grpo_payload()
    change(payload["optimizer"])
    path = save_checkpoint(tmp_path / "c.pt", payload)
    loaded = load_checkpoint(path)
    _, optimizer, scheduler = linear_run(seed=1)
    with pytest.raises(CheckpointError, match=message):
        load_training_state(optimizer, scheduler, loaded, path)


def test_a_good_optimizer_state_is_restored(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.pt", grpo_payload())
    _, optimizer, scheduler = linear_run(seed=1)
    load_training_state(optimizer, scheduler, load_checkpoint(path), path)
    _, reference, _ = linear_run()
    assert torch.equal(
        optimizer.state_dict()["state"][0]["exp_avg"], reference.state_dict()["state"][0]["exp_avg"]
    )
    payload = grpo_payload()
    payload["scheduler"]["base_lrs"] = ["x"]
    path = save_checkpoint(tmp_path / "c.pt", payload)
    with pytest.raises(CheckpointError, match=r"scheduler\['base_lrs'\]\[0\] is 'x'"):
        load_training_state(optimizer, scheduler, load_checkpoint(path), path)


def test_a_crafted_view_larger_than_its_storage_is_refused(tmp_path: Path) -> None:
    payload = grpo_payload()
    payload["model"]["weight"] = torch.zeros(1).expand(10**6, 10**6)
    path = tmp_path / "c.pt"
    torch.save({"format": "searchgym-checkpoint-v2", **payload}, path)
    with pytest.raises(CheckpointError, match="crafted view"):
        load_checkpoint(path)


# -- 8 (checkpoint messages). a file that is not a checkpoint ---------------------------------------------------


def test_a_file_that_is_not_a_checkpoint_is_called_so_and_never_suggested_for_deletion(
    tmp_path: Path,
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    with pytest.raises(CheckpointError, match="is not a searchgym checkpoint") as err:
        load_checkpoint(readme)
    assert "delete" not in str(err.value)
    assert readme.read_text() == "# my notes\n"


# -- 1. stable-baselines3 models never unpickle -----------------------------------------------------------------


class _RunsCode:
    """Unpickling this object runs ``exec``: what a malicious SB3 zip carries in a ``:serialized:`` field."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _sb3_model(tmp_path: Path, policy_kwargs: dict[str, Any] | None = None) -> tuple[Path, Any]:
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym

    from searchgym.agents.sb3 import ALGORITHMS

    env = gym.make("SearchQAMacro-v0", split="test")
    model = ALGORITHMS["ppo"](
        "MlpPolicy", env, device="cpu", n_steps=8, batch_size=8, seed=0, policy_kwargs=policy_kwargs
    )
    path = tmp_path / "model.zip"
    model.save(path)
    return path, model


def _rewrite_data(path: Path, change: Any) -> None:
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(members["data"])
    change(data)
    members["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


def _poison(data: dict[str, Any], marker: Path) -> None:
    import base64
    import pickle

    evil = base64.b64encode(pickle.dumps(_RunsCode(marker))).decode()
    for value in data.values():  # every serialized field, the policy class among them
        if isinstance(value, dict) and ":serialized:" in value:
            value[":serialized:"] = evil
    data["policy_class"][":serialized:"] = evil


def test_an_sb3_zip_with_a_code_running_pickle_plays_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stable_baselines3 import PPO

    from searchgym.cli import main

    path, _ = _sb3_model(tmp_path)
    marker = tmp_path / "pwned"
    _rewrite_data(path, lambda data: _poison(data, marker))
    code = main(
        [
            "eval",
            "--env",
            "SearchQAMacro-v0",
            "--agent",
            f"sb3:{path}",
            "--episodes",
            "2",
            "--no-progress",
            "--json",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["episodes"] == 2
    assert not marker.exists()
    # The same file does run code through stable-baselines3's own loader: the input is a real exploit.
    with pytest.raises(Exception):  # noqa: B017 - what fails after the payload ran does not matter
        PPO.load(path, device="cpu")
    assert marker.read_text() == "pwned"


def test_an_sb3_model_without_an_env_needs_its_run_config(tmp_path: Path) -> None:
    from searchgym.agents.sb3 import load_model

    path, _ = _sb3_model(tmp_path)
    with pytest.raises(ConfigError, match="pass the env"):
        load_model(path)
    (tmp_path / "config.json").write_text(
        json.dumps({"algo": "ppo", "env_id": "SearchQAMacro-v0", "env": {}})
    )
    assert type(load_model(path)).__name__ == "PPO"


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            lambda d: d.update(policy_kwargs={"net_arch": [10**6, 10**6]}),
            CheckpointError,
            r"at least 1,000,\d{3},\d{3},\d{3} parameters but the file stores",
        ),
        (
            lambda d: d.update(policy_kwargs={"activation_fn": "<class 'os.system'>"}),
            ConfigError,
            "names os.system",
        ),
        (
            lambda d: d.update(
                policy_kwargs={
                    ":type:": "<class 'dict'>",
                    ":serialized:": "x",
                    "optimizer_class": "<class 'builtins.eval'>",
                }
            ),
            ConfigError,
            "names builtins.eval",
        ),
        (lambda d: d.update(n_steps=int("9" * 5000)), CheckpointError, "not valid JSON"),
    ],
    ids=["net_arch bomb", "unknown activation", "serialized eval", "integer bomb"],
)
def test_crafted_sb3_data_is_a_typed_error(tmp_path: Path, change: Any, error: type, message: str) -> None:
    import gymnasium as gym

    from searchgym.agents.sb3 import load_model

    path, _ = _sb3_model(tmp_path)
    if "integer bomb" in message or message == "not valid JSON":
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        members["data"] = members["data"].replace(b'"n_steps": 8', b'"n_steps": ' + b"9" * 5000)
        with zipfile.ZipFile(path, "w") as archive:
            for name, content in members.items():
                archive.writestr(name, content)
    else:
        _rewrite_data(path, change)
    with pytest.raises(error, match=message):
        load_model(path, env=gym.make("SearchQAMacro-v0"))


def test_an_sb3_token_model_rebuilds_its_features_extractor(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym

    from searchgym.agents.sb3 import ALGORITHMS, load_model, token_policy_kwargs

    env = gym.make("SearchQA-v0", max_context_tokens=256, max_turn_tokens=16)
    kwargs = token_policy_kwargs(embed_dim=8, last_k=2, features_dim=16)
    model = ALGORITHMS["ppo"](
        "MultiInputPolicy", env, device="cpu", n_steps=8, batch_size=8, policy_kwargs=kwargs
    )
    model.save(tmp_path / "model.zip")
    loaded = load_model(tmp_path / "model.zip", env=env)
    saved, rebuilt = model.policy.state_dict(), loaded.policy.state_dict()
    assert saved.keys() == rebuilt.keys() and all(torch.equal(saved[k], rebuilt[k]) for k in saved)
    with pytest.raises(ConfigError, match="observation_space differs from the env's"):
        load_model(
            tmp_path / "model.zip", env=gym.make("SearchQA-v0", max_context_tokens=300, max_turn_tokens=16)
        )


# -- 3. typed errors everywhere ---------------------------------------------------------------------------------

BOMB = "9" * 5000  # an integer of more than 4,300 digits: Python's int() refuses it with a ValueError


def bm25_index(tmp_path: Path, k1: float = 0.9, name: str = "index") -> tuple[Path, list[Passage]]:
    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(40)
    ]
    return BM25Retriever(passages, k1=k1).save(tmp_path / name), passages


@pytest.fixture(scope="module")
def dense_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], list[Passage]]:
    pytest.importorskip("faiss")
    from searchgym.retrieval.dense import build_dense_index, tiny_encoder

    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(200)
    ]
    root = tmp_path_factory.mktemp("dense")
    encoder = tiny_encoder()
    dirs = {
        kind: build_dense_index(passages, encoder, root / kind, index_type=kind, progress=False)
        for kind in ("flat", "ivf", "hnsw")
    }
    return dirs, passages


def copy_dir(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def reseal(manifest: Path, **changes: Any) -> None:
    """The manifest with ``changes`` and fresh hashes of its files: what a crafted index carries."""
    from searchgym.integrity import seal

    meta = json.loads(manifest.read_text())
    files = {name: manifest.parent / name for name in meta.get("files", {})}
    manifest.write_text(json.dumps(seal({**meta, **changes}, files)))


def test_an_integer_bomb_in_each_json_file_is_a_typed_error(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    from searchgym.data import load_flashrag
    from searchgym.retrieval.dense import DenseRetriever

    folder, passages = bm25_index(tmp_path)
    meta = (folder / "bm25.json").read_text()
    (folder / "bm25.json").write_text(meta.replace('"passages": 40', f'"passages": {BOMB}'))
    with pytest.raises(DataFormatError, match=r"bm25\.json.*Exceeds the limit"):
        BM25Retriever.load(folder, passages)
    dirs, dense_passages = dense_dirs
    out = copy_dir(dirs["flat"], tmp_path / "dense")
    manifest = (out / "dense.json").read_text()
    (out / "dense.json").write_text(manifest.replace('"count": 200', f'"count": {BOMB}'))
    with pytest.raises(DataFormatError, match=r"dense\.json.*Exceeds the limit"):
        DenseRetriever.load(out, dense_passages)
    data = tmp_path / "data"
    data.mkdir()
    good_corpus = '{"id": "0", "contents": "\\"T\\"\\ntext"}\n'
    good_split = '{"id": "q0", "question": "q?", "golden_answers": ["a"]}\n'
    for name, line in (
        ("corpus.jsonl", f'{{"id": "1", "contents": "x", "n": {BOMB}}}\n'),
        ("test.jsonl", f'{{"id": {BOMB}}}\n'),
    ):
        (data / "corpus.jsonl").write_text(good_corpus + (line if name == "corpus.jsonl" else ""))
        (data / "test.jsonl").write_text(good_split + (line if name == "test.jsonl" else ""))
        with pytest.raises(DataFormatError, match=rf"{name}:2: invalid JSON \(Exceeds the limit"):
            load_flashrag(data, splits=("test",))


def test_dense_manifest_field_changes_are_typed_errors(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    from searchgym.retrieval.dense import DenseRetriever

    dirs, passages = dense_dirs
    # Changed by hand: the manifest's own checksum refuses it.
    out = copy_dir(dirs["hnsw"], tmp_path / "edited")
    text = (out / "dense.json").read_text()
    (out / "dense.json").write_text(text.replace('"index_type": "hnsw"', '"index_type": "ivf"'))
    with pytest.raises(DataFormatError, match="fails its checksum"):
        DenseRetriever.load(out, passages)
    # Changed and re-sealed (a crafted index): each field is checked for what it is.
    cases = [
        (
            "hnsw",
            {"index_type": "ivf"},
            r"index_params \['M', 'ef_construction', 'ef_search'\] are not those of a ivf",
        ),
        ("hnsw", {"index_params": {"M": 32, "ef_construction": 80, "ef_search": 1.5}}, "'ef_search' is 1.5"),
        (
            "hnsw",
            {"index_type": "ivf", "index_params": {"nlist": 4, "nprobe": 2}},
            "holds a IndexHNSWFlat, not the ivf",
        ),
        ("flat", {"index_type": "nope"}, "unknown index type 'nope'"),
        ("flat", {"dim": True}, "dim must be a positive integer"),
        ("flat", {"encoder": []}, "encoder must be an object"),
    ]
    for i, (kind, change, message) in enumerate(cases):
        out = copy_dir(dirs[kind], tmp_path / f"crafted{i}")
        reseal(out / "dense.json", **change)
        with pytest.raises(DataFormatError, match=message):
            DenseRetriever.load(out, passages)


@pytest.mark.parametrize("bad", [10**6, -2])  # -2 was found by the fuzz suite: faiss's "none" is only -1
def test_faiss_ids_outside_the_corpus_are_a_typed_error(
    bad: int, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    import faiss

    from searchgym.retrieval.dense import DenseRetriever

    dirs, passages = dense_dirs
    retriever = DenseRetriever.load(dirs["ivf"], passages)
    # A corrupted IVF index whose lists hold ids outside the corpus (what a damaged file returns).
    ids = faiss.extract_index_ivf(retriever.index).invlists
    list_no = next(i for i in range(ids.nlist) if ids.list_size(i))
    faiss.rev_swig_ptr(ids.get_ids(list_no), ids.list_size(list_no))[0] = bad
    retriever.index.nprobe = ids.nlist
    with pytest.raises(
        DataFormatError, match=rf"index\.faiss.*returned passage id {bad}, but the corpus holds 200"
    ):
        retriever.search([p.text for p in passages[:50]], 200)


@pytest.mark.parametrize("kind", ["flat", "bm25"])
def test_a_npy_header_numpy_cannot_tokenize_is_a_typed_error(
    kind: str, tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    """A damaged header made NumPy's header parser raise tokenize.TokenError (found by the fuzz suite)."""
    import zipfile

    from searchgym.retrieval.dense import DenseRetriever

    if kind == "flat":
        dirs, passages = dense_dirs
        out = copy_dir(dirs["flat"], tmp_path / "dense")
        data = bytearray((out / "embeddings.npy").read_bytes())
        data[data.index(b"}")] = ord(" ")  # the header dict never closes
        (out / "embeddings.npy").write_bytes(bytes(data))
        with pytest.raises(DataFormatError, match="corrupt embeddings file"):
            DenseRetriever.load(out, passages)
        return
    folder, passages = bm25_index(tmp_path)
    with zipfile.ZipFile(folder / "bm25.npz") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    damaged = bytearray(members["data.npy"])
    damaged[damaged.index(b"}")] = ord(" ")
    members["data.npy"] = bytes(damaged)
    with zipfile.ZipFile(folder / "bm25.npz", "w", zipfile.ZIP_STORED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    reseal(folder / "bm25.json")  # crafted: the hash matches, the header check must still hold
    with pytest.raises(DataFormatError, match="corrupt BM25 index arrays"):
        BM25Retriever.load(folder, passages)


def test_a_pickled_pytorch_model_bin_in_a_hf_folder_is_a_typed_error(tmp_path: Path) -> None:
    from searchgym.agents.grpo.export import load_policy
    from searchgym.agents.llm import tiny_causal_lm

    folder = tmp_path / "hf"
    tiny_causal_lm(512, layers=1, hidden=16).save_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _RunsCode(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot be loaded safely") as err:
        load_policy(folder)
    assert (
        "pytorch_model.bin" in str(err.value)
        or "UnpicklingError" in str(err.value)
        or "weights" in str(err.value)
    )
    assert not marker.exists()


def test_a_parquet_row_bomb_is_refused_before_its_rows_are_decoded(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from searchgym.data.searchr1 import read_searchr1

    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: where?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
        "extra_info": {"split": "test", "index": 0},
    }
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.Table.from_pylist([row] * 5000), path)  # identical rows compress to almost nothing
    assert path.stat().st_size < 20_000
    with pytest.raises(DataFormatError, match=r"holds 5,000 rows, more than the 1,000 searchgym reads"):
        read_searchr1(path, max_rows=1000)
    # Under the cap, the first duplicate fails at its row, in the first decoded batch.
    with pytest.raises(DataFormatError, match=r"bomb\.parquet:2: duplicate question id"):
        read_searchr1(path)


def test_an_unavailable_hub_tokenizer_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable,
        "-m",
        "searchgym.cli",
        "eval",
        "--agent",
        "random",
        "--episodes",
        "1",
        "--no-progress",
    ]
    proc = subprocess.run(
        [*argv, "--tokenizer", "no-such-org/no-such-tokenizer"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert "not available offline" in lines[0] and "no-such-org/no-such-tokenizer" in lines[0]


# -- 4. integrity ------------------------------------------------------------------------------------------------


def test_one_flipped_bit_in_bm25_json_is_refused(tmp_path: Path) -> None:
    folder, passages = bm25_index(tmp_path)
    text = (folder / "bm25.json").read_text()
    i = text.index('"k1": 0.9') + len('"k1": 0.')
    flipped = text[:i] + chr(ord(text[i]) ^ 1) + text[i + 1 :]  # 0.9 -> 0.8: still valid JSON, other scores
    (folder / "bm25.json").write_text(flipped)
    assert json.loads(flipped)["params"]["k1"] == 0.8
    with pytest.raises(DataFormatError, match=r"bm25\.json: fails its checksum"):
        BM25Retriever.load(folder, passages)


def test_dense_files_are_checked_by_hash_and_embeddings_for_non_finite_values(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    from searchgym.retrieval.dense import DenseRetriever

    dirs, passages = dense_dirs
    for kind, name in (("flat", "embeddings.npy"), ("hnsw", "index.faiss")):
        out = copy_dir(dirs[kind], tmp_path / f"flip-{kind}")
        data = bytearray((out / name).read_bytes())
        data[len(data) - 9] ^= 0x10  # same size: a size check alone would pass it
        (out / name).write_bytes(bytes(data))
        with pytest.raises(
            DataFormatError, match=rf"{name}: does not match the size and hash dense\.json records"
        ):
            DenseRetriever.load(out, passages)
    out = copy_dir(dirs["flat"], tmp_path / "nan")
    embeddings = np.load(out / "embeddings.npy")
    embeddings[123, 7] = np.nan
    np.save(out / "embeddings.npy", embeddings)
    reseal(out / "dense.json")  # a crafted index: the hash fits, the values do not
    with pytest.raises(DataFormatError, match=r"embeddings\.npy: holds a non-finite value"):
        DenseRetriever.load(out, passages)


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_path: Path) -> None:
    from searchgym.integrity import file_sha256

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 1000)
    reads: list[int] = []
    first = file_sha256(path, lambda offset, block: reads.append(len(block)), record=True)
    assert file_sha256(path, lambda offset, block: reads.append(len(block))) == first and reads == [1000]
    path.write_bytes(b"y" * 1000)  # same size, new content and modification time
    assert file_sha256(path, lambda offset, block: reads.append(len(block))) != first and reads == [
        1000,
        1000,
    ]


# -- 5. atomicity and concurrency --------------------------------------------------------------------------------


def test_a_bm25_write_killed_between_its_renames_is_refused_not_mixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchgym.retrieval.bm25_index as index_files

    folder, passages = bm25_index(tmp_path, k1=0.9)
    before = BM25Retriever.load(folder, passages).search(["alpha beta 3"], 3)
    real_replace = os.replace
    calls: list[str] = []

    def killed_after_the_first(src: Any, dst: Any) -> None:
        calls.append(str(dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here: new bm25.npz in place, bm25.json still the old one
        real_replace(src, dst)

    monkeypatch.setattr(index_files.os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        BM25Retriever(passages, k1=2.0).save(folder)
    monkeypatch.undo()
    assert calls[0].endswith("bm25.npz")
    with pytest.raises(DataFormatError, match=r"bm25\.npz: does not match .* different builds"):
        BM25Retriever.load(folder, passages)
    BM25Retriever(passages, k1=0.9).save(folder)  # rebuilding repairs it
    assert BM25Retriever.load(folder, passages).search(["alpha beta 3"], 3) == before


def dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_leftover_temp_files_of_dead_writers_are_removed(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    from searchgym.retrieval.dense import build_dense_index, tiny_encoder

    pid = dead_pid()
    folder, passages = bm25_index(tmp_path)
    stale = [f".bm25.json.{pid}", f".bm25.npz.{pid}.npz", f".bm25.json.{pid}.1a2b3c4d.tmp"]
    live = f".bm25.json.{os.getppid()}.1a2b3c4d.tmp"  # a live process's write is kept
    for name in (*stale, live, "notes.txt"):
        (folder / name).write_text("x")
    BM25Retriever(passages).save(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([live, "bm25.json", "bm25.npz", "notes.txt"])
    dirs, dense_passages = dense_dirs
    out = copy_dir(dirs["flat"], tmp_path / "dense")
    for name in (f".dense.building.json.{pid}.tmp", f".index.faiss.{pid}.tmp", f".dense.json.{pid}.cafe.tmp"):
        (out / name).write_text("x")
    build_dense_index(dense_passages, tiny_encoder(), out, progress=False)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_second_writer_of_the_same_out_file_is_refused(tmp_path: Path) -> None:
    from searchgym.data.jsonl import replace_on_success

    out = tmp_path / "t.jsonl"
    out.write_text("earlier\n")
    with replace_on_success(out) as partial:
        partial.write_text("first run\n")
        with pytest.raises(ConfigError, match=r"another run is writing .*t\.jsonl"), replace_on_success(out):
            pass
        assert out.read_text() == "earlier\n"
    assert out.read_text() == "first run\n"


def test_two_concurrent_eval_out_runs_lose_no_transcripts(tmp_path: Path) -> None:
    out = tmp_path / "transcripts.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "searchgym.cli", "eval", "--env", "SearchQAMacro-v0", "--agent", "random",
            "--episodes", "60", "--no-progress", "--out", str(out)]  # fmt: skip
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in results:
        assert code == 0 or "another run is writing" in err, err[-2000:]
    assert any(code == 0 for code, _ in results)
    lines = out.read_text().splitlines()
    assert len(lines) == 60 and all(json.loads(line) for line in lines)


def test_no_module_loads_sb3_files_through_stable_baselines3s_unpickling_loader() -> None:
    """``BaseAlgorithm.load`` and ``load_from_zip_file`` unpickle the zip's ``data``: never called."""
    import re

    pattern = re.compile(r"load_from_zip_file|cloudpickle|\b(PPO|A2C|DQN|ALGORITHMS\[[^\]]+\])\.load\(")
    hits = [
        path.relative_to(ROOT).as_posix()
        for folder in ("searchgym", "envs", "agents")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(
            "\n".join(line.split("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
        )
    ]
    assert hits == []


# -- 6. silent overwrites -----------------------------------------------------------------------------------------


def test_train_sb3_into_an_existing_run_is_refused_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stable_baselines3")
    from searchgym.cli import main

    out = tmp_path / "sb3"
    args = ["train", "sb3", "--algo", "a2c", "--timesteps", "16", "--eval-episodes", "0", "--out", str(out)]
    assert main(args) == 0
    stale = out / "checkpoints" / "a2c_999_steps.zip"  # a checkpoint of the earlier run
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"earlier run")
    before = (out / "model.zip").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err
    assert (out / "model.zip").read_bytes() == before and stale.exists()  # nothing touched
    assert main([*args, "--overwrite"]) == 0
    assert not stale.exists(), "the replaced run's checkpoints must not mix with the new run's"


def test_index_bm25_over_another_index_is_refused_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\nword{i} text'}) + "\n" for i in range(5))
    )
    out = tmp_path / "index"
    assert main(["index", "bm25", "--corpus", "world", "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["index", "bm25", "--corpus", str(corpus), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds files" in err and "bm25.json" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the world's index is untouched
    assert (
        main(["index", "bm25", "--corpus", str(corpus), "--out", str(out), "--overwrite", "--no-progress"])
        == 0
    )
    assert len(BM25Retriever.load(out, _passages_of(corpus)).passages) == 5


def _passages_of(corpus: Path) -> list[Passage]:
    from searchgym.data.flashrag import read_corpus

    return read_corpus(corpus)


# -- 8. the user's mistakes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["eval --agent oracle", "demos --out d.jsonl", "export-trajectories --out t.jsonl"]
)
@pytest.mark.parametrize("episodes", ["0", "-5"])
def test_episodes_below_one_is_a_usage_error(
    command: str, episodes: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--episodes", episodes])
    assert exit_info.value.code == 2
    assert f"--episodes: must be >= 1, got {episodes}" in capsys.readouterr().err


def test_more_episodes_than_questions_says_so_and_reports_distinct_questions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from searchgym.cli import main

    assert (
        main(
            [
                "eval",
                "--agent",
                "oracle",
                "--split",
                "validation",
                "--episodes",
                "1100",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    figures = json.loads(captured.out)
    assert figures["episodes"] == 1100 and figures["questions"] == 500
    assert "1100 episodes over the 500 questions of split 'validation'" in captured.err
    assert "2 or 3 times" in captured.err
    assert main(["eval", "--agent", "oracle", "--episodes", "20", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["questions"] == 20 and "note:" not in captured.err


def test_demos_beyond_the_split_say_that_questions_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.agents.demonstrations import read_demonstrations
    from searchgym.cli import main

    out = tmp_path / "d.jsonl"
    argv = ["demos", "--split", "validation", "--out", str(out)]
    assert main([*argv, "--episodes", "502"]) == 0
    err = capsys.readouterr().err
    assert "502 episodes over the 500 questions of split 'validation'" in err and "1 or 2 times" in err
    demos = read_demonstrations(out)
    assert len(demos) == 502 and demos[500].question_id == demos[0].question_id
    assert main([*argv, "--episodes", "500"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_eval_help_lists_every_agent_form(capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    agent_help = capsys.readouterr().out.split("--agent AGENT", 2)[-1].split("--episodes")[0]
    words = " ".join(agent_help.split())
    for form in ("random", "oracle", "heuristic", "checkpoint:PATH", "sb3:PATH", "package.module:Class"):
        assert form in words


GRPO_TINY = [
    "--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768", "--questions-per-step", "2",
    "--group-size", "2", "--minibatch-size", "2", "--eval-questions", "0", "--threads", "1", "--no-progress",
    "--no-tensorboard", "--probe-size", "0", "--onpolicy-probe-size", "0",
]  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_during_train_grpo_is_one_line_naming_the_checkpoint_and_the_resume_command(
    tmp_path: Path,
) -> None:
    import signal
    import time

    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "searchgym.cli",
        "train",
        "grpo",
        "--run-dir",
        str(run),
    ]
    cmd += [*GRPO_TINY, "--steps", "500", "--save-every", "1"]
    # As from a terminal: a parent started in the background without job control (a CI runner) hands its
    # children SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    checkpoint = run / "checkpoint.pt"
    deadline = time.monotonic() + 180
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists() and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # seen once in CI, not reproduced: keep what it was doing
        proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"train grpo still running 120 s after Ctrl-C; its threads:\n{err[-8000:]}")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith("searchgym: train grpo interrupted;") and str(checkpoint) in last
    saved = load_checkpoint(checkpoint)["step"]
    assert f"holds step {saved};" in last
    assert last.endswith(f"continue with: searchgym train grpo --run-dir {run} --resume")


@pytest.fixture
def python_sigint() -> Any:
    """SIGINT raises KeyboardInterrupt in this test, as in a terminal (a background CI start ignores it)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_inside_a_checkpoint_write_arrives_once_the_checkpoint_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_sigint: Any
) -> None:
    """Ctrl-C at a write of torch.save's zip writer, which torch turns into ``RuntimeError: ... unexpected
    pos``, still ends in the one-line interruption, not a traceback and exit 1."""
    import signal

    real_save = torch.save

    def save_hit_by_ctrl_c(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        writes = 0

        class Interrupted:  # the file torch.save writes through: Ctrl-C arrives at its third write
            def write(self, data: bytes) -> int:
                nonlocal writes
                writes += 1
                if writes == 3:
                    signal.raise_signal(signal.SIGINT)
                return int(f.write(data))

            def flush(self) -> None:
                f.flush()

        real_save(obj, Interrupted(), *args, **kwargs)
        assert writes > 3

    monkeypatch.setattr(torch, "save", save_hit_by_ctrl_c)
    path = tmp_path / "checkpoint.pt"
    payload = {"step": 7, "weights": torch.ones(64)}
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, payload)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # in place, no temporary left
    loaded = torch.load(path, weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["weights"], payload["weights"])


def test_sigint_held_delivers_drops_or_passes_through_as_the_handler_says(python_sigint: Any) -> None:
    import signal

    from searchgym.integrity import sigint_held

    finished = []
    with pytest.raises(KeyboardInterrupt), sigint_held():
        signal.raise_signal(signal.SIGINT)
        finished.append("block")  # the block runs to its end first
    assert finished == ["block"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with sigint_held():  # nothing received: nothing raised
        pass
    with pytest.raises(ValueError, match="own error"), sigint_held():
        raise ValueError("the block's own error")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an ignored Ctrl-C stays ignored
    with sigint_held():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_ctrl_c_messages_of_each_training_command(tmp_path: Path) -> None:
    import argparse

    from searchgym.cli._common import interrupted_message

    def message(*command: str, **fields: Any) -> str:
        return interrupted_message(argparse.Namespace(_command=command, run_dir=str(tmp_path), **fields))

    assert "before its first checkpoint; nothing to resume" in message("train", "grpo", resume=False)
    assert message("train", "sft").endswith(
        f"start again with: searchgym train sft --run-dir {tmp_path} --overwrite ..."
    )
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    trl = message("train", "trl", resume=False)
    assert f"newest checkpoint is {tmp_path / 'checkpoint-10'};" in trl
    assert trl.endswith(f"continue with: searchgym train trl --run-dir {tmp_path} --resume")
    assert interrupted_message(argparse.Namespace(_command=("eval",))) == "searchgym: eval interrupted"


def test_an_exported_folder_plays_exactly_as_its_checkpoint(tmp_path: Path) -> None:
    from searchgym.cli import main

    sft = tmp_path / "sft"
    sizes = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768"]
    args = ["train", "sft", "--run-dir", str(sft), *sizes, "--demo-episodes", "8", "--epochs", "1"]
    assert main([*args, "--eval-questions", "0", "--threads", "1", "--no-progress", "--no-tensorboard"]) == 0
    assert main(["export", str(sft / "checkpoint.pt"), str(tmp_path / "hf")]) == 0
    note = json.loads((tmp_path / "hf" / "searchgym_export.json").read_text())
    assert note["env"] == {"max_turn_tokens": 8, "max_context_tokens": 768}
    transcripts = {}
    for name, agent in (("ckpt", sft / "checkpoint.pt"), ("hf", tmp_path / "hf")):
        out = tmp_path / f"{name}.jsonl"
        assert main(["eval", "--agent", f"checkpoint:{agent}", "--max-turns", "2", "--episodes", "6",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
        transcripts[name] = [json.loads(line) for line in out.read_text().splitlines()]
    strip = ("seconds", "agent")
    assert [{k: v for k, v in r.items() if k not in strip} for r in transcripts["hf"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in transcripts["ckpt"]
    ]


@pytest.mark.parametrize(
    "env", [{"max_turn_tokens": "abc"}, {"max_context_tokens": 10**12}, [], {"max_turn_tokens": 0}]
)
def test_a_bad_export_note_is_a_checkpoint_error(tmp_path: Path, env: Any) -> None:
    from searchgym.agents.grpo.export import export_env_sizes

    (tmp_path / "searchgym_export.json").write_text(json.dumps({"env": env}))
    with pytest.raises(CheckpointError, match=r"searchgym_export\.json"):
        export_env_sizes(tmp_path)
    (tmp_path / "searchgym_export.json").write_text('{"env": {"max_turn_tokens": 1' + "0" * 5000 + "}}")
    with pytest.raises(CheckpointError, match="not a readable export note"):
        export_env_sizes(tmp_path)


def test_every_test_docs_security_names_exists() -> None:
    """docs/security.md keeps each promise with the test that keeps it: a renamed or deleted test is caught."""
    import re

    named = set(re.findall(r"`(test_\w+)`", (ROOT / "docs" / "security.md").read_text(encoding="utf-8")))
    defined = {
        m
        for path in (ROOT / "tests").rglob("*.py")
        for m in re.findall(r"^def (test_\w+)", path.read_text(), re.M)
    }
    assert len(named) >= 30
    assert sorted(named - defined) == []
