"""searchgym inside the engines researchers scale out on: TRL and verl.

* :mod:`searchgym.agents.integrations.trl` (extra ``searchgym[trl]``): a ``rollout_func`` for TRL's
  ``GRPOTrainer`` that plays SearchQA episodes token-exactly (tool tokens masked out of the loss by
  ``env_mask``; in :mod:`~searchgym.agents.integrations.trl_rollout`), an LLDS-enabled ``GRPOTrainer``
  subclass, the LLD early-warning callback, and ``searchgym train trl``.
* :mod:`searchgym.agents.integrations.trl_env`: ``SearchQAToolEnv``, SearchQA behind TRL's
  ``environment_factory`` (tool calls instead of tags; no torch needed to import it).
* :mod:`searchgym.agents.integrations.verl` (extra ``searchgym[verl]``): the LLDS policy losses registered
  with verl (``llds_action``, ``llds_response``, ``llds_token``), a token-level SearchQA agent loop
  (``searchgym``) and the ``lld/warning`` metric, all loaded by the ``verl.plugins`` entry point.
* :mod:`searchgym.agents.integrations.verl_data`: the parquet files verl reads (``searchgym prepare verl``).
* :mod:`searchgym.agents.integrations.trajectories`: episodes as the rows TRL and verl consume
  (``searchgym export-trajectories``).

Both engines import inward only: nothing in searchgym's core, envs or agents imports this package. The
maths is not copied here: every loss and diagnostic comes from :mod:`searchgym.agents.grpo.losses` and
:mod:`searchgym.agents.grpo.diagnostics`. See ``docs/scale.md``.
"""
