import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# Left out of the copy the wheel is built from: a build/ left by an earlier build would ship its stale
# build/lib (a package dropped from setup.cfg would still be in the wheel); the rest is large or irrelevant.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


def test_wheel_has_one_top_level_name(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("searchgym-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"searchgym"}
    assert "searchgym/envs/search_qa.py" in names and "searchgym/agents/scripted.py" in names
    assert "searchgym/py.typed" in names and "searchgym/assets/tokenizer.json" in names
    # Every package of the source tree ships (setup.cfg lists them one by one: a new subpackage must be added).
    folders = {"searchgym": "searchgym", "envs": "searchgym/envs", "agents": "searchgym/agents"}
    for folder, installed in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            assert f"{installed}/{init.relative_to(ROOT / folder).as_posix()}" in names, init


def test_no_bare_envs_or_agents_imports() -> None:
    offenders = []
    for path in [
        *ROOT.glob("searchgym/**/*.py"),
        *ROOT.glob("envs/**/*.py"),
        *ROOT.glob("agents/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
    ]:
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if stripped.startswith(("import envs", "import agents", "from envs", "from agents")):
                offenders.append(f"{path}: {stripped}")
    assert offenders == []


def test_readme_names_every_extra_and_what_all_holds() -> None:
    """The README's extras sentence matches setup.cfg: each extra named, and `all` holding exactly those
    listed before "`all` has them all"."""
    import configparser
    import re

    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    extras = config["options.extras_require"]
    in_all = set(re.findall(r"%\((\w+)\)s", extras["all"]))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("Optional dependencies install as extras:")
    paragraph = (readme[start:] + "\n\n").split("\n\n", 1)[0]
    before, marker, after = paragraph.partition("`all` has them all")
    assert marker, "the README's extras sentence must say which extras `all` holds"
    assert set(re.findall(r"`([\w-]+)`", before)) == in_all
    named_after = {name for name in re.findall(r"`([\w-]+)`", after) if name in extras}
    assert set(extras) - {"all", "dev"} == in_all | named_after


MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    """A module past 800 lines usually holds two jobs: split it by job before it grows further."""
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("searchgym", "envs", "agents")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert len(sizes) > 50, "the package's modules were not found"
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
