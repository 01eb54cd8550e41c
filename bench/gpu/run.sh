#!/usr/bin/env bash
# bench/gpu/run.sh — every GPU check in one command, on a machine with a CUDA device. Two modes:
#   --pack DIR   run what scripts/gpu_pack.sh built and packed on another machine: needs only the
#                pack, the NVIDIA driver, the CUDA toolkit's libcudart/libcublas (or the ones in
#                python3's site-packages nvidia/*/lib), compute-sanitizer and bash — no network,
#                no apt, no compiler, no ctest. The default when $SRC/.gpupack/manifest.txt exists.
#   --build DIR  configure and build here (scripts/bootstrap.sh installs the Debian packages),
#                then run the same checks on that build (the default otherwise: build-gpu).
# Steps (--steps, comma-separated; default all; each is a list of runs):
#   build      (build mode) configure with FREEKV_CUDA=ON for sm_90 (H100/H200), build the targets
#              below;
#   tests      every GPU test executable (each kernel against its CPU twin, the CUDA backend's
#              ops table and the engine against the CPU backend, the retrieval policies on cuda
#              vs cpu, backend choice with kvworker): exit 0 ok, 77 skip, anything else FAIL —
#              and 77 is a FAIL too once a device was seen, since nothing may skip then;
#   memcheck   compute-sanitizer memcheck on every GPU test but test_backend_select (which starts
#              kvworker) and on one decode step of `kvworker generate --backend cuda` per policy
#              (decode_step_POLICY: a prompt past a small budget, debug invariants on);
#   racecheck  racecheck on the retrieval kernels' tests, the policies' test and the decode steps;
#   bench_kernels  kernel micro-benchmarks (recall units vs one copy, decode attention vs HBM);
#   bench_decode   bench_decode_gpu (Llama-3.1-8B geometry, per policy); its rows: step time
#              (mean, median), the floor (weights + KV read over measured HBM bandwidth), recall
#              MB per step, the hidden fraction of recall and the correction rate. Picked with
#              --shape long-input|long-gen|both, --batch LIST, --policies LIST, --ubatch N,
#              --recall LIST
#              (mapped: the zero-copy gather kernel, the default; dma: batched copies from
#              the registered pool; staged: host copies first; a row each), --gen N, --ctx N and --budget S
#              (seconds of runs: a run that would overrun is skipped and said so, every printed
#              row is complete; default BENCH_TIMEOUT - 60, or what --deadline leaves, less
#              60). Defaults: both shapes (32768 + 256 generated, 600 + 4096), batch 1,
#              full,streaming,quest,freekv, mapped: as many rows as fit in 480 s. DECODE_ARGS
#              adds raw flags, e.g. DECODE_ARGS=--quick. --policies fig8 runs the paper's
#              Fig. 8 ablations (quest, freekv, freekv+nospec, freekv+single, freekv+frag,
#              quest+frag+single standing in for ArkVale; any POLICY+nospec|+frag|+single).
#              First measured on an H200 on 2026-11-27 (bench/RESULTS.md "First runs on a
#              GPU"); CUDA Graphs of decode steps are built but have not run on a GPU.
#   Aliases: sanitize = memcheck,racecheck; bench = bench_kernels,bench_decode.
# Splitting across calls that must each end in a few minutes: --steps picks steps, --only REGEX
# keeps the runs whose name (step:target, e.g. racecheck:test_kernel_topk) matches, and
# --deadline S stops starting runs S seconds after the start (they are reported SKIP) and cuts
# each run's own timeout to what is left. Every run has a timeout (TEST_TIMEOUT, SAN_TIMEOUT,
# BENCH_TIMEOUT seconds). Without a device, memcheck/racecheck/bench runs are SKIP.
# Output: per-run logs in the work dir (--work, default a new /tmp/freekv-gpu-run.*); at the end
# $OUT (default WORK/out) gets at most five files: summary.txt (every run ok/FAIL/SKIP), env.txt
# (date, pack manifest, GPU, driver, which libcudart/libcublas were used), bench_kernels.log,
# bench_decode_gpu.log and logs.tar.gz (all logs). Exit status 1 when any run failed, 2 on a
# usage or setup error.
# Usage: bench/gpu/run.sh [--pack DIR | --build DIR | BUILD_DIR] [--steps LIST] [--only REGEX]
#                         [--deadline S] [--work DIR] [--shape S] [--batch LIST]
#                         [--policies LIST] [--recall LIST] [--gen N] [--ctx N] [--ubatch N]
#                         [--budget S]
#        bench/gpu/run.sh --list-binaries   (what gpu_pack.sh must pack, relative to the build)
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)

