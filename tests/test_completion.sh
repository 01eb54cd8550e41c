#!/usr/bin/env bash
# test_completion.sh BUILD_DIR SOURCE_DIR — the bash completion of kvctl and kvworker
# (scripts/completion/) offers the verbs, the commands, each command's flags (read from the
# binary's --help) and the values of --policy, --backend and --preset. Skipped (77) without
# bash-completion.
B=$1 SRC=$2
bc=/usr/share/bash-completion/bash_completion
[ -r "$bc" ] || { echo "skip: no $bc (Debian: bash-completion)"; exit 77; }
# shellcheck disable=SC1090
. "$bc"
. "$SRC/scripts/completion/kvctl"
. "$SRC/scripts/completion/kvworker"
fail=0
# complete_words FUNC WORD... : COMPREPLY for the last word (the one being typed).
complete_words() {
	local fn=$1
	shift
	COMP_WORDS=("$@")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMP_LINE="$*"
	COMP_POINT=${#COMP_LINE}
	COMPREPLY=()
	"$fn"
	printf '%s\n' "${COMPREPLY[@]}"
}
expect() { # what, got, want...
	local what=$1 got=$2
	shift 2
	for w in "$@"; do
		grep -qx -- "$w" <<<"$got" || { echo "FAIL: $what: no '$w' in: $(tr '\n' ' ' <<<"$got")"; fail=1; }
	done
}
expect "kvctl verbs" "$(complete_words _kvctl "$B/ctl/kvctl" "")" status ls show evict config watch --json
expect "kvctl after an option" "$(complete_words _kvctl "$B/ctl/kvctl" -e ipc:///x "s")" status show stats
expect "kvctl evict flags" "$(complete_words _kvctl "$B/ctl/kvctl" evict "--")" --worker --detached --demote
expect "kvworker commands" "$(complete_words _kvworker "$B/worker/kvworker" "")" generate resume serve info
expect "kvworker generate flags" "$(complete_words _kvworker "$B/worker/kvworker" generate "--")" \
	--model --policy --store --keep --budget
expect "kvworker serve flags" "$(complete_words _kvworker "$B/worker/kvworker" serve "--m")" --max-seqs --metrics
expect "--policy values" "$(complete_words _kvworker "$B/worker/kvworker" generate --policy "")" \
	full freekv quest hardkv refreshkv specache streaming
expect "--backend values" "$(complete_words _kvworker "$B/worker/kvworker" eval --backend "")" auto cpu cuda
expect "synth presets" "$(complete_words _kvworker "$B/worker/kvworker" synth --preset "")" llama-3.1-8b tiny
[ $fail = 0 ] && echo "ok: kvctl and kvworker completion"
exit $fail
