"""The benchmark report, now :mod:`searchgym.app.benchmark`; this name stays importable for one release."""

from searchgym.app.benchmark import *  # noqa: F403
