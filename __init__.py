"""The checkout folder, imported as ``searchgym``: hands over to the installed package.

A script in the folder above a clone named ``searchgym`` finds this folder on ``sys.path`` (the script's
own folder comes first) before the installed package, and would import it as an empty namespace package:
nothing registers ``SearchQA-v0`` and Gymnasium says only ``NameNotFound``. This file makes the folder a
regular package instead, whose import hands over to the installed ``searchgym`` (an editable install of
this checkout, or a wheel), found with that folder left out of the search; without one, the import fails
saying why and what to run. Imported under any other name (a tool scanning the checkout), it does nothing.
"""

from __future__ import annotations

if __name__ == "searchgym":
    import importlib
    import os
    import sys

    _here = os.path.dirname(os.path.abspath(__file__))
    # The folder above this one, as reached and as resolved (the checkout may be a link).
    _above = {os.path.realpath(os.path.dirname(_here)), os.path.dirname(os.path.realpath(_here))}

    def _elsewhere(entry: str) -> bool:
        try:
            return os.path.realpath(entry or os.getcwd()) not in _above
        except (OSError, ValueError):  # an entry that is no path (a placeholder): not the folder above
            return True

    _saved_path, _self = list(sys.path), sys.modules.pop(__name__)
    sys.path[:] = [entry for entry in _saved_path if _elsewhere(entry)]
    try:
        _installed = importlib.import_module("searchgym")
    except ImportError as _error:
        sys.modules[__name__] = _self
        raise ImportError(
            f"`import searchgym` found {_here}, a searchgym checkout, because the script runs in the folder "
            "above it; searchgym itself is not installed in this Python "
            f"({sys.executable}): run `make venv` in {_here} and use its .venv/bin/python, or "
            f"pip install -e {_here} ({type(_error).__name__}: {_error})"
        ) from None
    finally:
        sys.path[:] = _saved_path
    if os.path.realpath(getattr(_installed, "__file__", None) or "") == os.path.realpath(__file__):
        raise ImportError(f"{_here} cannot stand in for the searchgym package: install it (make venv)")
    sys.modules[__name__] = _installed
