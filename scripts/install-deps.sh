#!/usr/bin/env bash
# install-deps.sh — installs what building and testing ddtree needs on Debian:
# the -dev packages (Jansson, PCRE2, cmocka, libmicrohttpd), the compilers and tools,
# and the PyPI packages of the Python tests (numpy, pytest, tiktoken, tokenizers, openai,
# jinja2).  Idempotent: it installs only what is missing.  Usage: scripts/install-deps.sh [--tests]
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libcmocka-dev libmicrohttpd-dev)
if [[ "${1:-}" == "--tests" ]]; then
  pkgs+=(clang libclang-rt-dev python3 python3-pip xz-utils) # xz: scripts/gpu-local.sh's test
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [[ "${1:-}" == "--tests" ]]; then
  python3 -c "import numpy, pytest, tiktoken, tokenizers, openai, jinja2" 2>/dev/null || \
    python3 -m pip install -q -r "$(dirname "$0")/../tests/requirements.txt"
fi
