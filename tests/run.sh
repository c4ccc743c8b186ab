#!/usr/bin/env bash
# Installs everything the test suite needs into ./.venv and runs it.
# Safe to re-run; used verbatim by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The extras whose code the suite tests: the PostgreSQL backend, the external memory
# providers' SDKs and the semantic retriever (the real ONNX model, ~140 MB, no torch).
# constraints.txt pins every version the suite was last run with (.ci/refresh-constraints).
EXTRAS=test,mem0,hindsight,honcho,postgres,supermemory,openviking,semantic
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]"

# The web chat browser test drives Debian's chromium (never a downloaded browser).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the browser test ..."
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing and cannot be installed here (need root + apt-get)" >&2
    exit 1
  fi
fi

# The contract suite also runs on PostgreSQL: Debian's server binaries
# (tests/support/pgcluster.py starts a throw-away cluster from them, and stops it).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing postgresql for the storage contract suite ..."
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "postgresql is missing and cannot be installed here (need root + apt-get)" >&2
    exit 1
  fi
fi

exec .venv/bin/python -m pytest "$@"
