# `make demo` runs the main job on the embedded default; `make test` runs lint, types and the test suite.
# Both create or refresh the virtualenv first (torch pinned through constraints.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test test-fast test-portable lint typecheck browser unit test-verl test-verifiers clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

# DEMO_ARGS passes options to `searchgym demo` (e.g. a small budget: make demo DEMO_ARGS="--grpo-steps 1").
DEMO_ARGS ?=

demo: venv
	$(BIN)/searchgym demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check __init__.py searchgym envs agents tests scripts environments
	$(BIN)/ruff format --check __init__.py searchgym envs agents tests scripts environments

# mypy cannot follow the editable install's import hook, so it checks a tree of links that has the
# installed layout (searchgym/envs -> envs, searchgym/agents -> agents).
typecheck: venv
	rm -rf build/typecheck && mkdir -p build/typecheck/searchgym
	ln -s $(CURDIR)/searchgym/* build/typecheck/searchgym/
	ln -s $(CURDIR)/envs build/typecheck/searchgym/envs
	ln -s $(CURDIR)/agents build/typecheck/searchgym/agents
	cd build/typecheck && MYPYPATH=. $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p searchgym

# Debian's Chromium for the headless-browser test of `searchgym view`'s page (tests/app/cli/test_view.py), driven
# through Playwright (dev extra); installed with apt when missing (CI runs as root on Debian). Where it cannot
# be installed (no root, no apt), the suite goes on and that test skips, saying why.
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) || \
		echo "note: Chromium is not installed and could not be; the headless-browser test will skip"

# The suite runs on TEST_JOBS processes (pytest-xdist; `auto`: one per CPU core), each test where a core comes
# free (worksteal); TEST_JOBS=0 runs it in this process, as a debugger wants.
TEST_JOBS ?= auto
XDIST = -n $(TEST_JOBS) --dist worksteal

unit: venv browser
	$(BIN)/pytest $(XDIST)

# The working tier: lint and every test but the slow ones (subprocess runs, documented walk-throughs, servers
# under load, benchmarks). `make test` is the whole suite, as CI runs.
test-fast: lint
	$(BIN)/pytest $(XDIST) -m "not slow and not fuzz and not install"

# The numeric tests under each set of CPU kernels torch may pick on the project's machines: the native one,
# AVX2 only and torch's scalar `default` (MKL and oneDNN limited to match). Float32 kernels round differently
# on each; these tests must pass on all three (docs/dev/portability.md).
PORTABLE_TESTS ?= tests/agents/grpo/test_grpo_numerics.py tests/agents/grpo/test_grpo_losses.py tests/agents/grpo/test_mismatch.py \
	tests/agents/grpo/test_advantages.py tests/agents/grpo/test_displacement.py tests/test_stats.py tests/test_rewards.py

test-portable: venv
	$(BIN)/pytest -m "not fuzz and not install" -k "not another_cpu_kernel_set" $(PORTABLE_TESTS)
	ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
		$(BIN)/pytest -m "not fuzz and not install" -k "not another_cpu_kernel_set" $(PORTABLE_TESTS)
	ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 \
		$(BIN)/pytest -m "not fuzz and not install" -k "not another_cpu_kernel_set" $(PORTABLE_TESTS)

# verl 0.9.1 pins transformers < 5.11, so the verl integration is tested in its own virtualenv (a clean build
# took 8-11 minutes on a busy two-core machine, 2.5 of them CPU; nothing once built). SEARCHGYM_REQUIRE_VERL=1
# turns a missing verl into a failure: in .venv its tests are skipped, here they must run.
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_STAMP := $(VERL_VENV)/.installed-stamp

$(VERL_STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(VERL_BIN)/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/python -m pip install -q --upgrade pip
	$(VERL_BIN)/python -m pip install -q -c constraints.txt -e '.[verl,dev]'
	touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	SEARCHGYM_REQUIRE_VERL=1 $(VERL_BIN)/pytest $(XDIST) tests/agents/integrations/test_verl.py tests/agents/integrations/test_verl_tool.py \
		tests/app/conform/test_conform_verl.py

# verifiers 0.4 pins mcp==2.0.0 and OpenEnv 0.10 (dev extra) needs mcp<2.0, so the verifiers environment is
# tested in its own virtualenv, with the small distribution that gives it its id (environments/). In .venv
# its tests are skipped; SEARCHGYM_REQUIRE_VERIFIERS=1 makes a missing verifiers a failure here.
VF_VENV ?= .venv-verifiers
VF_BIN := $(VF_VENV)/bin
VF_STAMP := $(VF_VENV)/.installed-stamp

$(VF_STAMP): setup.cfg pyproject.toml constraints.txt environments/searchgym_searchqa/pyproject.toml
	test -x $(VF_BIN)/python || $(PYTHON) -m venv $(VF_VENV)
	$(VF_BIN)/python -m pip install -q --upgrade pip
	$(VF_BIN)/python -m pip install -q -c constraints.txt -e '.[verifiers,train,server,testing]'
	$(VF_BIN)/python -m pip install -q -c constraints.txt --no-deps -e environments/searchgym_searchqa
	touch $(VF_STAMP)

test-verifiers: $(VF_STAMP)
	SEARCHGYM_REQUIRE_VERIFIERS=1 $(VF_BIN)/pytest -p no:cacheprovider tests/app/hub/test_verifiers_env.py

test: lint typecheck unit test-verl test-verifiers

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VF_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
