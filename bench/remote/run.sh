#!/usr/bin/env bash
# bench/remote/run.sh [-r REPS] [--build DIR] — the remote tier (docs/design.md §8) against
# redis-benchmark on the same Redis server: a sequence of the synthetic Llama-3.1-8B geometry
# (2 layers, bf16, ~1,500 tokens: 256 KiB blocks) is generated on host A, published to Redis and
# adopted by host B, and on host T demoted to NVMe, then to Redis (the tier below NVMe), then
# brought back by a resume, REPS times; kvstored's own figures (kvctl status --json: bytes and
# time in Redis calls) give the MB/s, and `redis-benchmark -t set,get -d <block bytes> -P 64` the
# server's SET/GET MB/s for the same value size. Prints the ratios. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=3 BUILD=build
while [ $# -gt 0 ]; do
  case $1 in
    -r) REPS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) echo "bench/remote/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
KVW=$BUILD/worker/kvworker KVS=$BUILD/kvstore/kvstored KVCTL=$BUILD/ctl/kvctl
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
  { echo "needs redis-server and redis-benchmark (redis-tools)" >&2; exit 1; }
DIR=$(mktemp -d /tmp/fkv-remote-bench.XXXXXX)
PORT=$((22000 + $$ % 20000))
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR" /dev/shm/fkvrb$$*
}
trap cleanup EXIT
redis-server --port $PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
  >"$DIR/redis.log" &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
for h in A B; do
  "$KVS" --set endpoint=ipc://$DIR/$h.sock --set shm_name=/fkvrb$$$h --set dram_bytes=1G \
    --set lock_memory=false --set nvme_path= --set persist=false --set log_level=warn \
    --set remote_url=redis://127.0.0.1:$PORT --set remote_host_id=host-$h 2>"$DIR/$h.log" &
  PIDS+=($!)
done
# T: the tier below NVMe (an NVMe file, remote_tier = true).
"$KVS" --set endpoint=ipc://$DIR/T.sock --set shm_name=/fkvrb$$T --set dram_bytes=1G \
  --set lock_memory=false --set nvme_path="$DIR/T.nvme" --set nvme_bytes=1G --set persist=false \
  --set log_level=warn --set remote_url=redis://127.0.0.1:$PORT --set remote_host_id=host-T \
  --set remote_tier=true 2>"$DIR/T.log" &
PIDS+=($!)
for h in A B T; do for _ in $(seq 100); do [ -S "$DIR/$h.sock" ] && break; sleep 0.1; done; done
"$KVW" synth --preset llama-3.1-8b --layers 2 --out "$DIR/synth8b" >/dev/null 2>&1
python3 -c "
import random
random.seed(1)
w='once upon a time there was a little girl named lily she liked to play in the park'.split()
print(' '.join(random.choice(w) for _ in range(520)))" >"$DIR/prompt.txt"

remote() { # remote HOST FIELD: a figure of kvctl status --json's remote object
  "$KVCTL" -e ipc://$DIR/$1.sock --json status |
    python3 -c "import json,sys; print(json.load(sys.stdin)['remote']['$2'])"
}

block=0 pub_bytes=0 pub_us=0 adopt_bytes=0 adopt_us=0
for r in $(seq "$REPS"); do
  "$KVW" generate -m "$DIR/synth8b" -f "$DIR/prompt.txt" -n 1 --temp 0 -c 4096 \
    --store ipc://$DIR/A.sock --seq s$r --keep >/dev/null 2>&1
  b0=$(remote A bytes_put) u0=$(remote A total_us)
  "$KVCTL" -e ipc://$DIR/A.sock publish s$r >/dev/null
  pub_bytes=$((pub_bytes + $(remote A bytes_put) - b0)) pub_us=$((pub_us + $(remote A total_us) - u0))
  b0=$(remote B bytes_got) u0=$(remote B total_us)
  "$KVW" resume -m "$DIR/synth8b" --store ipc://$DIR/B.sock --seq s$r -n 0 --temp 0 -c 4096 --keep \
    >/dev/null 2>"$DIR/resume.err" || { cat "$DIR/resume.err" >&2; exit 1; }
  adopt_bytes=$((adopt_bytes + $(remote B bytes_got) - b0))
  adopt_us=$((adopt_us + $(remote B total_us) - u0))
  block=$("$KVCTL" -e ipc://$DIR/B.sock --json show s$r |
          python3 -c "import json,sys; print(json.load(sys.stdin)['block_bytes'])")
