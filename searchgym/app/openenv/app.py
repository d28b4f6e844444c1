"""The app as a module attribute, for ``uvicorn searchgym.app.openenv.app:app`` and ``openenv.yaml``'s ``app``.

Its options are those of ``searchgym openenv serve``, read from the environment variable
``SEARCHGYM_OPENENV_ARGS`` (e.g. ``"--split test --topk 5"``; ``--host`` and ``--port`` are uvicorn's
then). Importing this module builds the app: the dataset and its index are loaded.
"""

from __future__ import annotations

import argparse
import os
import shlex

from searchgym.app.cli.openenv_serve import add_arguments, build_app

__all__ = ["app"]

_parser = argparse.ArgumentParser(prog="SEARCHGYM_OPENENV_ARGS")
add_arguments(_parser)
app = build_app(_parser.parse_args(shlex.split(os.environ.get("SEARCHGYM_OPENENV_ARGS", ""))))
