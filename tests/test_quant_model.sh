#!/usr/bin/env bash
# test_quant_model.sh — quantized models end to end, with the `gguf` Python package (ggml's own
# quantizers and dequantizers):
#   1. common/quant.c's reference dequantization equals gguf.quants.dequantize bit for bit, on
#      random blocks of every format (scripts/gguf_quantize.py --check-dequant);
#   2. stories260K converted to Q8_0 (scripts/gguf_quantize.py) loads as it is (kvworker info
#      lists Q8_0 tensors), its 16 greedy tokens equal the F32 model's, and its perplexity on
#      tests/data/stories_corpus.txt is within 1% of the F32 model's.
# The venv: $FREEKV_TEST_VENV when set, else BUILD/tests/quant-venv made with pip (gguf, numpy);
# skipped (77) only when no venv can be made.
# usage: test_quant_model.sh SOURCE_DIR BUILD_DIR KVWORKER QUANT_REF_LIB
set -euo pipefail
src=$1 build=$2 kvw=$3 lib=$4

venv=${FREEKV_TEST_VENV:-$build/tests/quant-venv}
if ! "$venv/bin/python" -c 'import gguf, numpy' 2>/dev/null; then
	if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q gguf numpy; } >"$build/tests/quant-venv.log" 2>&1; then
		echo "skip: cannot make a Python venv with gguf and numpy (see $build/tests/quant-venv.log)"
		exit 77
	fi
fi
py=$venv/bin/python

tmp=$(mktemp -d /tmp/freekv-qmodel-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# A sanitizer build's library needs its runtime loaded before Python's own libraries.
preload=
for rt in asan ubsan; do
	so=$(ldd "$lib" 2>/dev/null | awk -v rt="lib$rt" '$1 ~ rt { print $3; exit }')
	[ -n "$so" ] && preload="${preload:+$preload:}$so"
done
# Python itself leaks by LeakSanitizer's measure: only the checks on our library count here.
LD_PRELOAD=$preload ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 \
	"$py" "$src/scripts/gguf_quantize.py" --check-dequant "$lib"

f32=$src/tests/data/models/stories260K/stories260K.gguf
q8=$tmp/stories260K-q8_0.gguf
"$py" "$src/scripts/gguf_quantize.py" "$f32" "$q8" Q8_0

info=$("$kvw" info -m "$q8")
echo "$info" | grep -E '^tensors:'
grep -qE '^tensors: .*Q8_0 [0-9]+' <<<"$info" || { echo "FAIL: kvworker info lists no Q8_0 tensors"; exit 1; }

run() { "$kvw" "$@" --backend cpu -t 2; }
g_f32=$(run generate -m "$f32" -p "Once upon a time" -n 16 --temp 0 --ids)
g_q8=$(run generate -m "$q8" -p "Once upon a time" -n 16 --temp 0 --ids)
echo "greedy F32:  $g_f32"
echo "greedy Q8_0: $g_q8"
[ "$(echo "$g_f32" | wc -w)" -eq 16 ] || { echo "FAIL: expected 16 tokens"; exit 1; }
[ "$g_f32" = "$g_q8" ] || { echo "FAIL: greedy tokens differ"; exit 1; }

text=$src/tests/data/stories_corpus.txt
p_f32=$(run perplexity -m "$f32" -f "$text" | sed -n 's/^perplexity: //p')
p_q8=$(run perplexity -m "$q8" -f "$text" | sed -n 's/^perplexity: //p')
echo "perplexity F32 $p_f32, Q8_0 $p_q8"
awk -v a="$p_f32" -v b="$p_q8" 'BEGIN { r = (b - a) / a; if (r < 0) r = -r;
	printf "relative difference %.5f (limit 0.01)\n", r; exit !(a > 1 && r < 0.01) }' ||
	{ echo "FAIL: perplexity differs by 1% or more"; exit 1; }
echo "ok"
