#!/usr/bin/env bash
# The one test command (README; .ci/run execs it on a clean clone): installs what the
# suite needs, runs the gates, then the suite in parallel. Safe to re-run; fast when
# everything is installed already. Arguments go to pytest, after the defaults:
#   bash tests/run.sh tests/gateway/test_cli_errors.py     # one file, in parallel
#   bash tests/run.sh -n 0 tests/x.py::test_y              # one test, serially
set -euo pipefail
cd "$(dirname "$0")/.."

# --- Python packages -------------------------------------------------------------------
# The extras whose code the suite tests: the PostgreSQL backend, the external memory
# providers' SDKs, the MCP SDK, the semantic retriever (the real int8 ONNX model, ~140 MB,
# no torch), and MkDocs, with which a test builds the manual (docs/).
# constraints.txt pins every version the suite was last run with (.ci/refresh-constraints).
EXTRAS=test,mem0,hindsight,honcho,postgres,supermemory,openviking,mcp,docs,semantic
PY=${PYTHON:-python3}
STAMP=.venv/.mnemo-installed # what was installed: skip the installer when it still holds
want="$EXTRAS $(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "installing .[$EXTRAS] into .venv ..."
  # uv downloads in parallel (about 35 s here, pip took 2.5 min); pip when uv is unavailable.
  if .venv/bin/python -m pip install -q -c constraints.txt uv; then
    # Bytecode now: tests start hundreds of interpreters, and PYTHONDONTWRITEBYTECODE
    # may be set, which would make each one compile its imports again.
    .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python \
      -c constraints.txt -e ".[$EXTRAS]"
  else
    .venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]"
  fi
  echo "$want" >"$STAMP"
fi
# The project's own modules, for the same reason (cheap when nothing changed).
.venv/bin/python -m compileall -q mnemo gateway adapters memory providers >/dev/null

# --- System packages -------------------------------------------------------------------
# Debian's chromium drives the web chat browser tests (never a downloaded browser);
# PostgreSQL's server binaries give the throw-away clusters of tests/support/pgcluster.py;
# zsh and fish check the completion scripts.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
# `mnemo completion zsh|fish` is checked by the shells themselves (zsh -n, fish --no-execute).
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} ..."
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing ${missing[*]}, which cannot be installed here (needs root and apt-get)" >&2
    exit 1
  fi
fi

# --- Gates: any finding fails the run before the tests start -----------------------------
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
# mypy with the project's config (pyproject.toml): strict on mnemo.memory/gateway/adapters.
.venv/bin/mypy -p mnemo

# --- The suite ---------------------------------------------------------------------------
# Three workers on two cores: a third of the suite's time is waiting (real processes
# starting, kill -9 recovery, PostgreSQL, the browser), and a third worker fills it; a
# fourth only adds contention (measured: README, "Tests"). --maxschedchunk 2 hands out
# tests two at a time, so the long tests, collected first (tests/conftest.py), start at
# once on different workers. pytest exits 5 when it collected nothing: a failure here too.
exec .venv/bin/python -m pytest -n "${MNEMO_TEST_WORKERS:-3}" --dist load --maxschedchunk 2 \
  --durations=25 "$@"
