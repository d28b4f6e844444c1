"""The verl integration on the CPU: the LLDS policy losses, the agent loop, the plugin, the early warning.

verl 0.9.1 pins transformers < 5.11, so these tests run in their own virtualenv (``make test-verl`` builds
``.venv-verl`` and sets ``SEARCHGYM_REQUIRE_VERL=1``, which turns a missing verl into a failure). In the
main virtualenv they are skipped with that reason.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if os.environ.get("SEARCHGYM_REQUIRE_VERL") != "1":
    pytest.importorskip(
        "verl", reason="verl pins transformers < 5.11: `make test-verl` runs these in .venv-verl"
    )

import gymnasium as gym  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import searchgym.envs  # noqa: E402 - registers SearchQA-v0
from searchgym.agents.grpo.config import LLDSConfig  # noqa: E402
from searchgym.agents.grpo.losses import grpo_llds_loss, llds_loss  # noqa: E402
from searchgym.agents.integrations.trajectories import EpisodeTokens, to_record  # noqa: E402
from searchgym.agents.integrations.verl import (  # noqa: E402
    LLDS_LOSS_MODES,
    LLDSPolicyLossConfig,
    SearchQAAgentLoop,
    displacement_metrics,
    install_lld_warning,
    response_advantages,
)
from searchgym.agents.integrations.verl_data import write_verl_parquet  # noqa: E402
from searchgym.envs import EnvSpec  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402
from searchgym.protocol import Source  # noqa: E402
from searchgym.tokenization import load_tokenizer  # noqa: E402

GATES = ("action", "response", "token")


# -- the policy losses ---------------------------------------------------------------------------------


def _actor_config(coef: float | None = 0.3, mode: str = "llds_action", **batch_info: Any) -> Any:
    policy = LLDSPolicyLossConfig(loss_mode=mode, llds_coef=coef) if coef is not None else None
    kwargs = {"policy_loss": policy} if policy is not None else {}
    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, **kwargs)
    config.global_batch_info.update(batch_info)
    return config


def _batch(seed: int = 0) -> dict[str, Any]:
    """4 responses of 12 tokens: policy runs split by tool tokens (0 in the mask), padding at the end."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0],
            [1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        ]
    )
    per_response = torch.tensor([0.8, 0.0, -0.6, 1.2])
    old = -torch.rand(mask.shape, generator=g) * 2 - 0.1
    # Ratios within [0.5, 2]: inside verl's dual clip (3) and searchgym's ratio cap (100).
    logp = (old + (torch.rand(mask.shape, generator=g) - 0.5) * 0.6).requires_grad_(True)
    return {
        "old_log_prob": old,
        "log_prob": logp,
        "advantages": per_response[:, None] * mask,  # what verl's grpo estimator hands the loss
        "response_mask": mask.bool(),
        "per_response": per_response,
    }


def _grad(loss: Any, x: Any) -> Any:
    (g,) = torch.autograd.grad(loss, x)
    return g


def test_the_three_modes_are_registered_under_their_names() -> None:
    assert LLDS_LOSS_MODES == {"llds_action": "action", "llds_response": "response", "llds_token": "token"}
    for mode in LLDS_LOSS_MODES:
        assert core_algos.get_policy_loss_fn(mode).__name__ == f"{mode}_policy_loss"


@pytest.mark.parametrize("gate", GATES)
def test_registered_loss_is_verl_vanilla_plus_lambda_llds(gate: str) -> None:
    b = _batch()
    config = _actor_config(0.3)
    fn = core_algos.get_policy_loss_fn(f"llds_{gate}")
    args = (b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"])
    loss, metrics = fn(*args, loss_agg_mode="token-mean", config=config)
    vanilla, _ = core_algos.compute_policy_loss_vanilla(*args, loss_agg_mode="token-mean", config=config)
    term, ours = llds_loss(b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], gate)
    expected = vanilla + 0.3 * term
    assert float(term.detach()) > 0  # the hand-built batch lost likelihood somewhere: the test has teeth
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(_grad(loss, b["log_prob"]), _grad(expected, b["log_prob"]), rtol=0, atol=0)
    assert metrics["actor/llds_loss"] == ours["llds_loss"]
    assert metrics["actor/llds_gate_open"] == ours["llds_gate_open"]
    assert metrics["actor/llds_coef"] == 0.3


