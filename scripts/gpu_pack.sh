#!/usr/bin/env bash
# scripts/gpu_pack.sh — builds here (nvcc and the Debian libraries present, no GPU needed)
# everything bench/gpu/run.sh runs on a GPU machine, and packs it for a machine that has the
# NVIDIA driver and the CUDA toolkit but no network, no apt and none of the Debian libraries:
#   BUILD (default build-gpu/)  configured with FREEKV_CUDA=ON for sm_90 (H100/H200), the tree's
#                               other defaults (RelWithDebInfo, no sanitizers);
#   PACK (default .gpupack/)    bin/     the executables, in the build's layout (tests/, worker/,
#                                        bench/), debug sections stripped (symbols kept, for
#                                        compute-sanitizer's backtraces), gzip-compressed for
#                                        run.sh to unpack;
#                               lib/     every shared library they load, per readelf/ldd, except
#                                        glibc's, the driver's and the toolkit's libcudart /
#                                        libcublas / libcublasLt (the device has CUDA 13),
#                                        gzip-compressed (OpenBLAS alone is 36 MB; gzip is in
#                                        every base image) for run.sh to unpack; lib/compat/
#                                        holds libstdc++ and libgcc_s, which run.sh uses only
#                                        where the machine has none;
#                               models/  stories260K/stories260K.gguf (the only model file the
#                                        GPU tests and kvworker's decode step read);
#                               manifest.txt  commit, date, nvcc, glibc needed, contents.
# Both directories are git-ignored; the pack travels as the carried path .gpupack. Fails when
# what would travel (tracked and untracked-not-ignored files plus the pack) exceeds MAX_MIB
# (default 60), since the device tool takes 64 MiB in all.
# Usage: scripts/gpu_pack.sh [--build DIR] [--pack DIR] [--jobs N]
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$SRC/build-gpu
PACK=$SRC/.gpupack
JOBS=$(nproc)
MAX_MIB=${MAX_MIB:-60}
MODELS=${FREEKV_MODELS_DIR:-$SRC/tests/data/models}
MODEL_FILES=(stories260K/stories260K.gguf)

die() {
  echo "gpu_pack: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case $1 in
  --build) BUILD=${2:?--build needs a directory}; shift ;;
  --pack) PACK=${2:?--pack needs a directory}; shift ;;
  --jobs) JOBS=${2:?--jobs needs a number}; shift ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
  shift
done

# Libraries that stay behind: glibc's (the machine's own loader must match them), the
# driver's, and the CUDA toolkit's (found there in /usr/local/cuda or python3's nvidia wheels).
left_behind() {
  case $1 in
  linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
    librt.so.* | libresolv.so.* | libcuda.so.* | libnvidia-*.so* | libcudart.so.* | \
    libcublas.so.* | libcublasLt.so.*) return 0 ;;
  esac
  return 1
}
# The C++/GCC runtime: present on nearly every machine and newer there; packed as a fallback.
is_compat() { case $1 in libstdc++.so.* | libgcc_s.so.*) return 0 ;; esac; return 1; }

echo "gpu_pack: configure $BUILD"
mkdir -p "$BUILD"
cmake -S "$SRC" -B "$BUILD" -DFREEKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFREEKV_SANITIZE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/gpu_pack.configure.log" 2>&1 ||
  { tail -n 30 "$BUILD/gpu_pack.configure.log"; die "configure failed (log in $BUILD)"; }
