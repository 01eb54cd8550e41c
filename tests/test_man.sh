#!/usr/bin/env bash
# test_man.sh BUILD_DIR SOURCE_DIR — the man pages (docs/man/) render without a groff warning,
# and each documents every long option its binary's --help lists (kvworker: generate's,
# resume's and serve's, and every command), so that the pages cannot fall behind the binaries.
set -euo pipefail
B=$1 SRC=$2
for t in groff col; do
  command -v $t >/dev/null 2>&1 || { echo "skip: $t not found (Debian: groff-base, bsdextrautils)"; exit 77; }
done
fail=0
render() { groff -man -Tutf8 -ww "$1" 2>/dev/null | col -bx; }
check() { # page, help text
  local page=$1 help=$2 text opt
  text=$(render "$SRC/docs/man/$page")
  for opt in $(grep -o -- '--[a-z][a-z0-9-]*' <<<"$help" | sort -u); do
    grep -q -- "$opt" <<<"$text" || { echo "FAIL: $page does not document $opt"; fail=1; }
  done
}
for p in "$SRC"/docs/man/*.[18]; do
  w=$(groff -man -ww -z "$p" 2>&1)
  [ -z "$w" ] || { echo "FAIL: ${p##*/}: $w"; fail=1; }
done
check kvstored.8 "$("$B/kvstore/kvstored" --help)"
check kvctl.1 "$("$B/ctl/kvctl" --help)"
check kvgate.8 "$("$B/gate/kvgate" --help)"
for c in generate resume serve; do
  check kvworker.1 "$("$B/worker/kvworker" "$c" --help)"
done
text=$(render "$SRC/docs/man/kvworker.1")
for c in $("$B/worker/kvworker" --help | sed -n 's/^  \([a-z]*\) .*/\1/p'); do
  grep -Eq "^ {7}$c( |\$)" <<<"$text" || { echo "FAIL: kvworker.1 has no entry for command $c"; fail=1; }
done
[ $fail = 0 ] && echo "ok: 4 man pages render cleanly and document every option of --help"
exit $fail