@pytest.mark.parametrize("gate", GATES)
def test_registered_loss_equals_searchgyms_grpo_llds_loss(gate: str) -> None:
    """Same objective as ``train grpo`` where verl's dual clip and searchgym's ratio cap are both inactive."""
    b = _batch(seed=1)
    fn = core_algos.get_policy_loss_fn(f"llds_{gate}")
    loss, _ = fn(
        b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], config=_actor_config(0.3)
    )
    llds = LLDSConfig(gate=gate, coef=0.3)
    ours, _ = grpo_llds_loss(
        b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], llds=llds
    )
    torch.testing.assert_close(loss, ours)
    torch.testing.assert_close(_grad(loss, b["log_prob"]), _grad(ours, b["log_prob"]))


@pytest.mark.parametrize("gate", GATES)
def test_env_token_gradients_are_exactly_zero(gate: str) -> None:
    b = _batch(seed=2)
    fn = core_algos.get_policy_loss_fn(f"llds_{gate}")
    loss, _ = fn(
        b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], config=_actor_config(1.0)
    )
    grad = _grad(loss, b["log_prob"])
    assert bool((grad[~b["response_mask"]] == 0).all())
    assert bool((grad[b["response_mask"]] != 0).any())


def test_llds_uses_verls_global_token_count() -> None:
    """Under data parallelism the term is divided like verl's token-mean: batch_num_tokens / dp_size."""
    b = _batch()
    config = _actor_config(0.5, dp_size=2, batch_num_tokens=60)
    args = (b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"])
    loss, _ = core_algos.get_policy_loss_fn("llds_action")(*args, config=config)
    vanilla, _ = core_algos.compute_policy_loss_vanilla(*args, loss_agg_mode="token-mean", config=config)
    term, _ = llds_loss(
        b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], num_tokens=30
    )
    torch.testing.assert_close(loss, vanilla + 0.5 * term, rtol=0, atol=0)


def test_verls_own_ppo_loss_call_site_runs_the_llds_mode() -> None:
    """Through ``verl.workers.utils.losses.ppo_loss``, the function verl's actor workers call per micro-batch."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    b = _batch(seed=3)
    batch, length, prompt = b["response_mask"].shape[0], b["response_mask"].shape[1], 2
    config = _actor_config(0.4, mode="llds_response")
    # The actor's model output: log-probs of the whole sequences, flattened (no padding), shifted by one.
    flat = torch.zeros(batch, prompt + length)
    flat[:, prompt - 1 : prompt - 1 + length] = b["log_prob"]
    data = tu.get_tensordict(
        tensor_dict={
            "prompts": torch.ones(batch, prompt, dtype=torch.long),
            "responses": torch.ones(batch, length, dtype=torch.long),
            "attention_mask": torch.ones(batch, prompt + length, dtype=torch.long),
            "response_mask": b["response_mask"].long(),
            "old_log_probs": b["old_log_prob"],
            "advantages": b["advantages"],
        },
        non_tensor_dict={"dp_size": 2, "batch_num_tokens": 64, "global_batch_size": 8},
    )
    loss, metrics = ppo_loss(config, {"log_probs": flat.reshape(-1)}, data)
    vanilla, _ = core_algos.compute_policy_loss_vanilla(
        b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], config=config
    )
    term, _ = llds_loss(
        b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], "response", None, 32
    )
    torch.testing.assert_close(loss, vanilla + 0.4 * term)
    torch.testing.assert_close(_grad(loss, b["log_prob"]), _grad(vanilla + 0.4 * term, b["log_prob"]))
    assert metrics["actor/llds_loss"].aggregate() == pytest.approx(float(term.detach()))


def test_logged_llds_loss_is_the_mini_batchs_term_after_verls_averaging() -> None:
    """verl averages metrics over micro-batches: two micro-batches through ppo_loss, aggregated as verl does,
    log the LLDS term of the whole mini-batch (what the update trained on), not half of it."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    b = _batch(seed=4)
    tokens = int(b["response_mask"].sum())
    config = _actor_config(0.4, mode="llds_token")
    logged = []
    for rows in (slice(0, 2), slice(2, 4)):
        mask, logp = b["response_mask"][rows], b["log_prob"][rows]
        n, length, prompt = mask.shape[0], mask.shape[1], 2
        flat = torch.zeros(n, prompt + length)
        flat[:, prompt - 1 : prompt - 1 + length] = logp.detach()
        data = tu.get_tensordict(
            tensor_dict={
                "prompts": torch.ones(n, prompt, dtype=torch.long),
                "responses": torch.ones(n, length, dtype=torch.long),
                "attention_mask": torch.ones(n, prompt + length, dtype=torch.long),
                "response_mask": mask.long(),
                "old_log_probs": b["old_log_prob"][rows],
                "advantages": b["advantages"][rows],
            },
            non_tensor_dict={"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": 4},
        )
        _, metrics = ppo_loss(config, {"log_probs": flat.reshape(-1)}, data)
        logged.append(metrics["actor/llds_loss"])
    logged[0].extend(logged[1])  # verl's accumulation over micro-batches, then its aggregate
    whole, _ = llds_loss(b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], "token")
    assert float(whole.detach()) > 0
    assert logged[0].aggregate() == pytest.approx(float(whole.detach()), rel=1e-6)


