"""The GRPO trainer's numerics, pinned: three steps of a small fixed configuration (LLDS, SAPO, KL, entropy,
oracle and on-policy probes, the ledger and ledger-LLDS, a final greedy evaluation) from a fixture
checkpoint, every logged metric compared with committed values.

Every metric of ``metrics.jsonl`` except ``time/*`` (wall clock) must equal its value in
``grpo_numerics_expected.json`` within 1e-9, at every step (0 to 3), and the set of metrics must be the same.
A refactoring of the trainer passes unchanged; a change that moves a number fails here (the planted changes
below show that it does), and the new values are written with

    .venv/bin/python tests/agents/grpo/test_grpo_numerics.py --write

(which says in its output what changed; the reason belongs in the commit; without ``--write`` it only
compares).

The pin means the same on every CPU. The run is in float64 (``--dtype float64``: weights drawn, trained and
scored in float64, sampling probabilities included): two CPU instruction sets (AVX-512, AVX2, torch's scalar
``default`` kernels) round float64 kernels differently by about 1e-15, far too little to move a sampled
token, so every CPU draws the same tokens and every metric agrees to about 1e-14 (measured under all three
``ATEN_CPU_CAPABILITY`` settings; ``make test-portable`` runs it under each). In float32 the same rounding
differences (about 1e-7) flip a sample within a step and every later number moves. The tolerance, 1e-9, is
five orders of magnitude above that agreement and far below what a change of the maths moves.

The fixture checkpoint is built inside the test instead of being committed: a two-answer dataset (one
question text, "What does the coin show?", whose golden answer is "yes" or "no" by question), a tiny model
(1 layer, hidden 32) at seeded random weights, and 128 supervised updates on the oracle's demonstrations
(search "Coin", read the passage, answer). Each of these is a deterministic function of its seed on one
thread; built, it costs a few seconds and no binary in the repository. The policy it gives searches once and
answers "yes" or "no" about half and half, so groups have mixed rewards at temperature 1: advantages, LLDS's
gates, SAPO, the on-policy probes and the ledger all see non-trivial values.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

EXPECTED = Path(__file__).with_name("grpo_numerics_expected.json")
TOLERANCE = 1e-9

CPU_KERNELS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
"""The environment that limits torch (and MKL and oneDNN) to AVX2 kernels, or to torch's scalar ones."""

PASSAGES = (
    ("coin", "Coin", "The coin lands on yes or on no, never on its edge."),
    ("moon", "Moon", "The moon is far away and made of rock."),
    ("river", "River", "The river runs to the sea through the valley."),
    ("tree", "Tree", "The tree grows tall in the old forest."),
)
SPLITS = {"train": 64, "validation": 16, "test": 16}
MODEL = {
    "dtype": "float64",
    "tiny_layers": 1,
    "tiny_hidden": 32,
    "max_turns": 3,
    "max_turn_tokens": 16,
    "max_context_tokens": 256,
}
"""The fixture model and the episodes it plays (the same in the warm-start and in GRPO)."""

GRPO: dict[str, Any] = {
    "steps": 3,
    "seed": 0,
    "lr": 1e-3,
    "questions_per_step": 4,
    "group_size": 4,
    "minibatch_size": 4,  # four updates a step: LLDS and SAPO act from the second
    "llds": "action",
    "sapo_coef": 0.5,
    "kl_coef": 0.001,
    "entropy_coef": 0.001,
    "probe_size": 4,
    "onpolicy_probe_size": 4,
    "onpolicy_probe_episodes": 16,
    "probe_every": 1,
    "ledger_size": 8,
    "llds_ledger": True,
    "ledger_batch": 4,
    "eval_questions": 4,
    "eval_batch": 4,
    "eval_at_start": True,
    "save_every": 0,
    "threads": 1,
    "progress": False,
    "tensorboard": False,
}


