#!/usr/bin/env bash
# `make demo`: the main job as far as it exists. Starts a kvstored on a temporary shared-memory
# name, ipc endpoint and NVMe file; shows it with kvctl; runs kvworker on the stories260K model;
# stops the daemon cleanly and checks that its shared memory is gone.
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/$BUILD
MODELS=${FREEKV_MODELS_DIR:-$ROOT/../shared/models}
MODEL=$MODELS/stories260K/stories260K.gguf

tmp=$(mktemp -d /var/tmp/freekv-demo.XXXXXX)
shm="freekv-demo-$$"
endpoint="ipc://$tmp/kvstored.sock"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"; wait "$daemon_pid" || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "kvstored: 64 MiB pool /dev/shm/$shm, 256 MiB NVMe tier at $tmp/nvme.img"
"$BIN/kvstore/kvstored" --foreground \
  --set endpoint="$endpoint" --set shm_name="$shm" --set lock_memory=false \
  --set dram_bytes=64M --set nvme_path="$tmp/nvme.img" --set nvme_bytes=256M \
  2>"$tmp/kvstored.log" &
daemon_pid=$!
for _ in $(seq 50); do
  "$BIN/ctl/kvctl" -e "$endpoint" status >/dev/null 2>&1 && break
  sleep 0.1
done

say "kvctl status"
"$BIN/ctl/kvctl" -e "$endpoint" status

if [ -f "$MODEL" ]; then
  say "kvworker generate (stories260K, greedy)"
  "$BIN/worker/kvworker" generate -m "$MODEL" -p "Once upon a time" -n 48 --temp 0 --stats
  echo
else
  say "model $MODEL not found: skipping kvworker"
fi

say "kvctl stats"
"$BIN/ctl/kvctl" -e "$endpoint" stats

say "stopping kvstored (SIGTERM)"
kill -TERM "$daemon_pid"; wait "$daemon_pid"; daemon_pid=""
if [ -e "/dev/shm/$shm" ]; then echo "demo: /dev/shm/$shm still exists" >&2; exit 1; fi
echo "kvstored stopped; /dev/shm/$shm unlinked"
