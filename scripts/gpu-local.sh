#!/usr/bin/env bash
# gpu-local.sh — run on the GPU machine binaries built HERE (CMake, sm_90a), so that a device
# call spends its seconds running instead of building (a build there costs ~2.5 of a call's
# ~4 minutes; a call with binaries built here took 27 s in the sixth session of 2026-12-04).
#
#   here:    scripts/gpu-local.sh pack NAME BUILD_DIR BIN...
#            each BIN of BUILD_DIR stripped, all in one xz archive $GPU_LOCAL_DIR/NAME/pack.tar.xz
#            (default ab/NAME: untracked, so it travels with the working tree; ~8 MB for all 25
#            binaries, the device tool carries 64 MiB in all), with the shared libraries they
#            need that the GPU machine's image may lack (ldd; not glibc, libstdc++, libgcc, NCCL
#            or cuBLAS, which it has)
#   here:    scripts/gpu-local.sh merge
#            every pack under $GPU_LOCAL_DIR in one solid archive, all.tar.xz (and into it, if one is
#            there): the builds share most of their bytes, which xz finds across them with a
#            dictionary as large as the binaries (five builds of 20 binaries: 8.8 MB against 8.2
#            MB for one).  The device tool carries 64 MiB and the working tree with the models is
#            ~40 MB, so more than two per-build packs do not travel; merged, five do
#            (GPU_LOCAL_XZ_PRESET: xz's preset, 6 unless set, with a 256 MiB dictionary either way:
#            the dictionary finds the builds' shared bytes, the preset only the effort; five builds
#            merged at 6 in 31 s into 5.6 MB, where 9e took minutes for two; the tests take 0)
#   device:  scripts/gpu-local.sh run NAME 'COMMAND'
#            unpacks NAME once (into NAME/bin, NAME/lib; from all.tar.xz where NAME has no pack of
#            its own), then runs COMMAND under bash with
#            DDT_BIN=that bin folder and LD_LIBRARY_PATH set (NAME/lib, the CUDA toolkit's, the
#            NCCL and cuBLAS wheels'), e.g. 'python3 bench/e2e.py --build $DDT_BIN --backend cuda ...'
#   here:    scripts/gpu-ab.sh clean (or rm -rf ab) afterwards; never commit ab/
#
# Exit status: pack 2 on a usage error or a missing binary; merge 2 with no packs; run: COMMAND's.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=${GPU_LOCAL_DIR:-ab}
cmd=${1:-}
shift || true

# the libraries a binary needs that are not glibc's, the compiler runtime's, NCCL's or cuBLAS's
# (cuBLAS is ~500 MB; the GPU machine has it as the nvidia-cublas wheel and in its toolkit)
libs_of() {
  ldd "$1" | awk '/=> \//{print $3}' | while read -r l; do
    case $(basename "$l") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libnccl.so*|libcublas*) ;;
      *) echo "$l" ;;
    esac
  done
}

case $cmd in
  pack)
    [ $# -ge 3 ] || { echo "usage: scripts/gpu-local.sh pack NAME BUILD_DIR BIN..."; exit 2; }
    name=$1 build=$2
    shift 2
    out=$ROOT/$name
    rm -rf "$out" && mkdir -p "$out/lib" "$out/bin"
    for b in "$@"; do
      [ -x "$build/$b" ] || { echo "gpu-local: no executable $build/$b"; rm -rf "$out"; exit 2; }
      strip -o "$out/bin/$b" "$build/$b" || exit 2
      for l in $(libs_of "$build/$b"); do cp -Ln "$l" "$out/lib/" 2>/dev/null; done
    done
    # one solid archive: the binaries share most of their bytes (the CUDA fatbin), which xz's
    # 64 MiB dictionary finds across files (25 binaries: 147 MB -> 5.7 MB; one .xz each: ~115)
    (cd "$out" && tar cf - bin lib | xz -9 -T1 > pack.tar.xz) && rm -rf "$out/lib" "$out/bin"
    echo "gpu-local: $name: $* from $build -> $out ($(du -sh "$out" | cut -f1))"
    exit 0 ;;
  merge)
    packs=("$ROOT"/*/pack.tar.xz)
    [ -e "${packs[0]}" ] || { echo "gpu-local: no packs under $ROOT"; exit 2; }
    tmp=$(mktemp -d) && mkdir "$tmp/t" || exit 2
    if [ -f "$ROOT/all.tar.xz" ]; then tar xJf "$ROOT/all.tar.xz" -C "$tmp/t" || exit 2; fi
    for p in "${packs[@]}"; do
      n=$(basename "$(dirname "$p")")
      rm -rf "${tmp:?}/t/$n" && mkdir -p "$tmp/t/$n" && tar xJf "$p" -C "$tmp/t/$n" || exit 2
    done
    # files ordered by name, so each binary's builds sit next to each other in the stream
    (cd "$tmp/t" && find . -type f | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2 > "$tmp/list" &&
      tar cf - -T "$tmp/list" | xz -T1 --lzma2="preset=${GPU_LOCAL_XZ_PRESET:-6},dict=256MiB" > "$tmp/all.tar.xz") ||
      exit 2
    mv "$tmp/all.tar.xz" "$ROOT/all.tar.xz" && rm -rf "$tmp"
    for p in "${packs[@]}"; do rm -rf "$(dirname "$p")"; done
    echo "gpu-local: $ROOT/all.tar.xz holds $(tar tJf "$ROOT/all.tar.xz" | cut -d/ -f2 | sort -u | tr '\n' ' ')($(du -sh "$ROOT/all.tar.xz" | cut -f1))"
    exit 0 ;;
  run)
    [ $# -ge 2 ] || { echo "usage: scripts/gpu-local.sh run NAME 'COMMAND'"; exit 2; }
    dir=$ROOT/$1
    if [ ! -d "$dir" ] && [ -f "$ROOT/all.tar.xz" ]; then
      python3 - "$ROOT" <<'EOF' || exit 2
import os, sys, tarfile
with tarfile.open(os.path.join(sys.argv[1], "all.tar.xz")) as t:
    t.extractall(sys.argv[1])
EOF
    fi
    [ -d "$dir" ] || { echo "gpu-local: no packed build $dir"; exit 2; }
    if [ ! -d "$dir/bin" ]; then
      # python's tarfile: no xz binary needed on the GPU machine
      python3 - "$dir" <<'EOF' || exit 2
import os, sys, tarfile
d = sys.argv[1]
with tarfile.open(os.path.join(d, "pack.tar.xz")) as t:
    t.extractall(d)
EOF
    fi
    DDT_BIN=$(cd "$dir/bin" && pwd)
    export DDT_BIN
    lp=$(cd "$dir/lib" && pwd)
    if command -v nvcc > /dev/null; then
      ch=$(dirname "$(dirname "$(command -v nvcc)")")
      lp=$lp:$ch/lib64:$ch/lib
    fi
    for w in nccl cublas; do
      nc=$(python3 -c "import nvidia.$w as m; print(list(m.__path__)[0])" 2>/dev/null)
      [ -n "$nc" ] && lp=$lp:$nc/lib
    done
    export LD_LIBRARY_PATH=$lp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    shift
    bash -c "$*"
    exit $? ;;
  *) echo "usage: scripts/gpu-local.sh pack NAME BUILD_DIR BIN... | merge | run NAME 'COMMAND'"; exit 2 ;;
esac
