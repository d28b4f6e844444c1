"""SearchQA on the hubs: the doors other trainers come through, and the checks that certify them.

* :mod:`~searchgym.app.hub.replies`: a model's reply (tool calls, or Search-R1's tags) as a turn of the
  message-level view (:class:`~searchgym.envs.messages.SearchQAMessages`), and the episode loop every
  conversation-owning front end runs;
* :mod:`~searchgym.app.hub.verifiers_env`: the ``verifiers`` environment (extra ``searchgym[verifiers]``);
* :mod:`~searchgym.app.hub.parity`: one fixed set of trajectories played through every door (the Gymnasium env,
  the TRL tool env, the OpenEnv client, the ``verifiers`` episode), their rewards and ends compared;
* :mod:`~searchgym.app.hub.checks`: ``searchgym validate-env``, OpenEnv's validation checks run locally.

This package belongs to the application layer: it imports ``searchgym.envs`` and ``searchgym.agents``, and
nothing below imports it. Importing it imports neither torch, nor an HTTP server, nor ``verifiers``.
"""
