"""Now :mod:`searchgym.app.openenv.app`; this name stays importable for one release."""

from searchgym.app.openenv.app import *  # noqa: F403