done
# The tier below NVMe: demote to NVMe, then to Redis (offload), then resume (fetch).
settle() { # settle SEQ FIELD WANT: wait until kvctl show's FIELD reaches WANT
  for _ in $(seq 500); do
    [ "$("$KVCTL" -e ipc://$DIR/T.sock --json show "$1" |
         python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])")" = "$3" ] && return
    sleep 0.02
  done
  echo "bench/remote/run.sh: $1 never reached $2 = $3" >&2; exit 1
}
off_bytes=0 off_us=0 fet_bytes=0 fet_us=0
for r in $(seq "$REPS"); do
  "$KVW" generate -m "$DIR/synth8b" -f "$DIR/prompt.txt" -n 1 --temp 0 -c 4096 \
    --store ipc://$DIR/T.sock --seq t$r --keep >/dev/null 2>&1
  "$KVCTL" -e ipc://$DIR/T.sock demote t$r >/dev/null
  settle t$r pages_dram 0
  b0=$(remote T tier_bytes_put) u0=$(remote T tier_us)
  "$KVCTL" -e ipc://$DIR/T.sock demote t$r --remote >/dev/null
  settle t$r pages_nvme 0
  off_bytes=$((off_bytes + $(remote T tier_bytes_put) - b0))
  off_us=$((off_us + $(remote T tier_us) - u0))
  b0=$(remote T tier_bytes_got) u0=$(remote T tier_us)
  "$KVW" resume -m "$DIR/synth8b" --store ipc://$DIR/T.sock --seq t$r -n 0 --temp 0 -c 4096 \
    --keep >/dev/null 2>"$DIR/resume.err" || { cat "$DIR/resume.err" >&2; exit 1; }
  fet_bytes=$((fet_bytes + $(remote T tier_bytes_got) - b0))
  fet_us=$((fet_us + $(remote T tier_us) - u0))
done
n=$((pub_bytes / block))
bench() { # bench OP: MB/s of redis-benchmark OP with values of the block size
  redis-benchmark -p $PORT -t "$1" -d "$block" -n "$n" -P 64 -c 1 --csv 2>/dev/null |
    python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
rps = float(rows[-1][1])
print(f'{rps * $block / 1e6:.1f}')"
}
set_mbs=$(bench set) get_mbs=$(bench get)
python3 - "$block" "$n" "$REPS" "$pub_bytes" "$pub_us" "$adopt_bytes" "$adopt_us" "$set_mbs" \
  "$get_mbs" "$off_bytes" "$off_us" "$fet_bytes" "$fet_us" <<'EOF'
import sys
block, n, reps, pb, pu, ab, au = map(int, sys.argv[1:8])
set_mbs, get_mbs = map(float, sys.argv[8:10])
ob, ou, fb, fu = map(int, sys.argv[10:14])
pub, adopt = pb / pu, ab / au   # bytes per microsecond = MB/s
print(f"blocks of {block} bytes, {n // reps} per sequence, {reps} sequences")
print(f"{'':<28} {'MB/s':>8} {'vs redis-benchmark':>20}")
print(f"{'publish (pipelined SET)':<28} {pub:>8.1f} {pub / set_mbs:>20.2f}   (SET -P 64: {set_mbs} MB/s)")
print(f"{'adopt (pipelined GET)':<28} {adopt:>8.1f} {adopt / get_mbs:>20.2f}   (GET -P 64: {get_mbs} MB/s)")
off, fet = ob / ou, fb / fu
print(f"{'tier demote NVMe -> Redis':<28} {off:>8.1f} {off / set_mbs:>20.2f}   (SET)")
print(f"{'tier promote Redis -> DRAM':<28} {fet:>8.1f} {fet / get_mbs:>20.2f}   (GET)")
EOF
