"""SearchQA as an OpenEnv environment, now :mod:`searchgym.app.openenv`; this name stays importable for one
release."""

from searchgym.app.openenv import *  # noqa: F403
