"""A script in the folder above a clone named ``searchgym`` imports the installed package, not the clone.

Python puts a script's own folder first on ``sys.path``, so ``import searchgym`` there finds the clone's
folder before the installed package; the clone's top-level ``__init__.py`` hands the import over to the
installed one, or, where none is installed, fails saying why and what to run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import searchgym

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # subprocesses

SCRIPT = """\
import gymnasium as gym
import searchgym

env = gym.make("SearchQA-v0", split="test")
obs, info = env.reset(seed=0)
print(searchgym.__file__)
"""


@pytest.fixture
def above_a_clone(tmp_path: Path) -> Path:
    """A folder holding ``searchgym``, a link to this checkout: the layout ``../shared`` suggests."""
    (tmp_path / "searchgym").symlink_to(ROOT, target_is_directory=True)
    return tmp_path


def test_a_script_above_the_clone_gets_the_installed_package(above_a_clone: Path) -> None:
    (above_a_clone / "script.py").write_text(SCRIPT, encoding="utf-8")
    for argv in ([sys.executable, "script.py"], [sys.executable, "-c", SCRIPT]):
        done = subprocess.run(argv, cwd=above_a_clone, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()) == Path(searchgym.__file__), done.stdout


def test_without_an_installed_package_the_import_says_why(above_a_clone: Path) -> None:
    # -S: no site-packages, so no installed searchgym (and no editable finder) in this interpreter.
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import searchgym"],
        cwd=above_a_clone,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: `import searchgym` found"), done.stderr
    assert "a searchgym checkout, because the script runs in the folder above it" in last
    assert "make venv" in last and "NameNotFound" not in done.stderr


def test_imported_under_another_name_it_does_nothing() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; runpy.run_path('__init__.py'); print(sorted(sys.modules))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "'searchgym'" not in done.stdout
