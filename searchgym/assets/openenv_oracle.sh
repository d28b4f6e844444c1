#!/bin/sh
# SearchQA's oracle (openenv.yaml capabilities.oracle): replays the oracle's moves (searches that retrieve
# every supporting passage, then the golden answer) on the server at OPENENV_URL and fails unless each scores
# the maximum. The same check as `searchgym validate-env --check oracle` (docs/openenv.md).
exec searchgym validate-env --url "${OPENENV_URL:-http://127.0.0.1:8000}" --check oracle "$@"
