#!/usr/bin/env bash
# check_includes.sh [ROOT] — enforces the source layout's include rules (docs/architecture.md):
# every project header a file includes must live in its own folder or a floor below it.
#
#   worker/cli → serve → engine → kvcache → hostkv → backend → tokenizer → model → common
#   kernels/ under worker/backend; kvstore/daemon → kvstore/lib → common; ctl → kvstore/lib
#   gate → metrics → common (metrics/ also under kvstore/daemon, worker/serve and worker/cli)
#
# So no file outside worker/cli/ includes a command front-end, no backend includes a policy, and
# kvstore/lib/ includes no daemon header. The one exception is kvstore/daemon/embed.h, the
# embedding API, which worker/hostkv/ may include. Project headers are found by basename (they
# are unique; a duplicate is itself an error). Prints every violation; exits 1 if any.
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"

# Folder → folders it may include from (besides itself). "proto" is the generated protocol.
declare -A ALLOW=(
  [common]=""
  [metrics]="common"
  [gate]="metrics common proto"
  [kernels]="common"
  [kvstore/lib]="common proto"
  [kvstore/daemon]="kvstore/lib common proto metrics"
  [ctl]="kvstore/lib common proto"
  [worker/model]="common"
  [worker/tokenizer]="worker/model common"
  [worker/backend]="kernels worker/model common"
  [worker/hostkv]="worker/backend kernels worker/model common kvstore/lib proto"
  [worker/kvcache]="worker/hostkv worker/backend kernels worker/model common kvstore/lib proto"
  [worker/engine]="worker/kvcache worker/hostkv worker/backend kernels worker/model common kvstore/lib proto"
  [worker/serve]="metrics worker/engine worker/kvcache worker/hostkv worker/backend kernels worker/tokenizer worker/model common kvstore/lib proto"
  [worker/cli]="metrics worker/serve worker/engine worker/kvcache worker/hostkv worker/backend kernels worker/tokenizer worker/model common kvstore/lib proto"
)
# Single headers a folder may include from a folder otherwise above or beside it.
declare -A EXTRA=(
  [worker/hostkv]="kvstore/daemon/embed.h"
)

declare -A HOME_OF=()
status=0
for dir in "${!ALLOW[@]}"; do
  for h in "$dir"/*.h "$dir"/*.cuh; do
    [ -e "$h" ] || continue
    b=${h##*/}
    if [ -n "${HOME_OF[$b]:-}" ]; then
      echo "duplicate header name $b: ${HOME_OF[$b]}/$b and $h"
      status=1
    fi
    HOME_OF[$b]=$dir
  done
done

for dir in "${!ALLOW[@]}"; do
  allowed=" $dir ${ALLOW[$dir]} "
  for f in "$dir"/*.c "$dir"/*.h "$dir"/*.cu "$dir"/*.cuh; do
    [ -e "$f" ] || continue
    while IFS=: read -r line inc; do
      inc=${inc#*\"}
      inc=${inc%%\"*}
      if [[ $inc == proto/* ]]; then
        home=proto
      else
        home=${HOME_OF[${inc##*/}]:-}
        [ -n "$home" ] || continue # a system or generated header
      fi
      case "$allowed" in *" $home "*) continue ;; esac
      case " ${EXTRA[$dir]:-} " in *" $home/${inc##*/} "*) continue ;; esac
      echo "$f:$line: includes $inc from $home/, above or beside $dir/ (allowed: ${ALLOW[$dir]:-nothing})"
      status=1
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
  done
done

[ $status -eq 0 ] && echo "check_includes: ${#ALLOW[@]} folders, ${#HOME_OF[@]} headers, no include points up a floor"
exit $status
