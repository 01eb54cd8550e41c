#!/usr/bin/env bash
# Installs, with apt, only the Debian packages freekv needs that are missing, then makes the
# project virtualenv (.venv, scripts/venv.sh: the openai client from PyPI, for the kvgate tests
# and benchmark). Idempotent: runs `apt-get update` only when something must be installed and
# pip only when the virtualenv lacks the pinned openai; prints what it did. CUDA is not installed here: the build uses /usr/local/cuda (or CUDAToolkit_ROOT) when
# present and builds without it otherwise.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
  liburing-dev libcmocka-dev libopenblas-dev libpcre2-dev libjson-c-dev libssl-dev libutf8proc-dev
  libmicrohttpd-dev uthash-dev libhiredis-dev
  # test_remote: two kvstored "hosts" share a real Redis
  redis-server redis-tools
  fio
  # test_pretok_hf (HF tokenizers) and the kvgate tests: Python virtualenvs, curl, promtool
  python3 python3-venv curl prometheus
  # test_completion (the bash completion scripts), test_man (groff renders the man pages)
  bash-completion groff-base bsdextrautils
  # test_unit_syscalls: every system call the daemons make, against their units' filters
  strace
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
    missing+=("$p")
  fi
done

venv() { "$(dirname "$0")/venv.sh"; }

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  venv
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "bootstrap: missing ${missing[*]} and not root (no sudo): install them and retry" >&2
    exit 1
  fi
fi
echo "bootstrap: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: installed ${#missing[@]} package(s)"
venv
