"""Now :mod:`searchgym.app.hub.verifiers_env`; this name stays importable for one release."""

from searchgym.app.hub.verifiers_env import *  # noqa: F403
