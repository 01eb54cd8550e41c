#!/usr/bin/env bash
# Tests scripts/check_includes.sh: the real tree passes, and each rule of the layout fails when a
# copy of the tree breaks it (a backend including a policy, kvstore/lib including a daemon header,
# a file outside worker/cli including a command front-end, kernels including a worker header,
# metrics/ including the gateway, the gateway including a worker floor).
set -euo pipefail
SRC=$1
CHECK=$SRC/scripts/check_includes.sh
"$CHECK" "$SRC"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect_violation() { # FILE LINE-TO-ADD PATTERN
  rm -rf "$tmp/tree"; mkdir -p "$tmp/tree"
  (cd "$SRC" && tar cf - common kernels kvstore ctl worker metrics gate) | (cd "$tmp/tree" && tar xf -)
  echo "#include \"$2\"" >> "$tmp/tree/$1"
  if out=$("$CHECK" "$tmp/tree" 2>&1); then
    echo "FAIL: $1 including $2 was accepted"; fails=$((fails + 1))
  elif ! grep -q "$3" <<<"$out"; then
    echo "FAIL: $1 including $2: message lacks '$3': $out"; fails=$((fails + 1))
  else
    echo "ok: $1 including $2 refused"
  fi
}
expect_violation worker/backend/backend_cpu.c policy_paged.h "from worker/kvcache/"
expect_violation kvstore/lib/client.c seq.h "from kvstore/daemon/"
expect_violation worker/serve/serve_batch.c cmd_common.h "from worker/cli/"
expect_violation worker/engine/engine.c serve_batch.h "from worker/serve/"
expect_violation kernels/rope.cuh backend.h "from worker/backend/"
expect_violation worker/kvcache/recall.c dataplane.h "from kvstore/daemon/"
expect_violation common/layout.c model.h "from worker/model/"
expect_violation metrics/prom.c router.h "from gate/"
expect_violation gate/router.c serve_batch.h "from worker/serve/"
[ $fails -eq 0 ]
