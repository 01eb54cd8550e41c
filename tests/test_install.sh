#!/usr/bin/env bash
# test_install.sh BUILD_DIR PREFIX — `cmake --install` into a DESTDIR, then:
#   - the binaries, the default configuration, the docs, the sysusers.d and tmpfiles.d entries
#     are where the units expect them;
#   - every absolute path an installed unit names (ExecStart= binary, --config file,
#     Documentation=file://) exists in the DESTDIR tree;
#   - `systemd-analyze verify` accepts the installed units with no output at all (their
#     binaries pointed into the DESTDIR; skipped without systemd-analyze), and
#     `systemd-analyze security` rates each at an exposure of 2.5 or less;
#   - the installed kvstored accepts the installed kvstored.conf (--print-config).
#
# test_install.sh BUILD_DIR PREFIX deb — the same checks on the tree of the .deb that
# `cpack -G DEB` makes from the build (cmake/package.cmake), extracted with dpkg-deb, after
# checking its control data (package name, shared-library Depends, the postinst).
set -euo pipefail
B=$1 PREFIX=$2 MODE=${3:-install}
D=$(mktemp -d /tmp/fkv-install-XXXXXX)
trap 'rm -rf "$D" "$D.pkg"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

if [ "$MODE" = deb ]; then
  mkdir -p "$D.pkg"
  cpack --config "$B/CPackConfig.cmake" -G DEB -B "$D.pkg" >"$D.pkg/log" 2>&1 ||
    { cat "$D.pkg/log"; exit 1; }
  deb=$(ls "$D.pkg"/freekv_*.deb)
  echo "ok: built ${deb##*/} ($(stat -c %s "$deb") bytes)"
  ctl=$(dpkg-deb -f "$deb" Package Depends)
  grep -q '^Package: freekv$' <<<"$ctl" || bad "control: $ctl"
  for lib in libzmq5 libprotobuf-c1 liburing2 libopenblas0; do
    grep -q "$lib" <<<"$ctl" || bad "Depends lacks $lib: $ctl"
  done
  grep -q 'systemd-sysusers freekv.conf' <<<"$(dpkg-deb -I "$deb" postinst)" || bad "no postinst creating the user"
  dpkg-deb -x "$deb" "$D"
else
  DESTDIR=$D cmake --install "$B" >"$D.log" 2>&1 || { cat "$D.log"; rm -f "$D.log"; exit 1; }
  rm -f "$D.log"
fi
units=$D$PREFIX/lib/systemd/system
for f in "$units/kvstored.service" "$units/kvworker@.service" "$units/kvgate.service" \
         "$D$PREFIX/lib/sysusers.d/freekv.conf" "$D$PREFIX/lib/tmpfiles.d/freekv.conf" \
         "$D$PREFIX/share/man/man1/kvctl.1" "$D$PREFIX/share/man/man1/kvworker.1" \
         "$D$PREFIX/share/man/man8/kvstored.8" "$D$PREFIX/share/man/man8/kvgate.8" \
         "$D$PREFIX/share/bash-completion/completions/kvctl" \
         "$D$PREFIX/share/bash-completion/completions/kvworker"; do
  [ -f "$f" ] || bad "not installed: ${f#"$D"}"
done

# Every absolute path a unit names, outside the runtime and state directories systemd makes.
for u in "$units"/*.service; do
  name=${u##*/}
  grep -q '@[A-Z_]*@' "$u" && bad "$name: unconfigured @VARIABLE@ left: $(grep -o '@[A-Z_]*@' "$u" | head -1)"
  paths=$( { sed -n 's/^ExecStart=//p' "$u" | tr ' ' '\n' | grep '^/' || true;
             sed -n 's#^Documentation=file://##p' "$u"; } )
  [ -n "$paths" ] || bad "$name names no path"
  for p in $paths; do
    case $p in /run/*|/var/lib/*) continue ;; esac
    if [ -e "$D$p" ]; then echo "ok: $name names $p (installed)"; else bad "$name names $p, not installed"; fi
  done
  case $(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$u") in
    "$PREFIX"/*) ;;
    *) bad "$name: ExecStart= is not under the install prefix $PREFIX" ;;
  esac
done

if command -v systemd-analyze >/dev/null 2>&1; then
  V=$D/verify
  mkdir -p "$V"
  for u in "$units"/*.service; do
    sed "s#^ExecStart=$PREFIX/#ExecStart=$D$PREFIX/#" "$u" > "$V/${u##*/}"
  done
  cd "$V"
  for u in kvstored.service kvworker@0.service kvgate.service; do
    [ "$u" = kvworker@0.service ] && ln -sf kvworker@.service kvworker@0.service
    out=$(systemd-analyze verify --man=no "./$u" 2>&1) || bad "systemd-analyze verify $u failed: $out"
    [ -z "$out" ] && echo "ok: systemd-analyze verify $u" || bad "systemd-analyze verify $u said: $out"
  done
  # The exposure systemd-analyze security gives each unit: 2.5 at most (25 on its 0-100 scale).
  for u in kvstored.service kvworker@0.service kvgate.service; do
    score=$(systemd-analyze security --offline=yes --no-pager "./$u" 2>/dev/null | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    if systemd-analyze security --offline=yes --threshold=25 --no-pager "./$u" >/dev/null 2>&1; then
      echo "ok: systemd-analyze security $u: $score"
    else
      bad "systemd-analyze security $u: exposure $score, above 2.5"
    fi
  done
  cd - >/dev/null
else
  echo "skip: systemd-analyze not found (the path checks above ran)"
fi

# What the README's service steps run after the install: the sysusers.d entry makes the user and
# group, the tmpfiles.d entry the state directories (both into the DESTDIR with --root).
if command -v systemd-sysusers >/dev/null 2>&1 && command -v systemd-tmpfiles >/dev/null 2>&1; then
  mkdir -p "$D/etc"
  systemd-sysusers --root="$D" "$D$PREFIX/lib/sysusers.d/freekv.conf" >/dev/null 2>&1 ||
    bad "systemd-sysusers refuses freekv.conf"
  grep -q '^freekv:' "$D/etc/passwd" && grep -q '^freekv:' "$D/etc/group" ||
    bad "systemd-sysusers made no freekv user and group"
  systemd-tmpfiles --root="$D" --create "$D$PREFIX/lib/tmpfiles.d/freekv.conf" >/dev/null 2>&1 ||
    bad "systemd-tmpfiles refuses freekv.conf"
  [ "$(stat -c '%a %u' "$D/var/lib/freekv")" = "700 $(sed -n 's/^freekv:x:\([0-9]*\):.*/\1/p' "$D/etc/passwd")" ] ||
    bad "/var/lib/freekv is not 0700 and owned by freekv: $(stat -c '%a %U' "$D/var/lib/freekv")"
  [ -d "$D/var/lib/freekv/models" ] || bad "no /var/lib/freekv/models"
  echo "ok: sysusers.d and tmpfiles.d entries make the freekv user and /var/lib/freekv"
else
  echo "skip: systemd-sysusers/systemd-tmpfiles not found"
fi

conf=$(sed -n 's/^ExecStart=[^ ]* --config \([^ ]*\).*/\1/p' "$units/kvstored.service")
"$D$PREFIX/sbin/kvstored" --config "$D$conf" --print-config >/dev/null ||
  bad "the installed kvstored refuses the installed $conf"
exit $fail