def test_lambda_defaults_to_the_papers_and_zero_leaves_verls_loss() -> None:
    b = _batch()
    args = (b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"])
    vanilla, _ = core_algos.compute_policy_loss_vanilla(*args, config=_actor_config(None))
    default, metrics = core_algos.get_policy_loss_fn("llds_token")(*args, config=_actor_config(None))
    term, _ = llds_loss(b["log_prob"], b["old_log_prob"], b["per_response"], b["response_mask"], "token")
    assert metrics["actor/llds_coef"] == 0.2
    torch.testing.assert_close(default, vanilla + 0.2 * term, rtol=0, atol=0)
    off, metrics = core_algos.get_policy_loss_fn("llds_token")(*args, config=_actor_config(0.0))
    torch.testing.assert_close(off, vanilla, rtol=0, atol=0)
    assert metrics["actor/llds_loss"] > 0  # still measured


def test_displacement_metrics_split_by_advantage_sign() -> None:
    b = _batch()
    shift = torch.where(b["response_mask"], 0.25, 0.0)
    # Responses 0 and 3 (A > 0) lost 0.25 per token, response 1 (A = 0) and 2 (A < 0) did not move.
    logp = b["old_log_prob"] - shift * torch.tensor([1.0, 0.0, 0.0, 1.0])[:, None]
    _, metrics = core_algos.get_policy_loss_fn("llds_action")(
        b["old_log_prob"], logp, b["advantages"], b["response_mask"], config=_actor_config()
    )
    assert (metrics["lld/n_adv_pos"], metrics["lld/n_adv_zero"], metrics["lld/n_adv_neg"]) == (2.0, 1.0, 1.0)
    assert metrics["lld/sum_delta_adv_pos"] == pytest.approx(-0.5)
    assert metrics["lld/sum_delta_adv_zero"] == 0.0 and metrics["lld/sum_delta_adv_neg"] == 0.0
    # What verl logs for the step: micro-batch means of sums and counts (one micro-batch without A < 0).
    step = {
        f"actor/{k}": (v + (0.0 if "neg" in k else v)) / 2 for k, v in metrics.items() if k.startswith("lld/")
    }
    delta = displacement_metrics(step)
    assert delta["lld/delta_adv_pos"] == pytest.approx(-0.25) and delta["lld/delta_adv_neg"] == 0.0
    assert displacement_metrics({"actor/lld/n_adv_pos": 0.0})["lld/delta_adv_pos"] != 0.0  # nan: no data


def test_per_token_advantages_are_refused() -> None:
    b = _batch()
    gae = b["advantages"] + torch.linspace(0, 0.1, 12)
    with pytest.raises(ConfigError, match="outcome estimator"):
        core_algos.get_policy_loss_fn("llds_action")(
            b["old_log_prob"], b["log_prob"], gae, b["response_mask"], config=_actor_config()
        )
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert response_advantages(torch.zeros(2, 3), empty).tolist() == [0.0, 0.0]


def test_lambda_is_llds_configs_coef_its_default_and_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchgym.agents.grpo.config import LLDSConfig

    default = LLDSPolicyLossConfig(loss_mode="llds_response")
    assert default.llds_coef == LLDSConfig().coef
    assert default.llds == LLDSConfig(gate="response", coef=LLDSConfig().coef)
    assert LLDSPolicyLossConfig(llds_coef=0.5).llds == LLDSConfig(gate=None, coef=0.5)  # a mode of verl's own
    with pytest.raises(ConfigError, match=r"llds_coef must be >= 0.0, got -1.0"):
        LLDSPolicyLossConfig(llds_coef=-1.0)

    def refused(self: LLDSConfig) -> None:
        raise ConfigError(f"LLDSConfig refuses {self.coef}")

    source = inspect.getsource(LLDSPolicyLossConfig)
    assert not re.search(r"llds_coef\s*:\s*float\s*=\s*[\d.]", source)  # the default is not written again
    monkeypatch.setattr(LLDSConfig, "__post_init__", refused)
    with pytest.raises(ConfigError, match=r"LLDSConfig refuses 0\.3"):  # the check is LLDSConfig's
        LLDSPolicyLossConfig(llds_coef=0.3)


def test_lambda_reaches_the_actor_through_verls_own_config_composition() -> None:
    """The documented overrides, composed by Hydra from verl's ppo_trainer.yaml as main_ppo does."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                "actor_rollout_ref.actor.policy_loss._target_=searchgym.agents.integrations.verl.LLDSPolicyLossConfig",
                "actor_rollout_ref.actor.policy_loss.loss_mode=llds_response",
                "+actor_rollout_ref.actor.policy_loss.llds_coef=0.3",
                "+actor_rollout_ref.actor.policy_loss.lld_warning_window=5",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=5",
            ],
        )
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, LLDSPolicyLossConfig)
    assert (actor.policy_loss.loss_mode, actor.policy_loss.llds_coef) == ("llds_response", 0.3)
    assert actor.policy_loss.lld_warning_window == 5
    with pytest.raises(ConfigError, match="llds_coef"):
        LLDSPolicyLossConfig(llds_coef=-1.0)


ROOT = Path(__file__).resolve().parents[3]


def _documented_launch_overrides() -> list[str]:
    import shlex

    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    start = text.index("\npython -m verl.trainer.main_ppo") + 1
    command = text[start : text.index("```", start)].replace("\\\n", " ")
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return words[3:]


def _smoke_script_overrides(out: str, model: str) -> list[str]:
    """The main_ppo overrides of scripts/verl_smoke.sh, with its variables at the given values."""
    import shlex

    text = (ROOT / "scripts" / "verl_smoke.sh").read_text(encoding="utf-8")
    start = text.index("\npython -m verl.trainer.main_ppo") + 1
    command = text[start : text.index('"$@"', start)].replace("\\\n", " ")
    command = command.replace("$OUT", out).replace("$MODEL", model).replace("$GPUS", "1")
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return words[3:]


def test_the_documented_launch_command_composes_with_verls_config() -> None:
    """Every override of docs/scale.md's main_ppo command exists in verl 0.9.1 and reaches the actor."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    overrides = _documented_launch_overrides()
    assert len(overrides) > 30
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, LLDSPolicyLossConfig)
    assert actor.policy_loss.loss_mode in LLDS_LOSS_MODES and actor.policy_loss.llds_coef == 0.2
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.calculate_log_probs
    # LLDS acts only with several updates per rollout batch.
    assert cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size > 1
    assert cfg.trainer.use_v1 is False  # verl's default v1 trainer needs transfer_queue (see below)


