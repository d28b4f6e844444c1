"""The conformance adapter interface and runner, now :mod:`searchgym.app.conform.runner`; this name stays
importable for one release."""

from searchgym.app.conform.runner import *  # noqa: F403
