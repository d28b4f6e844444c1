"""Now :mod:`searchgym.app.openenv.tools`; this name stays importable for one release."""

from searchgym.app.openenv.tools import *  # noqa: F403