def test_the_smoke_script_composes_and_its_data_step_runs(tmp_path: Path) -> None:
    """scripts/verl_smoke.sh: its prepare step works here, its overrides compose with verl 0.9.1's config."""
    import shlex

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    text = (ROOT / "scripts" / "verl_smoke.sh").read_text(encoding="utf-8")
    assert (
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / "verl_smoke.sh")], check=False).returncode == 0
    )
    prepare = text[text.index("searchgym prepare verl") :].split("\n\n", 1)[0].replace("\\\n", " ")
    prepare = prepare.replace('"$OUT', f'"{tmp_path}').replace("--limit 256", "--limit 4")
    done = subprocess.run(
        [sys.executable, "-m", "searchgym.app.cli", *shlex.split(prepare)[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    overrides = _smoke_script_overrides(str(tmp_path), "Qwen/Qwen2.5-0.5B")
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "llds_action" and actor.policy_loss.llds_coef == 0.2
    assert cfg.trainer.total_training_steps == 10 and cfg.trainer.use_v1 is False
    assert Path(cfg.data.train_files).is_file()
    # 16 questions x n 4 in mini-batches of 4 questions: 4 updates per step, so LLDS acts.
    assert cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4


def test_the_v0_trainer_starts_without_transfer_queue() -> None:
    """searchgym[verl] does not install transfer_queue, which verl 0.9.1's default v1 trainer imports; the
    trainer.use_v1=False path imports without it (a fresh process, as main_ppo would)."""
    code = (
        "import importlib.util\n"
        "assert importlib.util.find_spec('transfer_queue') is None\n"
        "from verl.trainer.main_ppo_v0 import TaskRunner\n"
        "print('v0 ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd="/")
    assert out.returncode == 0 and "v0 ok" in out.stdout, out.stderr[-3000:]


# -- the plugin and the early warning ------------------------------------------------------------------


def test_prepare_verl_checks_that_the_plugin_loads(tmp_path: Path, capsys: Any) -> None:
    from searchgym.agents.integrations.verl_data import check_verl_plugin
    from searchgym.app.cli import main

    assert check_verl_plugin() is None  # installed, and it imports
    assert main(["prepare", "verl", "--out", str(tmp_path), "--limit", "2"]) == 0
    assert "not registered" not in capsys.readouterr().err


def test_plugin_is_discovered_in_a_fresh_process_by_import_verl() -> None:
    code = (
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "print(sorted(k for k in POLICY_LOSS_REGISTRY if k.startswith('llds')))\n"
        "print(_agent_loop_registry['searchgym']['_target_'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env=env,
        timeout=300,
    ).stdout.split("\n")
    assert out[0] == "['llds_action', 'llds_response', 'llds_token']"
    assert out[1] == "searchgym.agents.integrations.verl.SearchQAAgentLoop"


class _Recorder:
    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append(data)


def test_lld_warning_is_added_to_verls_logged_metrics() -> None:
    from verl.utils.tracking import Tracking

    install_lld_warning()  # already done by the plugin: idempotent
    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"policy_loss": {"lld_warning_window": 2}}}})
    tracker = Tracking("p", "e", default_backend=[], config=config)
    recorder = _Recorder()
    tracker.logger["recorder"] = recorder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, value in enumerate([0.1, -0.2, None, -0.1, -0.3, -0.4], start=1):
            # As the trainer logs the LLDS losses' metrics (an "actor/" prefix); no A > 0 response at step 3.
            n = 0.0 if value is None else 2.0
            tracker.log(
                {"actor/lld/n_adv_pos": n, "actor/lld/sum_delta_adv_pos": n * (value or 0), "x": 1.0}, step
            )
        tracker.log({"x": 2.0}, 7)
    assert [d.get("lld/warning") for d in recorder.logged] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, None]
    assert [d.get("lld/delta_adv_pos") for d in recorder.logged][:2] == [
        pytest.approx(0.1),
        pytest.approx(-0.2),
    ]
    assert sum("LLD early warning" in str(w.message) for w in caught) == 1