mapfile -t BINS < <("$SRC/bench/gpu/run.sh" --build "$BUILD" --list-binaries)
[ ${#BINS[@]} -gt 0 ] || die "run.sh --list-binaries named nothing"
echo "gpu_pack: build ${#BINS[@]} executables with $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS" --target "${BINS[@]##*/}"

tmp=$PACK.tmp
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/lib/compat" "$tmp/models"
trap 'rm -rf "$tmp"' EXIT

for b in "${BINS[@]}"; do
  [ -x "$BUILD/$b" ] || die "$BUILD/$b was not built"
  install -D -m 755 "$BUILD/$b" "$tmp/bin/$b"
  strip --strip-debug "$tmp/bin/$b"
done
# The sizes for the manifest, then the executables gzip-compressed too (each carries the
# kernels' device code: 40 MB for the lot, 4 MB each, about a quarter of that compressed).
declare -A bin_size=()
for b in "${BINS[@]}"; do bin_size[$b]=$(stat -c %s "$tmp/bin/$b"); done
find "$tmp/bin" -type f -exec gzip -9 -n {} +

# The libraries: a walk over DT_NEEDED from the executables, each name resolved where ldd
# resolves it for them, stopping at the libraries that stay behind (so what only they need,
# such as cuBLAS's own dependencies, is not packed).
declare -A where=() packed=() behind=()
for b in "${BINS[@]}"; do
  if grep -q 'not found' <<<"$(ldd "$BUILD/$b")"; then
    ldd "$BUILD/$b" | grep 'not found' >&2
    die "$b has unresolved libraries here"
  fi
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] && where[$name]=$path
  done < <(ldd "$BUILD/$b")
done
queue=("${BINS[@]/#/$BUILD/}")
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  for name in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if left_behind "$name"; then
      behind[$name]=1
      continue
    fi
    [ -n "${packed[$name]:-}" ] && continue
    path=${where[$name]:-}
    [ -n "$path" ] || die "$name (needed by $f) is not resolved by ldd"
    dest=$tmp/lib
    is_compat "$name" && dest=$tmp/lib/compat
    gzip -9 -n -c "$path" >"$dest/$name.gz"
    packed[$name]=$path
    queue+=("$path")
  done
done

for m in "${MODEL_FILES[@]}"; do
  [ -f "$MODELS/$m" ] || die "model file $MODELS/$m not found (set FREEKV_MODELS_DIR)"
  install -D -m 644 "$MODELS/$m" "$tmp/models/$m"
done

# The newest glibc symbol version anything packed needs: the GPU machine's glibc must be as new.
glibc=$({
  for b in "${BINS[@]}"; do objdump -T "$BUILD/$b"; done
  for name in "${!packed[@]}"; do objdump -T "${packed[$name]}"; done
} 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)
{
  echo "commit: $(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)$(
    git -C "$SRC" diff --quiet HEAD 2>/dev/null || echo " + uncommitted changes (diff sha256 $(
      git -C "$SRC" diff HEAD | sha256sum | cut -c1-16))")"
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' \
    "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake | head -n1)
  echo "nvcc: $nvcc, $("$nvcc" --version | tail -n1)"
  echo "built on: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), $(ldd --version | head -n1)"
  echo "glibc needed: >= ${glibc#GLIBC_}"
  echo "cmake: -DFREEKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo"
  echo "left behind (the device's own): $(printf '%s\n' "${!behind[@]}" | sort | tr '\n' ' ')"
  for b in "${BINS[@]}"; do echo "bin: $b ${bin_size[$b]}"; done
  for name in $(printf '%s\n' "${!packed[@]}" | sort); do
    echo "lib: $name ${packed[$name]}"
  done
  for m in "${MODEL_FILES[@]}"; do echo "model: $m $(sha256sum <"$tmp/models/$m" | cut -c1-16)"; done
} >"$tmp/manifest.txt"

# What the device tool sends: the tracked and untracked-not-ignored files, and the pack.
tree_bytes=$(git -C "$SRC" ls-files -z --cached --others --exclude-standard |
  (cd "$SRC" && xargs -0 -r stat -c %s 2>/dev/null) | awk '{ s += $1 } END { print s + 0 }')
pack_bytes=$(du -sb "$tmp" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu_pack: tree $(mib "$tree_bytes") + pack $(mib "$pack_bytes")" \
  "(bin $(mib "$(du -sb "$tmp/bin" | cut -f1)"), lib $(mib "$(du -sb "$tmp/lib" | cut -f1)"))" \
  "= $(mib $((tree_bytes + pack_bytes))) to travel, limit $MAX_MIB MiB"
if [ $((tree_bytes + pack_bytes)) -gt $((MAX_MIB * 1048576)) ]; then
  du -ab "$tmp" | sort -rn | sed -n '2,11p' >&2
  die "over $MAX_MIB MiB: the device tool takes 64 MiB in all; nothing was replaced at $PACK"
fi

rm -rf "$PACK"
mv "$tmp" "$PACK"
trap - EXIT
echo "gpu_pack: $PACK ready ($(grep -c '^bin:' "$PACK/manifest.txt") executables," \
  "${#packed[@]} libraries); on the GPU machine: bench/gpu/run.sh --pack .gpupack"
