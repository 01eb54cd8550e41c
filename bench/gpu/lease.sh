#!/usr/bin/env bash
# bench/gpu/lease.sh — one short GPU lease's worth of bench/gpu/run.sh: the correctness runs in
# parallel (the GPU tests, memcheck and racecheck split into a few run.sh instances, which share
# the one device: fine for correctness, never for timing), then the benchmarks alone on the
# device, one after the other. Run on the GPU machine from the repository root, with the pack
# built here by scripts/gpu_pack.sh carried as .gpupack.
#   --check S    seconds for the parallel correctness phase (default 200): each instance's
#                --deadline, so a run not started by then is reported SKIP
#   --bench S    seconds for the benchmarks (default 240; 0 skips them): bench_kernels first, then
#                bench_decode_gpu with what is left
#   --instance NAME:STEPS:REGEX  a correctness instance of your own (repeatable; replaces the
#                default four): run.sh --steps STEPS --only REGEX, e.g. a rerun of what failed
# Everything after -- goes to the bench_decode run (e.g. --shape long-input --batch 1,4).
# Output in $OUT (at most five files): env.txt (device, driver, nvcc, compute-sanitizer),
# summary.txt (every run of every instance), bench_kernels.log, bench_decode_gpu.log and
# logs.tar.gz (every log). Exit status 1 when any run failed.
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
check=200 bench=240 decode_args=() own=()
while [ $# -gt 0 ]; do
  case $1 in
  --check) check=${2:?}; shift ;;
  --bench) bench=${2:?}; shift ;;
  --instance) own+=("${2:?}"); shift ;;
  --) shift; decode_args=("$@"); break ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:?lease.sh writes to \$OUT}
W=$(mktemp -d /tmp/freekv-lease.XXXXXX)
RUN=$SRC/bench/gpu/run.sh

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv
  nvcc --version 2>&1 | tail -n 2
  compute-sanitizer --version 2>&1 | head -n 2
  sed -n 's/^commit: /pack commit: /p' "$SRC/.gpupack/manifest.txt"
  nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The retrieval kernels (memcheck and racecheck both) and the rest.
KERNELS='test_kernel_(topk|pool_topk|page_score|page_summary|qcos|recall_scatter|offload_gather|decode_attention|flash_decode|kv_append)'
instances=(
  "tests:tests:tests:"
  "memk:memcheck:memcheck:($KERNELS|decode_step_.*)$"
  "race:racecheck:racecheck:($KERNELS|decode_step_.*)$"
  "memo:memcheck:memcheck:test_(backend_cuda.*|kernel_(gemm|embedding|rmsnorm|rope|silu_mul|attn_scores|prefill_attention|kivi)|policies_cuda)$"
)
[ ${#own[@]} -gt 0 ] && instances=("${own[@]}")
pids=()
t0=$SECONDS
for inst in "${instances[@]}"; do
  name=${inst%%:*} rest=${inst#*:}
  steps=${rest%%:*} only=${rest#*:}
  mkdir -p "$W/$name/out"
  OUT=$W/$name/out "$RUN" --pack "$SRC/.gpupack" --steps "$steps" --only "$only" \
    --deadline "$check" --work "$W/$name" >"$W/$name.console" 2>&1 &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
echo "== correctness phase: $((SECONDS - t0)) s"

if [ "$bench" -gt 0 ]; then
  mkdir -p "$W/bench/out"
  OUT=$W/bench/out BENCH_TIMEOUT=$bench "$RUN" --pack "$SRC/.gpupack" \
    --steps bench_kernels,bench_decode --deadline "$bench" --work "$W/bench" \
    "${decode_args[@]}" >"$W/bench.console" 2>&1 || failed=1
  for f in bench_kernels.log bench_decode_gpu.log; do
    [ -f "$W/bench/out/$f" ] && cp "$W/bench/out/$f" "$OUT/$f"
  done
fi

for d in "$W"/*/out; do
  [ -f "$d/summary.txt" ] && sed "s|^|$(basename "$(dirname "$d")"): |" "$d/summary.txt"
done >"$OUT/summary.txt"
(cd "$W" && tar -czf "$OUT/logs.tar.gz" ./*.console ./*/logs)
echo "== summary"
grep -v '^[a-z]*: ok ' "$OUT/summary.txt"
echo "$(grep -c ': ok ' "$OUT/summary.txt") ok, $(grep -c ': FAIL ' "$OUT/summary.txt") FAIL," \
  "$(grep -c ': SKIP ' "$OUT/summary.txt") SKIP"
[ -f "$OUT/bench_kernels.log" ] && tail -n 25 "$OUT/bench_kernels.log"
[ -f "$OUT/bench_decode_gpu.log" ] && tail -n 40 "$OUT/bench_decode_gpu.log"
exit $failed
