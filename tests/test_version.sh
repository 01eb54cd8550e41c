#!/usr/bin/env bash
# test_version.sh BUILD_DIR SOURCE_DIR — every binary answers --version with exit 0: its name,
# "(freekv) X.Y.Z" (the project version), the commit it was built from (that of the source
# tree, as `git describe` names it, when the tree is a git checkout) and the build; kvworker
# also the CUDA devices when the CUDA backend is built in.
set -euo pipefail
B=$1 SRC=$2
want_version=$(sed -n 's/^project(freekv VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$want_version" ] || { echo "no project version in $SRC/CMakeLists.txt"; exit 1; }
commit=unknown
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git -C "$SRC" rev-parse --short=12 HEAD)
fi
fail=0
for bin in kvstore/kvstored ctl/kvctl gate/kvgate worker/kvworker; do
  name=${bin##*/}
  if ! out=$("$B/$bin" --version 2>&1); then
    echo "FAIL: $name --version exited non-zero: $out"; fail=1; continue
  fi
  first=$(head -n1 <<<"$out")
  if [ "$first" != "$name (freekv) $want_version" ]; then
    echo "FAIL: $name --version first line '$first'"; fail=1
  fi
  if ! grep -q "^commit .*${commit}" <<<"$out"; then
    echo "FAIL: $name --version does not name commit $commit: $out"; fail=1
  fi
  if ! grep -Eq '^build [A-Za-z]*, CUDA (on|off)$' <<<"$out"; then
    echo "FAIL: $name --version has no build line: $out"; fail=1
  fi
  if [ "$name" = kvworker ] && grep -q 'CUDA on' <<<"$out" && ! grep -q '^CUDA devices: [0-9]' <<<"$out"; then
    echo "FAIL: kvworker --version built with CUDA names no device count: $out"; fail=1
  fi
  echo "ok: $name: $(tr '\n' ';' <<<"$out")"
done
exit $fail
