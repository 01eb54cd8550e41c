#!/bin/sh
# smollm2.sh — ctest's entry to the real-model test (tests/slow/test_smollm2.py): finds the
# SmolLM2 F32 GGUF and a Python with gguf, numpy and tokenizers, or exits 77 (skip) saying how
# to get them (scripts/fetch-models.sh fetches both).
#
# usage: tests/slow/smollm2.sh BUILD_DIR
#   FREEKV_SMOLLM2  the F32 GGUF (default: $FREEKV_CACHE/smollm2/SmolLM2-135M-Instruct.F32.gguf)
#   FREEKV_CACHE    scripts/fetch-models.sh's cache folder (default: $HOME/.cache/freekv)
#   FREEKV_PYTHON   the Python to run it with (default: $FREEKV_CACHE/venv/bin/python)
#   FREEKV_TEST_THREADS  kvworker's -t (default 1: on a loaded machine OpenMP's spinning
#                   barriers made a 2-thread eval ten times slower than one thread)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: smollm2.sh BUILD_DIR}
cache=${FREEKV_CACHE:-${HOME:-/nonexistent}/.cache/freekv}

if [ -n "${FREEKV_SMOLLM2:-}" ]; then
  model=$FREEKV_SMOLLM2
  if [ ! -f "$model" ]; then
    echo "smollm2: FREEKV_SMOLLM2=$model does not exist" >&2
    exit 1
  fi
else
  model=$cache/smollm2/SmolLM2-135M-Instruct.F32.gguf
  if [ ! -f "$model" ]; then
    echo "smollm2: SKIP: no model at $model" \
      "(run scripts/fetch-models.sh, or set FREEKV_SMOLLM2)" >&2
    exit 77
  fi
fi
python=${FREEKV_PYTHON:-$cache/venv/bin/python}
if ! "$python" -c 'import gguf, numpy, tokenizers' 2>/dev/null; then
  echo "smollm2: SKIP: $python cannot import gguf, numpy and tokenizers" \
    "(scripts/fetch-models.sh makes that venv, or set FREEKV_PYTHON)" >&2
  exit 77
fi
# The reference's numpy matmuls on one OpenBLAS thread too, for the same reason.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
echo "smollm2: model $model, python $python"
exec "$python" "$here/test_smollm2.py" --build "$build" --model "$model" \
  --threads "${FREEKV_TEST_THREADS:-1}"