def write_dataset(folder: Path) -> Path:
    """The two-answer FlashRAG dataset: question i of a split is answered "yes" when i is odd, else "no"."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for pid, title, text in PASSAGES:
            f.write(json.dumps({"id": pid, "contents": f'"{title}"\n{text}'}) + "\n")
    for split, n in SPLITS.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                record = {
                    "id": f"{split}-{i}",
                    "question": "What does the coin show?",
                    "golden_answers": ["yes" if i % 2 else "no"],
                    "metadata": {"supporting_passage_ids": ["coin"]},
                }
                f.write(json.dumps(record) + "\n")
    return folder


def fixture_checkpoint(folder: Path) -> tuple[Path, Path]:
    """``(dataset, checkpoint)``: the dataset and the warm-start GRPO starts from (see the module doc)."""
    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig

    dataset = write_dataset(folder / "coin")
    sft = SFTConfig(
        run_dir=str(folder / "sft"),
        dataset=str(dataset),
        seed=0,
        epochs=16,
        batch_size=8,
        lr=1e-2,
        warmup_steps=2,
        eval_questions=0,
        threads=1,
        progress=False,
        tensorboard=False,
        **MODEL,
    )
    train_sft(sft)
    return dataset, Path(sft.run.run_dir) / "checkpoint.pt"


def run_metrics(folder: Path) -> list[dict[str, Any]]:
    """The three GRPO steps from the fixture; each logged record without its wall-clock figures."""
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo

    dataset, checkpoint = fixture_checkpoint(folder)
    run_dir = folder / "grpo"
    train_grpo(GRPOConfig(run_dir=str(run_dir), dataset=str(dataset), init=str(checkpoint), **MODEL, **GRPO))
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in lines
        if line.strip()
    ]


def differences(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """Every way ``got`` departs from ``expected``: a step or a metric missing or extra, or a value more
    than :data:`TOLERANCE` away (relative to values above 1); NaN equals NaN."""
    out: list[str] = []
    if [r.get("step") for r in got] != [r.get("step") for r in expected]:
        return [f"steps {[r.get('step') for r in got]} != {[r.get('step') for r in expected]}"]
    for new, old in zip(got, expected, strict=True):
        step = old["step"]
        for key in sorted(set(new) ^ set(old)):
            out.append(f"step {step}: {key} only in the {'run' if key in new else 'expected values'}")
        for key in sorted(set(new) & set(old)):
            a, b = new[key], old[key]
            if isinstance(b, (int, float)) and isinstance(a, (int, float)):
                if not (
                    (math.isnan(a) and math.isnan(b))
                    or math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
                ):
                    out.append(f"step {step}: {key} = {a!r}, expected {b!r}")
            elif a != b:
                out.append(f"step {step}: {key} = {a!r}, expected {b!r}")
    return out


def test_the_fixture_exercises_what_the_numerics_pin(tmp_path: Path) -> None:
    """The pinned run is not a trivial one: mixed groups, LLDS and SAPO acting, probes and ledger filled."""
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    steps = [r for r in expected if r["step"] > 0]
    assert all(0 < r["rollout/reward"] < 1 for r in steps)
    assert any(r["train/llds_loss"] > 0 for r in steps)
    assert any(r["train/sapo_frac"] > 0 for r in steps)
    assert any(r.get("train/ledger_llds_loss", 0) > 0 for r in steps)
    assert all(math.isfinite(r["lld/probe_onpolicy_heldout"]) for r in expected)
    assert all(math.isfinite(r["lld/probe_logp"]) for r in expected)
    assert expected[-1]["lld/ledger_size"] > 0 and "eval/em" in expected[-1]


def test_three_grpo_steps_reproduce_the_committed_metrics(tmp_path: Path) -> None:
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    found = differences(run_metrics(tmp_path), expected)
    assert not found, (
        f"{len(found)} metric(s) moved; if intended, regenerate with "
        "`.venv/bin/python tests/agents/grpo/test_grpo_numerics.py --write` and give the reason in the commit:\n"
        + "\n".join(found[:40])
    )


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_the_pin_holds_under_another_cpu_kernel_set(isa: str) -> None:
    """The pinned run under torch's AVX2 or scalar kernels (and MKL's and oneDNN's matching limits) gives the
    committed values: the pin does not depend on the machine's instruction set (``make test-portable``)."""
    import os
    import subprocess

    env = os.environ | CPU_KERNELS[isa]
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"under {CPU_KERNELS[isa]}:\n{done.stderr[-4000:]}"


def _flipped_action_gate(d: Any, m: Any) -> Any:
    """LLDS's action gate with its sign planted wrong: open where the action *gained* likelihood."""
    from searchgym.agents.grpo.losses import _segment_sums, action_ids

    per_token, per_action = _segment_sums(d, action_ids(m))
    return ((per_token < 0) & m).to(d.dtype), per_action < 0, torch.ones_like(per_action, dtype=torch.bool)


def _clip_off_by_a_hundredth(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchgym.agents.grpo import losses

    original = losses.policy_loss

    def planted(logp: Any, logp_old: Any, advantages: Any, loss_mask: Any, clip_eps: float, **kw: Any) -> Any:
        return original(logp, logp_old, advantages, loss_mask, clip_eps + 0.01, **kw)

    monkeypatch.setattr(losses, "policy_loss", planted)


def _gate_sign_flipped(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchgym.agents.grpo import losses

    monkeypatch.setitem(losses._GATE_FNS, "action", _flipped_action_gate)


@pytest.mark.slow
@pytest.mark.parametrize(
    "plant", [_clip_off_by_a_hundredth, _gate_sign_flipped], ids=["clip+0.01", "gate-sign"]
)
def test_the_pin_fails_on_a_planted_change_of_the_maths(
    plant: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each planted change moves some metric by far more than the tolerance (and than any CPU's rounding)."""
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    plant(monkeypatch)
    found = differences(run_metrics(tmp_path), expected)
    assert found, "the pin did not see a planted change of the maths"


def test_differences_sees_a_moved_value_a_missing_metric_and_nan() -> None:
    base = [{"step": 1, "a": 1.0, "b": float("nan")}]
    assert differences([{"step": 1, "a": 1.0 + 5e-10, "b": float("nan")}], base) == []
    assert differences([{"step": 1, "a": 1.0 + 5e-8, "b": float("nan")}], base) == [
        "step 1: a = 1.00000005, expected 1.0"
    ]
    assert differences([{"step": 1, "a": 1.0}], base) == ["step 1: b only in the expected values"]
    assert differences([{"step": 1, "a": 1.0, "b": 0.0}], base) == ["step 1: b = 0.0, expected nan"]
    assert differences([{"step": 2, "a": 1.0, "b": 0.0}], base) == ["steps [2] != [1]"]


def _main(argv: list[str]) -> int:
    """Runs the pinned steps (in a temporary folder) and prints what differs from :data:`EXPECTED`; with
    ``--write``, writes the run's values into it. Exit status 1 when a value differs and nothing was written."""
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="searchgym-numerics-") as tmp:
        got = run_metrics(Path(tmp))
    changed = differences(got, json.loads(EXPECTED.read_text(encoding="utf-8"))) if EXPECTED.exists() else []
    print("\n".join(changed) if changed else "no metric moved", file=sys.stderr)
    if "--write" not in argv:
        return 1 if changed else 0
    EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {EXPECTED} ({len(got)} steps, {len(got[-1])} metrics at the last)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
