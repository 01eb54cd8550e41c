#!/usr/bin/env bash
# bench/gpu/run.sh — everything GPU in one command, on a machine with a CUDA device:
#   1. configure + build with FREEKV_CUDA=ON for sm_90 (H100/H200),
#   2. ctest -L gpu (every kernel against its CPU twin),
#   3. compute-sanitizer memcheck and racecheck on the retrieval kernels' tests,
#   4. compute-sanitizer memcheck on the CUDA backend's test (every op vs the CPU backend, the
#      engine end to end), memcheck + racecheck on the policies' test (streaming, quest,
#      freekv on cuda vs cpu), and memcheck + racecheck on ONE decode step of the real binary:
#      `kvworker generate --backend cuda -n 2` on stories260K,
#   5. the kernel micro-benchmarks (bench_kernels: recall units vs one copy, decode attention
#      vs its HBM floor),
#   6. the decode benchmark (bench_decode_gpu: Llama-3.1-8B geometry, long-input and
#      long-generation, batch 1/4/8, per policy); DECODE_ARGS=--quick for a short smoke run.
# Every step runs even when an earlier one failed; the summary lists each step's result and the
# exit status is non-zero when any failed. Logs go to $OUT (default BUILD/gpu-run).
# Usage: bench/gpu/run.sh [BUILD_DIR]   (default: build-gpu in the source tree)
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$SRC/build-gpu}
OUT=${OUT:-$BUILD/gpu-run}
JOBS=$(nproc)
mkdir -p "$OUT"

RETRIEVAL_TESTS=(test_kernel_kv_append test_kernel_page_summary test_kernel_page_score
  test_kernel_topk test_kernel_qcos test_kernel_recall_scatter test_kernel_offload_gather
  test_kernel_decode_attention)

declare -a SUMMARY=()
failed=0
step() { # step NAME CMD... — runs CMD with its output in $OUT/NAME.log, records the result
  local name=$1
  shift
  echo "== $name: $*"
  if "$@" >"$OUT/$name.log" 2>&1; then
    SUMMARY+=("ok    $name")
  else
    SUMMARY+=("FAIL  $name (rc $?, see $OUT/$name.log)")
    failed=1
    tail -n 40 "$OUT/$name.log"
  fi
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    git -C "$SRC" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi: not available"
} | tee "$OUT/env.txt"

if ! "$SRC/scripts/bootstrap.sh"; then
  echo "run.sh: the Debian build dependencies are missing and could not be installed" >&2
  exit 2
fi

step configure cmake -S "$SRC" -B "$BUILD" -DFREEKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build cmake --build "$BUILD" -j "$JOBS"
step ctest_gpu ctest --test-dir "$BUILD" -L gpu --output-on-failure

SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for t in "${RETRIEVAL_TESTS[@]}"; do
  step "memcheck_$t" "$SAN" --tool memcheck --leak-check full --error-exitcode 1 \
    "$BUILD/tests/$t"
  step "racecheck_$t" "$SAN" --tool racecheck --racecheck-report all --error-exitcode 1 \
    "$BUILD/tests/$t"
done

step memcheck_test_backend_cuda "$SAN" --tool memcheck --leak-check full --error-exitcode 1 \
  "$BUILD/tests/test_backend_cuda"
# The retrieval policies on CUDA: recall threads queue H2D copies and recall_scatter on the
# compute stream while it runs attention over the same slots.
for tool in memcheck racecheck; do
  step "${tool}_test_policies_cuda" "$SAN" --tool "$tool" --error-exitcode 1 \
    "$BUILD/tests/test_policies_cuda"
done
MODEL=${FREEKV_MODELS_DIR:-$SRC/../shared/models}/stories260K/stories260K.gguf
if [ -f "$MODEL" ]; then
  for tool in memcheck racecheck; do
    step "${tool}_decode_step" "$SAN" --tool "$tool" --error-exitcode 1 \
      "$BUILD/worker/kvworker" generate --backend cuda -m "$MODEL" -p "Once upon a time" \
      -n 2 --temp 0 --ids
  done
else
  SUMMARY+=("SKIP  decode_step under compute-sanitizer ($MODEL not found)")
fi

step bench_kernels "$BUILD/bench/bench_kernels"
cat "$OUT/bench_kernels.log"
# shellcheck disable=SC2086 # DECODE_ARGS is a list of flags
step bench_decode_gpu "$BUILD/bench/bench_decode_gpu" ${DECODE_ARGS:-}
cat "$OUT/bench_decode_gpu.log"

echo "== summary ($OUT)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
exit $failed