# -- the agent loop ------------------------------------------------------------------------------------

ENV = {"max_turn_tokens": 40, "max_context_tokens": 1024, "topk": 2, "max_turns": 3}


class ScriptedServer:
    """A fake ``server_manager``: returns the scripted segments in order, with made-up log-probs."""

    def __init__(self, segments: list[list[int]]) -> None:
        self.segments = list(segments)
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ):
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **sampling_params})
        ids = self.segments.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.01 * (i + 1) for i in range(len(ids))])


@pytest.fixture(scope="module")
def hf_tok() -> Any:
    return load_tokenizer(None).to_transformers()


def _agent_loop(server: Any, hf_tok: Any, rollout_name: str = "vllm", **env: Any) -> SearchQAAgentLoop:
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"name": rollout_name, "prompt_length": 512, "response_length": 768}
            }
        }
    )
    return SearchQAAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=hf_tok,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        env=env or None,
    )


def _script(tok: Any, question: Any) -> list[list[int]]:
    # Text after each closing tag: the env must cut the turn there, not where the server stopped.
    first = f"<think>look it up</think> <search> {question.question} </search> then more words"
    second = f"<think>found</think> <answer> {question.golden_answers[0]} </answer> and trailing text"
    return [tok.encode(first), tok.encode(second)]


def _play_in_gym(tok: Any, question_id: str, segments: list[list[int]]) -> tuple[Any, float, list[int]]:
    env = gym.make("SearchQA-v0", tokenizer=tok, **ENV)
    obs, _ = env.reset(options={"question_id": question_id})
    reward, consumed = 0.0, []
    for segment in segments:
        for n, token in enumerate(segment, start=1):
            obs, r, terminated, truncated, info = env.step(token)
            reward += float(r)
            if info.get("turn_end") or terminated or truncated:
                consumed.append(n)
                break
    env.close()
    return obs, reward, consumed


