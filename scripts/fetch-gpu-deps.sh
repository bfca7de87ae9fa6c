#!/usr/bin/env bash
# fetch-gpu-deps.sh — downloads (here, where Debian's archive is reachable) the
# jansson and PCRE2 packages that scripts/gpu-env.sh unpacks on the GPU machine,
# which can reach no package registry.  Output: .gpudeps/*.deb (git-ignored; the
# device tool carries it with carry: [".gpudeps"]).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
cd .gpudeps
apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0