# Executables are named relative to a build dir (a pack mirrors that layout in bin/). The tests
# are the build's: every test labelled gpu, plus test_backend_select (labelled unit: with a
# device it checks that cuda opens and that kvworker --backend cuda generates).
TOOLS=(worker/kvworker bench/bench_kernels bench/bench_decode_gpu)
# racecheck (shared-memory hazards) on the kernels that use shared memory, the policies' test
# (recall threads queue H2D copies and recall_scatter while attention reads the same slots), the
# backend's slot-decode and recall-ordering test (a second thread recalls while the main thread
# queues compute) and the decode step; memcheck on every GPU test that does not start kvworker, and the decode step,
# with --leak-check full except where the process ends with device memory still held by design
# (the policies' test and kvworker keep their pools until exit).
RACECHECK=(test_kernel_kv_append test_kernel_page_summary test_kernel_page_score
  test_kernel_topk test_kernel_qcos test_kernel_recall_scatter test_kernel_offload_gather
  test_kernel_decode_attention test_policies_cuda test_backend_cuda_slots)
MODEL_REL=stories260K/stories260K.gguf
# The device probe: a quick kernel test, which exits 77 exactly when CUDA sees no device.
PROBE=tests/test_kernel_embedding
NO_LEAK_CHECK=(test_policies_cuda decode_step)

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

mode="" dir="" steps="all" only="" deadline=0 WORK="" list=0 budget=""
BENCH_FLAGS=()
while [ $# -gt 0 ]; do
  case $1 in
  --list-binaries) list=1 ;;
  --pack) mode=pack dir=${2:?--pack needs a directory}; shift ;;
  --build) mode=build dir=${2:?--build needs a directory}; shift ;;
  --steps) steps=${2:?--steps needs a list}; shift ;;
  --only) only=${2:?--only needs a regex}; shift ;;
  --deadline) deadline=${2:?--deadline needs seconds}; shift ;;
  --work) WORK=${2:?--work needs a directory}; shift ;;
  --shape | --batch | --policies | --gen | --ctx | --recall | --ubatch)
    BENCH_FLAGS+=("$1" "${2:?$1 needs a value}"); shift ;;
  --budget) budget=${2:?--budget needs seconds}; shift ;;
  -h | --help) usage ;;
  -*) echo "run.sh: unknown option $1" >&2; usage ;;
  *) mode=build dir=$1 ;;
  esac
  shift
done
if [ -z "$mode" ]; then
  if [ -f "$SRC/.gpupack/manifest.txt" ]; then mode=pack dir=$SRC/.gpupack; else
    mode=build dir=$SRC/build-gpu; fi