def test_agent_loop_reproduces_the_gymnasium_episode_token_for_token(hf_tok: Any) -> None:
    tok = load_tokenizer(hf_tok)
    question = searchgym.envs.SearchQAEnv(tokenizer=tok, **ENV).questions[0]
    segments = _script(tok, question)
    server = ScriptedServer(segments)
    loop = _agent_loop(server, hf_tok)
    extra = {"question_id": question.id, "searchgym_env": json.dumps({**ENV, "split": "train"})}
    out: AgentLoopOutput = asyncio.run(
        loop.run({"temperature": 1.0, "logprobs": True}, extra_info=extra, raw_prompt=[])
    )

    obs, reward, consumed = _play_in_gym(tok, question.id, segments)
    n = int(obs["length"][0])
    tokens, sources = obs["tokens"][:n].tolist(), obs["sources"][:n]
    prompt_len = int((sources == Source.PROMPT).sum())
    assert out.prompt_ids == tokens[:prompt_len]
    assert out.response_ids == tokens[prompt_len:]
    assert out.response_mask == (sources[prompt_len:] == Source.POLICY).astype(int).tolist()
    assert 0 in out.response_mask  # the search results are in the response, masked out
    assert reward == 1.0 and out.reward_score == reward
    assert out.extra_fields["reward_extra_info"] == {"em": 1.0, "f1": 1.0, "searches": 1.0}
    # Log-probs: the server's, for the tokens the env kept; 0.0 on tool tokens.
    expected_lp = [-0.01 * (i + 1) for c in consumed for i in range(c)]
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == expected_lp
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m)
    assert consumed[0] < len(segments[0]) and consumed[1] < len(segments[1])  # the cut was exercised
    # Each turn was generated on the exact transcript so far, in one sticky session, within the budget.
    assert server.calls[0]["prompt_ids"] == out.prompt_ids
    first_tool = out.response_mask.index(0)
    second_turn = out.response_mask.index(1, first_tool)
    assert server.calls[1]["prompt_ids"] == tokens[: prompt_len + second_turn]
    assert len({c["request_id"] for c in server.calls}) == 1
    assert all(c["max_tokens"] == ENV["max_turn_tokens"] for c in server.calls)
    assert server.calls[0]["stop"] == ["</search>", "</answer>"]
    # verl's own conversion accepts it.
    tensors = out.as_dict()
    assert tensors["responses"].shape == tensors["response_mask"].shape == tensors["rollout_log_probs"].shape
    assert float(tensors["rm_scores"][-1]) == 1.0


class TinyModelServer:
    """A fake ``server_manager`` that samples from a tiny causal LM built from a transformers config."""

    def __init__(self, vocab: int, eos: int, pad: int) -> None:
        from searchgym.agents.llm import tiny_causal_lm

        self.vocab = vocab
        self.model = tiny_causal_lm(vocab, layers=1, hidden=32, seed=0, eos_token_id=eos, pad_token_id=pad)
        self.generator = torch.Generator().manual_seed(0)
        self.segments: list[list[int]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ):
        ids, out, lps = list(prompt_ids), [], []
        with torch.no_grad():
            for _ in range(int(sampling_params["max_tokens"])):
                logits = self.model(torch.tensor([ids])).logits[0, -1, : self.vocab].float()
                logp = torch.log_softmax(logits, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                ids.append(token)
                out.append(token)
                lps.append(float(logp[token]))
        self.segments.append(out)
        return TokenOutput(token_ids=out, log_probs=lps)


def test_agent_loop_with_a_tiny_model_keeps_tokens_masks_and_logprobs_aligned(hf_tok: Any) -> None:
    from searchgym.agents.llm import token_logprobs

    tok = load_tokenizer(hf_tok)
    settings = {**ENV, "max_turn_tokens": 8, "max_turns": 3}
    question = searchgym.envs.SearchQAEnv(tokenizer=tok, **settings).questions[2]
    server = TinyModelServer(tok.vocab_size, tok.eos_token_id, tok.pad_token_id)
    loop = _agent_loop(server, hf_tok, rollout_name="sglang")
    extra = {"question_id": question.id, "searchgym_env": json.dumps(settings)}
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info=extra, raw_prompt=[]))

    env = gym.make("SearchQA-v0", tokenizer=tok, **settings)
    obs, _ = env.reset(options={"question_id": question.id})
    reward, done = 0.0, False
    for segment in server.segments:
        for token in segment:
            obs, r, terminated, truncated, info = env.step(token)
            reward += float(r)
            done = terminated or truncated
            if info.get("turn_end") or done:
                break
    assert done
    n = int(obs["length"][0])
    tokens, sources = obs["tokens"][:n].tolist(), obs["sources"][:n]
    p = len(out.prompt_ids)
    assert out.prompt_ids + out.response_ids == tokens
    assert out.response_mask == (sources[p:] == Source.POLICY).astype(int).tolist()
    assert 0 in out.response_mask and out.reward_score == reward
    # The log-probs sit on the tokens they belong to: re-scoring the transcript gives the same numbers.
    ids = torch.tensor([tokens])
    rescored, _ = token_logprobs(server.model, ids, torch.ones_like(ids), vocab_size=tok.vocab_size)
    mask = torch.tensor(out.response_mask, dtype=torch.bool)
    got = torch.tensor(out.response_logprobs)
    torch.testing.assert_close(got[mask], rescored[0, p:][mask].float(), atol=1e-4, rtol=1e-4)
    assert bool((got[~mask] == 0).all())


