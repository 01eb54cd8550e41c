#!/usr/bin/env bash
# run.sh SOURCE_DIR BUILD_DIR MODEL SCRIPT [ARGS...] — runs a kvgate test script with the
# project virtualenv's Python (scripts/venv.sh makes it; `make test` runs the bootstrap that
# does). Without the virtualenv, or without openai in it, exits 77 (skipped) and says why.
set -euo pipefail
SRC=$1 BUILD=$2 MODEL=$3 SCRIPT=$4
shift 4
PY=$SRC/.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "skip: no project virtualenv at $SRC/.venv (run scripts/venv.sh or make bootstrap)"
  exit 77
fi
if ! "$PY" -c "import openai" 2>/dev/null; then
  echo "skip: $SRC/.venv has no openai package (run scripts/venv.sh)"
  exit 77
fi
exec "$PY" "$SRC/tests/gate/$SCRIPT" --build "$BUILD" --model "$MODEL" "$@"
