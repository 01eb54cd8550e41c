#!/bin/sh
# test_pretok_hf (label slow): regenerates tests/data/pretok/pretok_cases.json with Hugging Face
# tokenizers in a venv under the build folder and diffs it with the committed one, so the ids
# test_pretok checks offline are HF's. Usage: check_hf.sh VENV_DIR SOURCE_DIR.
# Exits 77 (skipped) when the venv or tokenizers cannot be had (no python3 venv, no PyPI).
set -u
venv=$1
src=$2
# The version the committed ids came from; a newer one must give the same ids (the check says
# which case differs when it does not).
want=tokenizers==0.23.3
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
	if ! python3 -m venv "$venv"; then
		echo "test_pretok_hf: skipped: python3 -m venv $venv failed (python3-venv missing?)"
		exit 77
	fi
	if ! "$venv/bin/pip" install --quiet "$want"; then
		echo "test_pretok_hf: skipped: pip install $want failed (no PyPI?)"
		exit 77
	fi
fi
exec "$venv/bin/python" "$src/tests/pretok/make_pretok_cases.py" check \
	"$src/tests/data/pretok/llama_pre.json" "$src/tests/data/pretok/pretok_cases.json"