fi
case $deadline in '' | *[!0-9]*) echo "run.sh: --deadline takes whole seconds" >&2; exit 2 ;; esac
case $budget in *[!0-9]*) echo "run.sh: --budget takes whole seconds" >&2; exit 2 ;; esac
steps=,${steps//sanitize/memcheck,racecheck},
steps=${steps//,bench,/,bench_kernels,bench_decode,}
[ "$steps" = ",all," ] && steps=",build,tests,memcheck,racecheck,bench_kernels,bench_decode,"
for s in ${steps//,/ }; do
  case $s in build | tests | memcheck | racecheck | bench_kernels | bench_decode) ;;
  *) echo "run.sh: unknown step '$s'" >&2; usage ;; esac
done
want() { [[ $steps == *",$1,"* ]]; }

# The GPU test executables' names: a pack's bin/tests, or what ctest knows of a configured build.
gpu_tests() {
  if [ "$mode" = pack ]; then
    find "$dir/bin/tests" -maxdepth 1 -type f -printf '%f\n' | sed 's/\.gz$//' | sort
    return
  fi
  [ -f "$dir/CTestTestfile.cmake" ] || {
    echo "run.sh: $dir is not a configured build" >&2
    return 1
  }
  { ctest --test-dir "$dir" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: *\([^ ]*\).*/\1/p'
    echo test_backend_select; } | sort -u
}

if [ $list = 1 ]; then
  [ "$mode" = build ] || { echo "run.sh: --list-binaries needs --build DIR" >&2; exit 2; }
  mapfile -t tests < <(gpu_tests)
  [ ${#tests[@]} -gt 0 ] || exit 2
  printf 'tests/%s\n' "${tests[@]}"
  printf '%s\n' "${TOOLS[@]}"
  exit 0
fi

own_work=0
[ -z "$WORK" ] && own_work=1 && WORK=$(mktemp -d /tmp/freekv-gpu-run.XXXXXX)
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK/logs" "$OUT" || exit 2
START=$SECONDS
declare -a SUMMARY=()
failed=0
device=unknown # yes | no | unknown (the probe could not run)

# run NAME TIMEOUT CMD... — one check: its output in WORK/logs/NAME.log (':' becomes '_'), the
# result in SUMMARY. Honours --only and --deadline.
run() {
  local name=$1 limit=$2
  shift 2
  [ -n "$only" ] && ! [[ $name =~ $only ]] && return 0
  if [ "$deadline" -gt 0 ]; then
    local left=$((deadline - (SECONDS - START)))
    if [ "$left" -lt 15 ]; then
      SUMMARY+=("SKIP  $name (deadline)")
      return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local log="$WORK/logs/${name//:/_}.log" t0=$SECONDS rc
  echo "== $name: $*"
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local took="$((SECONDS - t0)) s"
  # cmocka cases that called skip() (a missing model or kvworker): none may once a device is seen.
  local skipped
  skipped=$(grep '^\[  SKIPPED \] ' "$log" | grep -v 'test(s)' | sort -u | wc -l)
  if [ $rc -eq 0 ] && [ "$skipped" -gt 0 ]; then
    if [ "$device" = yes ]; then
      rc=77
    else
      took+=", $skipped case(s) skipped"
    fi
  fi
  if [ $rc -eq 0 ]; then
    SUMMARY+=("ok    $name ($took)")
  elif [ $rc -eq 77 ] && [ "$device" != yes ]; then
    SUMMARY+=("SKIP  $name (exit 77: $(grep -m1 '^skip' "$log" || echo 'skipped'))")
  else
    local why="rc $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after $limit s"
    [ $rc -eq 77 ] && why="a skip although a device was seen"
    SUMMARY+=("FAIL  $name ($why, $took, log ${log##*/})")
    failed=1
    tail -n 30 "$log"
  fi
}

# mark_all RESULT REASON NAME... — the runs a step would have made, not made, with the reason.
mark_all() {
  local result=$1 reason=$2
  shift 2
  for name in "$@"; do
    [ -n "$only" ] && ! [[ $name =~ $only ]] && continue
    SUMMARY+=("$(printf "%-5s" "$result") $name ($reason)")
    [ "$result" = FAIL ] && failed=1
  done
}

finish() {
  echo "== summary ($OUT)"
  local late
  late=$(printf '%s\n' "${SUMMARY[@]}" | grep -c '(deadline)$')
  [ "$late" -gt 0 ] && SUMMARY+=("($late run(s) not started before the deadline: run them with --only)")
  printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
  for b in bench_kernels bench_decode_gpu; do
    [ -f "$WORK/logs/bench_$b.log" ] && cp "$WORK/logs/bench_$b.log" "$OUT/$b.log"
  done
  tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
  # A work dir of our own (unpacked libraries, logs now in logs.tar.gz) goes unless OUT is in it.
  if [ "$own_work" = 1 ] && [[ $OUT != "$WORK"/* ]]; then rm -rf "$WORK"; else
    echo "run.sh: logs in $WORK/logs"; fi
  exit $failed
}

# Pack mode: the pack's libraries (unpacked into WORK/lib) first, then the toolkit's; whatever
# ldd still cannot find (libstdc++ on a bare image, cuBLAS without a toolkit) from the pack's
# compat/ and python3's nvidia wheels.
missing_libs() {
  local b
  for b in "${GPU_TESTS[@]/#/tests/}" "${TOOLS[@]}"; do ldd "$BIN/$b" 2>/dev/null; done |
    awk '/=> not found/ { print $1 }' | sort -u
}

setup_pack() {
  PACK=$(cd "$dir" 2>/dev/null && pwd) || { echo "run.sh: no pack at $dir" >&2; exit 2; }
  if ! [ -f "$PACK/manifest.txt" ] || ! [ -d "$PACK/bin/tests" ]; then
    echo "run.sh: $PACK is not a pack (no manifest.txt, bin/tests): build it with" \
      "scripts/gpu_pack.sh" >&2
    exit 2
  fi
  dir=$PACK
  mapfile -t GPU_TESTS < <(gpu_tests)
  # The executables, gzip-compressed in the pack, unpacked into WORK/bin in the same layout.
  BIN=$WORK/bin
  local f rel
  while IFS= read -r -d '' f; do
    rel=${f#"$PACK"/bin/}
    mkdir -p "$BIN/$(dirname "$rel")"
    if [[ $rel == *.gz ]]; then
      gzip -dc "$f" >"$BIN/${rel%.gz}" || { echo "run.sh: cannot unpack $f" >&2; exit 2; }
    else
      cp "$f" "$BIN/$rel"
    fi
  done < <(find "$PACK/bin" -type f -print0)
  find "$BIN" -type f -exec chmod u+x {} +
  MODELS=$PACK/models
  local libdirs=$WORK/lib cuda=${CUDA_HOME:-/usr/local/cuda} d
  mkdir -p "$WORK/lib/compat"
  for f in "$PACK"/lib/*.gz "$PACK"/lib/compat/*.gz; do
    [ -f "$f" ] || continue
    rel=${f#"$PACK"/lib/}
    gzip -dc "$f" >"$WORK/lib/${rel%.gz}" || { echo "run.sh: cannot unpack $f" >&2; exit 2; }
  done
  for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib"; do
    [ -d "$d" ] && libdirs+=:$d
  done
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local lib found sp
  mapfile -t sp < <(python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
    2>/dev/null)
  for lib in $(missing_libs); do
    found=""
    if [ -f "$WORK/lib/compat/$lib" ]; then found=$WORK/lib/compat; else
      for d in "${sp[@]}"; do
        [ -d "$d/nvidia" ] || continue
        found=$(find "$d/nvidia" -maxdepth 3 -name "$lib" -printf '%h\n' -quit)
        [ -n "$found" ] && break
      done
    fi
    [ -n "$found" ] || continue
    echo "run.sh: $lib from $found"
    [[ :$LD_LIBRARY_PATH: == *":$found:"* ]] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$found
  done
}

setup_build() {
  BUILD=$(mkdir -p "$dir" && cd "$dir" && pwd) || exit 2
  BIN=$BUILD
  MODELS=${FREEKV_MODELS_DIR:-$SRC/tests/data/models}
  if want build; then
    if ! "$SRC/scripts/bootstrap.sh"; then
      echo "run.sh: the Debian build dependencies are missing and could not be installed" >&2
      exit 2
    fi
    run build:configure 600 cmake -S "$SRC" -B "$BUILD" -DFREEKV_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  dir=$BUILD
  mapfile -t GPU_TESTS < <(gpu_tests)
  if want build; then
    local targets=("${GPU_TESTS[@]}" "${TOOLS[@]##*/}")
    run build:build 3600 cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"
  fi
}

if [ "$mode" = pack ]; then setup_pack; else setup_build; fi
# Tests find kvworker under FREEKV_BUILD_DIR and the model under FREEKV_MODELS_DIR.
export FREEKV_BUILD_DIR=$BIN FREEKV_MODELS_DIR=$MODELS

SAN=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ -x "$BIN/$PROBE" ]; then
  timeout -k 10 120 "$BIN/$PROBE" >"$WORK/logs/probe.log" 2>&1
  case $? in 0) device=yes ;; 77) device=no ;; esac
fi
# A probe that failed for another reason (a library, a test bug) leaves the driver's word.
if [ "$device" = unknown ] && grep -q '^GPU ' <<<"$(nvidia-smi -L 2>/dev/null)"; then
  device=yes
fi

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "mode: $mode ($BIN)"
  if [ "$mode" = pack ]; then
    sed 's/^/pack: /' "$PACK/manifest.txt" | grep -E '^pack: (commit|date|nvcc|glibc)'
  else
    echo "commit: $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$SRC" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  fi
  echo "glibc here: $(ldd --version 2>/dev/null | head -n1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi: not available"
  echo "device probe ($PROBE): $device"
  echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  ldd "$BIN/tests/test_kernel_gemm" 2>&1 | grep -E 'libcudart|libcublas' | sed 's/^[[:space:]]*/lib: /'
  for lib in $(missing_libs); do echo "lib: $lib NOT FOUND"; done
  echo "compute-sanitizer: $SAN$([ -x "$SAN" ] || echo ' (not found)')"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

[ ${#GPU_TESTS[@]} -gt 0 ] || SUMMARY+=("FAIL  setup (no GPU tests found in $BIN)")
missing=$(for b in "${GPU_TESTS[@]/#/tests/}" "${TOOLS[@]}" "${RACECHECK[@]/#/tests/}"; do [ -x "$BIN/$b" ] || echo "$b"; done)
unresolved=$(missing_libs)
if [ -n "$missing$unresolved" ]; then
  [ -n "$missing" ] && SUMMARY+=("FAIL  setup (missing executables: ${missing//$'\n'/ })")
  [ -n "$unresolved" ] && SUMMARY+=("FAIL  setup (libraries not found: ${unresolved//$'\n'/ })")
  failed=1
fi

TEST_TIMEOUT=${TEST_TIMEOUT:-300}
SAN_TIMEOUT=${SAN_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-540}
MODEL=$MODELS/$MODEL_REL
# One decode step of each policy: a prompt of about 90 tokens, past a budget of 64 (page 8, sink
# 8, window 16), so the retrieval policies select and recall; the debug invariants on.
DECODE_POLICIES=(full streaming quest freekv hardkv refreshkv specache)
printf '%s' 'Once upon a time, there was a little girl named Lily. She loved to play outside' \
  ' in the sun with her dog. One day, she saw a big red ball in the park. She ran to the ball' \
  ' and kicked it high into the sky. Her dog barked and ran after it. They played all day' \
  ' until the sun went down, and then they went home to eat.' >"$WORK/prompt.txt"
decode_step() {
  DECODE_STEP=("$BIN/worker/kvworker" generate --backend cuda -m "$MODEL" -f "$WORK/prompt.txt"
    -n 2 --temp 0 --ids --policy "$1" --page-size 8 --budget 64 --sink 8 --window 16
    --debug-invariants)
}

if want tests; then
  for t in "${GPU_TESTS[@]}"; do run "tests:$t" "$TEST_TIMEOUT" "$BIN/tests/$t"; done
fi

# san_flags TOOL TARGET — compute-sanitizer's flags for one run, in flags.
# The tests check every CUDA call's return themselves and provoke some errors on purpose (a
# second cudaHostRegister of one range must be refused): the sanitizer reports no API errors
# for them, only for the decode steps.
san_flags() {
  flags=(--tool "$1" --error-exitcode 1)
  [[ $2 == test_* ]] && flags+=(--report-api-errors no)
  [ "$1" = racecheck ] && flags+=(--racecheck-report all)
  if [ "$1" = memcheck ] && [[ " ${NO_LEAK_CHECK[*]} " != *" $2 "* ]]; then
    flags+=(--leak-check full)
  fi
  return 0
}

# Under the sanitizers the tests' largest sizes shrink (tests/gpu/gpu_test.h gpu_test_quick).
export FREEKV_GPU_TEST_QUICK=1
MEMCHECK=()
for t in "${GPU_TESTS[@]}"; do [ "$t" = test_backend_select ] || MEMCHECK+=("$t"); done
for tool in memcheck racecheck; do
  want "$tool" || continue
  if [ "$tool" = memcheck ]; then targets=("${MEMCHECK[@]}"); else
    targets=("${RACECHECK[@]}"); fi
  names=("${targets[@]/#/$tool:}" "${DECODE_POLICIES[@]/#/$tool:decode_step_}")
  if [ "$device" != yes ]; then
    mark_all SKIP "no CUDA device (probe: $device)" "${names[@]}"
    continue
  fi
  if ! [ -x "$SAN" ]; then
    mark_all FAIL "compute-sanitizer not found at $SAN" "${names[@]}"
    continue
  fi
  for t in "${targets[@]}"; do
    san_flags "$tool" "$t"
    run "$tool:$t" "$SAN_TIMEOUT" "$SAN" "${flags[@]}" "$BIN/tests/$t"
  done
  for p in "${DECODE_POLICIES[@]}"; do
    if [ -f "$MODEL" ]; then
      san_flags "$tool" decode_step
      decode_step "$p"
      run "$tool:decode_step_$p" "$SAN_TIMEOUT" "$SAN" "${flags[@]}" "${DECODE_STEP[@]}"
    else
      mark_all SKIP "$MODEL not found" "$tool:decode_step_$p"
    fi
  done
done

unset FREEKV_GPU_TEST_QUICK
for b in bench_kernels bench_decode; do
  want "$b" || continue
  exe=$b
  [ "$b" = bench_decode ] && exe=bench_decode_gpu
  if [ "$device" != yes ]; then
    mark_all SKIP "no CUDA device (probe: $device)" "bench:$exe"
    continue
  fi
  args=()
  if [ "$b" = bench_decode ]; then
    # The bench's own budget stays 60 s inside the run's timeout (and the deadline), so it
    # prints its complete rows and exits before it is killed.
    limit=$BENCH_TIMEOUT
    [ "$deadline" -gt 0 ] && [ $((deadline - (SECONDS - START))) -lt "$limit" ] &&
      limit=$((deadline - (SECONDS - START)))
    b_s=${budget:-$((limit - 60))}
    [ "$b_s" -gt $((limit - 60)) ] && b_s=$((limit - 60))
    [ "$b_s" -lt 10 ] && b_s=10
    read -ra args <<<"${DECODE_ARGS:-}"
    args=(--budget "$b_s" "${BENCH_FLAGS[@]}" "${args[@]}")
  fi
  run "bench:$exe" "$BENCH_TIMEOUT" "$BIN/bench/$exe" "${args[@]}"
  [ -f "$WORK/logs/bench_$exe.log" ] && cat "$WORK/logs/bench_$exe.log"
done

finish
