#!/usr/bin/env bash
# test_kvstored_cli.sh BUILD_DIR — kvstored's command line: usage errors exit 2 and name what was
# wrong; --help exits 0 and lists only options that do something (kvstored always runs in the
# foreground, so there is no --foreground to accept and ignore); slice_us reaches every thread.
set -uo pipefail
B=$1
K="$B/kvstore/kvstored"
fail=0
expect() { # exit code, pattern the output must hold, args...
  local want=$1 pat=$2; shift 2
  local out rc
  out=$("$K" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL: kvstored $* exited $rc, not $want: $out"; fail=1
  elif ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: kvstored $*: no '$pat' in: $out"; fail=1
  else
    echo "ok: kvstored $* -> $rc"
  fi
}
expect 2 "unrecognized option '--foreground'" --foreground
expect 2 "unexpected argument 'extra'" extra
expect 2 "nosuch" --set nosuch=1
expect 2 "dram_bytes" --set dram_bytes=lots
expect 2 "/nonexistent/kvstored.conf" --config /nonexistent/kvstored.conf
expect 0 "foreground" --help
# (grep reads whole outputs here: with pipefail, grep -q quitting early can fail the pipeline)
if grep -q -- "--foreground" <<<"$("$K" --help)"; then
  echo "FAIL: kvstored --help lists --foreground"; fail=1
fi
expect 0 "dram_bytes" --print-config
expect 2 "slice_us 99: must be 0 or 100 to 100000" --set slice_us=99
expect 2 "slice_us" --set slice_us=100001

# slice_us: every thread of the running daemon (the data plane's, ZeroMQ's, the journal's) has
# the slice, where the kernel keeps slice requests (Linux 6.12+: se.slice in /proc).
sock=/tmp/fkv-cli-slice-$$.sock
"$K" --set endpoint=ipc://$sock --set shm_name=/fkv-cli-slice-$$ --set dram_bytes=8M \
  --set lock_memory=false --set nvme_path=/tmp/fkv-cli-slice-$$.tier --set nvme_bytes=8M \
  --set slice_us=300 --set log_level=warn 2>/tmp/fkv-cli-slice-$$.err &
kp=$!
for _ in $(seq 100); do [ -S $sock ] && break; sleep 0.1; done
if grep -q "keeps no slice requests" /tmp/fkv-cli-slice-$$.err; then
  echo "skip: slice_us: $(cat /tmp/fkv-cli-slice-$$.err)"
elif [ ! -S $sock ]; then
  echo "FAIL: kvstored with slice_us=300 did not start: $(cat /tmp/fkv-cli-slice-$$.err)"; fail=1
else
  n=0 bad=0
  for t in /proc/$kp/task/*; do
    n=$((n + 1))
    v=$(sed -n 's/^se.slice *: *//p' $t/sched)
    [ "$v" = 300000 ] || { echo "FAIL: kvstored thread ${t##*/} ($(cat $t/comm)): se.slice $v"; bad=1; }
  done
  if [ $bad = 0 ] && [ $n -ge 3 ]; then echo "ok: slice_us=300 on all $n threads"
  else echo "FAIL: slice_us=300: $n threads, bad $bad"; fail=1; fi
fi
kill $kp 2>/dev/null; wait $kp 2>/dev/null
rm -f /tmp/fkv-cli-slice-$$.* /dev/shm/fkv-cli-slice-$$* $sock

# A pool larger than the memlock limit: the error names the limit and what to change. Without
# CAP_IPC_LOCK (dropped here, since root's mlock ignores the limit) and with a 1 MiB limit.
if grep -q libasan <<<"$(ldd "$K" 2>/dev/null)"; then
  echo "skip: memlock limit check: an AddressSanitizer build (its mlock does nothing)"
elif command -v setpriv >/dev/null; then
  out=$(setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock timeout 20 bash -c "ulimit -l 1024; exec '$K' \
    --set endpoint=ipc:///tmp/fkv-cli-$$.sock --set shm_name=/fkv-cli-$$ --set dram_bytes=64M \
    --set lock_memory=true --set nvme_path= --set persist=false" 2>&1); rc=$?
  if [ $rc != 1 ] || ! grep -q "cannot lock the 64 MiB pool.*memlock limit is 1024 KiB.*LimitMEMLOCK" <<<"$out"; then
    echo "FAIL: memlock limit below the pool: exit $rc: $out"; fail=1
  else
    echo "ok: memlock limit below the pool -> $rc: $(tail -n1 <<<"$out")"
  fi
  rm -f "/dev/shm/fkv-cli-$$"
else
  echo "skip: no setpriv (util-linux) to drop CAP_IPC_LOCK"
fi
exit $fail
