#!/usr/bin/env bash
# test_progress.sh BUILD_DIR MODEL CORPUS — kvworker generate writes a progress line (tokens,
# tok/s, time left) for a long prefill and for a long generation whose text is not on the
# terminal, only when stderr is a terminal (a pseudo-terminal from script(1)), and none when it
# is not; the tokens are the same either way. Skipped (77) without script(1).
set -euo pipefail
B=$1 M=$2 CORPUS=$3
command -v script >/dev/null 2>&1 || { echo "skip: no script(1) (Debian: bsdutils)"; exit 77; }
D=$(mktemp -d /tmp/fkv-progress-XXXXXX)
trap 'rm -rf "$D"' EXIT
head -c 3000 "$CORPUS" > "$D/prompt.txt"
run=("$B/worker/kvworker" generate -m "$M" -f "$D/prompt.txt" -n 300 --temp 0 --ids -t 1)
# stderr on a pseudo-terminal, stdout to a file.
script -qec "$(printf '%q ' "${run[@]}") > $D/tty.out" "$D/tty.log" >/dev/null
# Neither on a terminal.
"${run[@]}" > "$D/plain.out" 2> "$D/plain.err"
fail=0
grep -q 'prefill: [0-9]*/[0-9]* tokens, [0-9]* tok/s' "$D/tty.log" || { echo "FAIL: no prefill progress on a terminal: $(tr '\r' '\n' < "$D/tty.log" | head -5)"; fail=1; }
grep -q 'generate: 300/300 tokens' "$D/tty.log" || { echo "FAIL: no generation progress on a terminal"; fail=1; }
if grep -q 'tok/s' "$D/plain.err"; then echo "FAIL: progress written when stderr is not a terminal"; fail=1; fi
cmp -s "$D/tty.out" "$D/plain.out" || { echo "FAIL: the tokens differ with and without the progress line"; fail=1; }
[ -s "$D/plain.out" ] || { echo "FAIL: no tokens"; fail=1; }
[ $fail = 0 ] && echo "ok: progress on a terminal only; same tokens"
exit $fail
