#!/usr/bin/env bash
# venv.sh [DIR] — the project's Python virtualenv (default: .venv at the repository root) with
# the client libraries the tests and benchmarks use: the official `openai` package, from PyPI.
# Idempotent: does nothing when DIR already imports a pinned openai. Uses Debian's python3 (and
# its python3-venv, installed by scripts/bootstrap.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.venv}
# Pinned so that test results do not change under us; bump deliberately.
OPENAI_VERSION=1.109.1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

if [ -x "$DIR/bin/python" ] &&
   "$DIR/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "venv: $DIR has openai $OPENAI_VERSION"
  exit 0
fi
echo "venv: creating $DIR with openai $OPENAI_VERSION"
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
"$DIR/bin/python" -c "import openai; print('venv: openai', openai.__version__)"
