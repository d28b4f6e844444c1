"""The probe sets a GRPO run scores every step to watch likelihood displacement across steps.

* :func:`oracle_probe`: fixed correct transcripts from the oracle (or a demonstrations file). They come from
  the same generator as the supervised warm-start's demonstrations, so their fall mixes forgetting of SFT
  data with LLD.
* :func:`onpolicy_probes`: the *initial* policy's own correct samples, on training questions and on held-out
  questions the run never trains on — what the policy could already do, in its own words.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.errors import ConfigError

from ..training.rollout import (
    RolloutBatch,
    collect_rollouts,
    concat_batches,
    pad_transcripts,
    summarize_episodes,
)
from .config import ProbesConfig

__all__ = ["onpolicy_probe_note", "onpolicy_probes", "oracle_probe"]


def oracle_probe(probes: ProbesConfig, env_spec: EnvSpec, tokenizer: Any) -> RolloutBatch | None:
    """``probes.probe_size`` correct oracle transcripts (``probes.probe_demos``, else oracle episodes of the
    first questions of ``env_spec``, the training env), padded; ``None`` when ``probe_size`` is 0.

    Raises:
        ConfigError: no rewarded transcript was found.
    """
    if not probes.probe_size:
        return None
    from ..demonstrations import generate_demonstrations, read_demonstrations

    if probes.probe_demos is not None:
        demos = [d for d in read_demonstrations(probes.probe_demos) if d.reward > 0][: probes.probe_size]
    else:
        import gymnasium as gym

        import searchgym  # noqa: F401 - registers the env ids

        env = gym.make("SearchQA-v0", spec=env_spec, tokenizer=tokenizer)
        demos = []
        # Oracle episodes of the first training questions (the oracle fails when retrieval misses).
        for demo in generate_demonstrations(env, 4 * probes.probe_size, seed=0):
            if demo.reward > 0:
                demos.append(demo)
            if len(demos) == probes.probe_size:
                break
        env.close()
    if not demos:
        raise ConfigError("the probe set is empty: no rewarded transcript to score (set --probe-size 0)")
    tokens, mask, sources = pad_transcripts(
        [d.tokens for d in demos], [d.sources for d in demos], tokenizer.pad_token_id
    )
    n = len(demos)
    return RolloutBatch(
        tokens, mask, sources, torch.zeros(tokens.shape), torch.ones(n), [{} for _ in range(n)]
    )


def onpolicy_probe_note(probes: ProbesConfig, run_episodes: int) -> str | None:
    """The line a run prints before it samples its on-policy probes, when they sample more episodes than the
    run trains on (a short run then spends most of its time on them); ``None`` otherwise.

    Args:
        probes: The run's probe options.
        run_episodes: Episodes the run trains on (steps x questions per step x group size).
    """
    if not probes.onpolicy_probe_size:
        return None
    budget = probes.onpolicy_probe_episodes or 4 * probes.onpolicy_probe_size
    if 2 * budget <= run_episodes:
        return None
    return (
        f"searchgym: before step 1, the on-policy probes sample up to {2 * budget} episodes ({budget} on the "
        f"training split and {budget} on {probes.onpolicy_heldout_split!r}, until "
        f"{probes.onpolicy_probe_size} correct ones each), more than the {run_episodes} this run trains on; "
        "--onpolicy-probe-episodes N caps them, --onpolicy-probe-size 0 turns them off"
    )


@torch.no_grad()
def onpolicy_probes(
    probes: ProbesConfig, env_spec: EnvSpec, policy: Any, *, progress: bool = False
) -> tuple[dict[str, RolloutBatch], dict[str, float]]:
    """The on-policy probes: up to ``onpolicy_probe_size`` correct responses ``policy`` samples itself (at
    its own temperature), on the first questions of ``env_spec``, the training env (``train``), and on the
    first questions of the held-out split (``heldout``), at most ``onpolicy_probe_episodes`` episodes each;
    ``progress`` shows a progress bar.

    Sampling is seeded independently of the run's seed, so every run of an experiment started from the same
    checkpoint has the same probes.

    Returns:
        ``(probes, summary)``: ``{"train": batch, "heldout": batch}`` (possibly empty batches), and the
        policy's sampled behaviour on those training questions (``reward``, ``searches``, ``answered``,
        ``episodes``) with each probe's size (``probe_onpolicy_{name}_size``); both empty when
        ``onpolicy_probe_size`` is 0.
    """
    if not probes.onpolicy_probe_size:
        return {}, {}
    from tqdm.auto import tqdm

    budget = probes.onpolicy_probe_episodes or 4 * probes.onpolicy_probe_size
    found_sets: dict[str, RolloutBatch] = {}
    summary: dict[str, float] = {}
    for k, (name, split) in enumerate(
        (("train", env_spec.split), ("heldout", probes.onpolicy_heldout_split))
    ):
        env = SearchQAVectorEnv(
            min(probes.onpolicy_probe_size, budget),
            env_spec.replace(split=split),
            autoreset_mode="Disabled",
            tokenizer=policy.tokenizer,
        )
        ids = [q.id for q in env.questions]
        kept: list[RolloutBatch] = []
        found, infos, rewards = 0, [], []
        # Sampling the probes takes a while before the first step: say what runs (episodes sampled, probes found).
        bar = tqdm(
            total=budget, desc=f"on-policy probe ({name})", unit="ep", disable=not progress, leave=False
        )
        try:
            for start in range(0, budget, env.num_envs):
                chunk = [ids[(start + j) % len(ids)] for j in range(env.num_envs)]
                policy.reset({}, seed=7_919 * (k + 1) + start)
                batch = collect_rollouts(env, policy, seed=start, group_size=1, question_ids=chunk)
                infos += batch.infos
                rewards += batch.rewards.tolist()
                rows = [i for i in range(len(batch)) if float(batch.rewards[i]) > 0]
                rows = rows[: probes.onpolicy_probe_size - found]
                if rows:
                    kept.append(batch.select(rows))
                    found += len(rows)
                bar.update(len(batch))
                bar.set_postfix_str(f"{found} of {probes.onpolicy_probe_size} correct found", refresh=False)
                if found >= probes.onpolicy_probe_size:
                    break
        finally:
            bar.close()
            env.close()
        found_sets[name] = concat_batches(kept, policy.tokenizer.pad_token_id)
        if name == "train":
            s = summarize_episodes(infos)
            summary = {
                "reward": float(np.mean(rewards)),
                "searches": s["searches"],
                "answered": s["answered"],
                "episodes": float(len(infos)),
            }
        summary[f"probe_onpolicy_{name}_size"] = float(found)
    return found_sets, summary
