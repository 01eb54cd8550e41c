#!/usr/bin/env bash
# venv.sh [DIR] — the project's Python virtualenv (default: .venv at the repository root) with
# the client libraries the tests and benchmarks use, from PyPI: the official `openai` package
# (tests/gate) and pyzmq (bench/bench_gate.py talks to kvworker serve directly).
# Idempotent: does nothing when DIR already imports a pinned openai. Uses Debian's python3 (and
# its python3-venv, installed by scripts/bootstrap.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.venv}
# Pinned so that test results do not change under us; bump deliberately.
OPENAI_VERSION=1.109.1
PYZMQ_VERSION=26.2.0
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

if [ -x "$DIR/bin/python" ] &&
   "$DIR/bin/python" -c "import openai, zmq, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION' or zmq.__version__ != '$PYZMQ_VERSION')" 2>/dev/null; then
  echo "venv: $DIR has openai $OPENAI_VERSION and pyzmq $PYZMQ_VERSION"
  exit 0
fi
echo "venv: creating $DIR with openai $OPENAI_VERSION and pyzmq $PYZMQ_VERSION"
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" \
  "pyzmq==$PYZMQ_VERSION"
"$DIR/bin/python" -c "import openai, zmq; print('venv: openai', openai.__version__, 'pyzmq', zmq.__version__)"