def test_verls_agent_loop_worker_plays_prepared_rows(tmp_path: Path, hf_tok: Any) -> None:
    """verl's own AgentLoopWorker.generate_sequences on `searchgym prepare verl` rows, a tiny model behind a
    fake server: log-probs equal a re-scoring, tool tokens are masked out, rewards land in rm_scores."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from searchgym.agents.llm import token_logprobs

    tok = load_tokenizer(hf_tok)
    first = searchgym.envs.SearchQAEnv(tokenizer=tok).questions[0]

    class Server(TinyModelServer):
        """Samples the tiny model, except that it answers the first question right (scored by the model)."""

        async def generate(
            self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
        ) -> Any:
            if first.question not in tok.decode(prompt_ids):
                return await super().generate(
                    request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
                )
            answer = tok.encode(f" <answer> {first.golden_answers[0]} </answer>")
            ids = torch.tensor([prompt_ids + answer])
            with torch.no_grad():
                lps, _ = token_logprobs(self.model, ids, torch.ones_like(ids), vocab_size=tok.vocab_size)
            self.segments.append(answer)
            return TokenOutput(token_ids=answer, log_probs=lps[0, -len(answer) :].tolist())

    server = Server(tok.vocab_size, tok.eos_token_id, tok.pad_token_id)
    model_dir = tmp_path / "model"  # what actor_rollout_ref.model.path names: config and tokenizer
    server.model.save_pretrained(str(model_dir))
    hf_tok.save_pretrained(str(model_dir))
    settings = {**ENV, "max_turn_tokens": 16, "max_turns": 3, "max_context_tokens": 640}
    paths = write_verl_parquet(tmp_path / "data", EnvSpec(**settings), ["train"], limit=3)
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                f"data.train_files={paths['train']}",
                "data.max_prompt_length=256",
                "data.max_response_length=384",
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "trainer.use_v1=False",
            ],
        )
    dataset = RLHFDataset(str(paths["train"]), hf_tok, config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(3)]))
    worker = AgentLoopWorker(config, server)
    out = asyncio.run(worker.generate_sequences(batch))

    assert len(out) == 3 and len(server.segments) >= 3
    rewards, tool_tokens = [], 0
    for row in range(3):
        attention = out.batch["attention_mask"][row].bool()
        ids = out.batch["input_ids"][row][attention]
        width = out.batch["responses"].shape[1]
        n = int(attention[-width:].sum())
        mask = out.batch["response_mask"][row, :n].bool()
        got = out.batch["rollout_log_probs"][row, :n]
        # Re-scoring the whole transcript gives back the rollout log-probs on the policy's tokens.
        one = ids[None]
        rescored, _ = token_logprobs(server.model, one, torch.ones_like(one), vocab_size=tok.vocab_size)
        torch.testing.assert_close(got[mask], rescored[0, -n:][mask].float(), atol=1e-4, rtol=1e-4)
        # Replaying the policy's tokens through the Gymnasium env rebuilds the transcript, tool tokens and all.
        question = str(batch.non_tensor_batch["extra_info"][row]["question_id"])
        env = gym.make("SearchQA-v0", tokenizer=tok, **settings)
        obs, _ = env.reset(options={"question_id": question})
        reward = 0.0
        for token in out.batch["responses"][row, :n][mask].tolist():
            obs, r, terminated, truncated, _ = env.step(token)
            reward += float(r)
        assert terminated or truncated
        length = int(obs["length"][0])
        assert obs["tokens"][:length].tolist() == ids.tolist()
        sources = obs["sources"][:length][-n:]
        assert mask.tolist() == (sources == Source.POLICY).tolist()  # 0 exactly on tool tokens
        assert float(out.batch["rm_scores"][row].sum()) == reward
        assert float(out.batch["rm_scores"][row, n - 1]) == reward  # at the last response token
        rewards.append(reward)
        tool_tokens += int((~mask).sum())
    assert rewards[0] == 1.0 and tool_tokens > 0  # the checks above had something to check


def test_agent_loop_overrides_and_bad_rows(hf_tok: Any) -> None:
    tok = load_tokenizer(hf_tok)
    question = searchgym.envs.SearchQAEnv(tokenizer=tok, **ENV).questions[1]
    server = ScriptedServer(_script(tok, question))
    # Loop-level settings win over the row's; no stop strings for a backend other than vLLM.
    loop = _agent_loop(server, hf_tok, rollout_name="sglang", max_turn_tokens=30)
    extra = {"question_id": question.id, "searchgym_env": json.dumps(ENV)}
    out = asyncio.run(loop.run({}, extra_info=extra, raw_prompt=[]))
    assert all(c["max_tokens"] == 30 and "stop" not in c for c in server.calls)
    assert out.response_logprobs is not None and out.num_turns >= 4
    short = _agent_loop(server, hf_tok)
    short.prompt_length = 10
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length"):
        asyncio.run(short.run({}, extra_info=extra, raw_prompt=[]))
    with pytest.raises(ConfigError, match="prepare verl"):
        asyncio.run(loop.run({}, extra_info={"index": 0}, raw_prompt=[]))
    with pytest.raises(ConfigError, match="unknown SearchQA settings"):
        asyncio.run(
            loop.run({}, extra_info={"question_id": "x", "searchgym_env": '{"nope": 1}'}, raw_prompt=[])
        )


# -- the data and the trajectories ---------------------------------------------------------------------


def test_prepared_parquet_is_read_by_verls_rlhf_dataset(tmp_path: Path, hf_tok: Any) -> None:
    from verl.utils.dataset.rl_dataset import RLHFDataset

    paths = write_verl_parquet(tmp_path, EnvSpec(**ENV, retriever="bm25"), ["train", "test"], limit=4)
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 512,
            "filter_overlong_prompts": False,
            "cache_dir": str(tmp_path),
        }
    )
    data = RLHFDataset(str(paths["train"]), hf_tok, config)
    assert len(data) == 4
    row = data[2]
    assert row["agent_name"] == "searchgym" and row["index"] == 2
    assert row["raw_prompt"][0]["role"] == "user" and "Question:" in row["raw_prompt"][0]["content"]
    assert json.loads(row["extra_info"]["searchgym_env"])["split"] == "train"
    assert row["extra_info"]["question_id"] == searchgym.envs.SearchQAEnv(**ENV).questions[2].id


def test_exported_verl_trajectories_are_verl_agent_loop_outputs(tmp_path: Path) -> None:
    """``searchgym export-trajectories --format verl`` rows, read back, convert with verl's own code."""
    from searchgym.agents.integrations.export import export_trajectories
    from searchgym.agents.integrations.trajectories import iter_jsonl

    path = tmp_path / "traj.jsonl"
    env = {"max_turn_tokens": 8, "max_turns": 2, "max_context_tokens": 768, "topk": 2}
    assert export_trajectories(path, fmt="verl", episodes=4, group_size=2, batch=4, spec=EnvSpec(**env)) == 4
    for record in iter_jsonl(path):
        out = AgentLoopOutput(**record)  # the line as it is: every field is one of AgentLoopOutput's
        assert out.model_dump(exclude_unset=True).keys() == record.keys()
        assert out.extra_fields["reward_extra_info"]["em"] == record["extra_fields"]["em"]
        tensors = out.as_dict()
        assert (
            tensors["responses"].shape == tensors["response_mask"].shape == tensors["rollout_log_probs"].shape
        )
        assert set(tensors["response_mask"].tolist()) <= {0, 1} and 0 in tensors["response_mask"].tolist()
        assert float(tensors["rm_scores"].sum()) == record["reward_score"]


def test_verl_trajectory_records_build_verls_agent_loop_output() -> None:
    episode = EpisodeTokens(
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9, 10, 11, 12],
        response_mask=[1, 1, 0, 0, 1],
        response_logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0],
        reward=1.0,
        info={"em": 1.0},
    )
    record = to_record(episode, "verl")
    loop_output = AgentLoopOutput(**record)
    assert loop_output.num_turns == 4  # prompt, policy, tool, policy: as the searchgym agent loop counts
    out = loop_output.as_dict()
    assert out["responses"].tolist() == [8, 9, 10, 11, 12]
    assert out["response_mask"].tolist() == [1, 1, 0, 0, 1]
    torch.testing.assert_close(out["rollout_log_probs"], torch.tensor([-0.5, -0.25, 0.0, 0.0, -1.0]))
    assert out["rm_scores"].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert np.array_equal(out["prompts"].numpy(), [5, 6, 7])
