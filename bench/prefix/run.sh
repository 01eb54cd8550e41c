#!/usr/bin/env bash
# bench/prefix/run.sh [-r REPS] [-t THREADS] [--build DIR] [--no-8b] — time to first token
# with prefix sharing (docs/design.md §4): a prompt of a ~1,500-token shared prefix and ~50 new
# tokens, run cold (`kvworker generate --no-prefix`) and shared (after one publisher left the
# prefix in kvstored's pool), on stories260K and on a synthetic Llama-3.1-8B-geometry model
# (2 layers, bf16, made by `kvworker synth`). TTFT is kvworker's own ttft_ms (--stats): the
# sequence open (with the lookup and the policy's rebuild from the pages found) plus the
# prefill, without the model load. Prints per-model medians and the cold/shared ratio, and
# checks that the shared run's greedy tokens equal the cold run's. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=3 THREADS=$(nproc) BUILD=build WITH_8B=1
while [ $# -gt 0 ]; do
  case $1 in
    -r) REPS=$2; shift 2 ;;
    -t) THREADS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --no-8b) WITH_8B=0; shift ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "bench/prefix/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
KVW=$BUILD/worker/kvworker
KVS=$BUILD/kvstore/kvstored
[ -x "$KVW" ] && [ -x "$KVS" ] || { echo "build first (make)" >&2; exit 1; }
DIR=$(mktemp -d /tmp/fkv-prefix-bench.XXXXXX)
SHM=/fkvpb$$
EP=ipc://$DIR/kvstored.sock
cleanup() {
  [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null || true
  rm -rf "$DIR" "/dev/shm$SHM" "/dev/shm$SHM.lock"
}
trap cleanup EXIT

"$KVS" --set endpoint="$EP" --set shm_name=$SHM --set dram_bytes=1G --set lock_memory=false \
  --set nvme_path= --set persist=false --set log_level=warn 2>"$DIR/kvstored.log" &
DPID=$!
for _ in $(seq 100); do [ -S "$DIR/kvstored.sock" ] && break; sleep 0.1; done

MODELS=("stories260K=tests/data/models/stories260K/stories260K.gguf")
if [ "$WITH_8B" = 1 ]; then
  "$KVW" synth --preset llama-3.1-8b --layers 2 --out "$DIR/synth8b" >/dev/null
  MODELS+=("synth-llama-3.1-8b-2L=$DIR/synth8b")
fi

# run MODEL TEXTFILE SEQ OUT [flags...]: one generate; its --stats JSON line to OUT.json and its
# ids to OUT.ids.
run() {
  local model=$1 text=$2 seq=$3 out=$4; shift 4
  "$KVW" generate -m "$model" -f "$text" -n 8 --temp 0 --ids --stats -c 4096 -t "$THREADS" \
    --store "$EP" --seq "$seq" "$@" >"$out.ids" 2>"$out.err"
  grep '^{' "$out.err" | tail -1 >"$out.json"
}

# words N SEED: N words of story text.
words() {
  python3 - "$1" "$2" <<'EOF'
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
random.seed(seed)
w = ("once upon a time there was a little girl named lily she liked to play in the park with "
     "her friends one day they found a big red ball under the old tree and the dog ran").split()
print(" ".join(random.choice(w) for _ in range(n)), end="")
EOF
}

field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

printf '%-24s %7s %7s %12s %12s %8s %s\n' MODEL PROMPT SHARED COLD_TTFT_MS SHR_TTFT_MS RATIO \
  SAME_TOKENS
for entry in "${MODELS[@]}"; do
  name=${entry%%=*} model=${entry#*=}
  # Tokens per word of this model's tokenizer, from a probe run.
  words 200 1 >"$DIR/probe.txt"
  run "$model" "$DIR/probe.txt" "probe-$name" "$DIR/probe" --no-prefix
  per=$(python3 -c "import json; print(json.load(open('$DIR/probe.json'))['prompt_tokens'] / 200)")
  nw_prefix=$(python3 -c "print(round(1500 / $per))")
  nw_tail=$(python3 -c "print(max(1, round(50 / $per)))")
  words "$nw_prefix" 2 >"$DIR/prefix.txt"
  { cat "$DIR/prefix.txt"; printf ' '; words "$nw_tail" 3; } >"$DIR/publisher.txt"
  { cat "$DIR/prefix.txt"; printf ' '; words "$nw_tail" 4; } >"$DIR/asker.txt"
  run "$model" "$DIR/publisher.txt" "pub-$name" "$DIR/pub" --keep
  cold=() shared=() same=yes prompt=0 cov=0
  for r in $(seq "$REPS"); do
    run "$model" "$DIR/asker.txt" "cold-$name-$r" "$DIR/cold" --no-prefix
    run "$model" "$DIR/asker.txt" "shr-$name-$r" "$DIR/shr"
    cold+=("$(field "$DIR/cold.json" ttft_ms)")
    shared+=("$(field "$DIR/shr.json" ttft_ms)")
    prompt=$(field "$DIR/shr.json" prompt_tokens)
    cov=$(field "$DIR/shr.json" prefix_covered)
    cmp -s "$DIR/cold.ids" "$DIR/shr.ids" || same=no
  done
  python3 - "$name" "$prompt" "$cov" "$same" "${cold[*]}" "${shared[*]}" <<'EOF'
import statistics, sys
name, prompt, cov, same = sys.argv[1:5]
cold = [float(x) for x in sys.argv[5].split()]
shr = [float(x) for x in sys.argv[6].split()]
c, s = statistics.median(cold), statistics.median(shr)
print(f"{name:<24} {prompt:>7} {cov:>7} {c:>12.1f} {s:>12.1f} {c / s:>8.2f} {same}"
      f"   (cold {min(cold):.1f}-{max(cold):.1f}, shared {min(shr):.1f}-{max(shr):.1f} ms)")
EOF
done
