#!/bin/sh
# make_corpus.sh — regenerates tests/data/stories_corpus.txt, the evaluation corpus of
# `kvworker eval` (docs/eval.md), byte for byte.
#
# The corpus is text written by stories260K itself: one story per (prompt, seed) pair below,
# sampled with `kvworker generate` (temperature 0.8, top-k 40, top-p 0.95, 400 tokens, one
# compute thread so that the floating-point summation order is fixed). Each story is its prompt
# followed by the sampled continuation (which kvworker ends with a newline), and stories are
# separated by one blank line. The generator does not stop at the end of a story (the model has
# no EOS habit), so a "story" may run into the start of the next one the model invents; that is
# part of the text. Floating-point results can differ on another CPU (OpenBLAS picks kernels by
# instruction set); the sha256 in docs/eval.md is what this machine produced.
#
# usage: scripts/make_corpus.sh [KVWORKER] [MODEL] [OUT]
#   KVWORKER  the kvworker binary (default: build/worker/kvworker)
#   MODEL     stories260K (default: tests/data/models/stories260K/stories260K.gguf)
#   OUT       output file (default: tests/data/stories_corpus.txt)
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
kvworker=${1:-$here/build/worker/kvworker}
model=${2:-$here/tests/data/models/stories260K/stories260K.gguf}
out=${3:-$here/tests/data/stories_corpus.txt}

# seed|prompt — six different openings, one fixed seed each.
stories='11|Once upon a time
22|One day, a little girl named Lily
33|Tom and his dog went to the park
44|There was a big red ball
55|Mom said it was time for bed
66|The little bird could not fly'

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
first=1
printf '%s\n' "$stories" | while IFS='|' read -r seed prompt; do
	[ "$first" = 1 ] || printf '\n' >>"$tmp"
	first=0
	printf '%s' "$prompt" >>"$tmp"
	"$kvworker" generate -m "$model" -p "$prompt" -n 400 --temp 0.8 --top-k 40 \
		--top-p 0.95 --seed "$seed" -t 1 >>"$tmp"
done
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out ($(wc -c <"$out") bytes)"
