"""What every trainer shares (SFT, GRPO, the TRL and verl integrations): the configuration they have in common
(:mod:`.config`), the run folder and its resume rule (:mod:`.run`), the policy a run starts from
(:mod:`.policy`), checkpoints (:mod:`.checkpoint`, their checks in :mod:`.checkpoint_checks`, the RNG and
sampler state in :mod:`.state`), the metric log (:mod:`.metrics`) and where else it reports (:mod:`.reporting`), batched episodes with an LLM policy and
the one greedy evaluation (:mod:`.rollout`), and loading or exporting a trained policy (:mod:`.export`)."""
