#!/usr/bin/env bash
# gpu-local.sh — run on the GPU machine binaries built HERE (CMake, sm_90a), so that a device
# call spends its seconds running instead of building (a build there costs ~2.5 of a call's
# ~4 minutes; a call with binaries built here took 27 s in the sixth session of 2026-12-04).
#
#   here:    scripts/gpu-local.sh pack NAME BUILD_DIR BIN...
#            each BIN of BUILD_DIR stripped and xz-compressed into $GPU_LOCAL_DIR/NAME/ (default
#            ab/NAME: untracked, so it travels with the working tree; ~4.6 MB a binary, the device
#            tool carries 64 MiB in all), with the shared libraries they need that the GPU
#            machine's image may lack (ldd; not glibc, libstdc++, libgcc or NCCL, which it has)
#   device:  scripts/gpu-local.sh run NAME 'COMMAND'
#            unpacks NAME once (into NAME/bin, NAME/lib), then runs COMMAND under bash with
#            DDT_BIN=that bin folder and LD_LIBRARY_PATH set (NAME/lib, the CUDA toolkit's, the
#            NCCL wheel's), e.g. 'python3 bench/e2e.py --build $DDT_BIN --backend cuda ...'
#   here:    scripts/gpu-ab.sh clean (or rm -rf ab) afterwards; never commit ab/
#
# Exit status: pack 2 on a usage error or a missing binary; run: COMMAND's.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=${GPU_LOCAL_DIR:-ab}
cmd=${1:-}
shift || true

# the libraries a binary needs that are not glibc's, the compiler runtime's or NCCL's
libs_of() {
  ldd "$1" | awk '/=> \//{print $3}' | while read -r l; do
    case $(basename "$l") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libnccl.so*) ;;
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
    rm -rf "$out" && mkdir -p "$out/lib"
    for b in "$@"; do
      [ -x "$build/$b" ] || { echo "gpu-local: no executable $build/$b"; exit 2; }
      strip -o "$out/$b" "$build/$b" || exit 2
      xz -6 -f "$out/$b" || exit 2
      for l in $(libs_of "$build/$b"); do cp -Ln "$l" "$out/lib/" 2>/dev/null; done
    done
    (cd "$out" && tar cf - lib | xz -6 > lib.tar.xz) && rm -rf "$out/lib"
    echo "gpu-local: $name: $* from $build -> $out ($(du -sh "$out" | cut -f1))"
    exit 0 ;;
  run)
    [ $# -ge 2 ] || { echo "usage: scripts/gpu-local.sh run NAME 'COMMAND'"; exit 2; }
    dir=$ROOT/$1
    [ -d "$dir" ] || { echo "gpu-local: no packed build $dir"; exit 2; }
    if [ ! -d "$dir/bin" ]; then
      # python's lzma and tarfile: no xz binary needed on the GPU machine
      python3 - "$dir" <<'EOF' || exit 2
import lzma, os, sys, tarfile
d = sys.argv[1]
os.makedirs(os.path.join(d, "bin"), exist_ok=True)
for f in os.listdir(d):
    if f.endswith(".xz") and f != "lib.tar.xz":
        dst = os.path.join(d, "bin", f[:-3])
        with lzma.open(os.path.join(d, f)) as src, open(dst, "wb") as out:
            out.write(src.read())
        os.chmod(dst, 0o755)
with tarfile.open(os.path.join(d, "lib.tar.xz")) as t:
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
    nc=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)
    [ -n "$nc" ] && lp=$lp:$nc/lib
    export LD_LIBRARY_PATH=$lp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    shift
    bash -c "$*"
    exit $? ;;
  *) echo "usage: scripts/gpu-local.sh pack NAME BUILD_DIR BIN... | run NAME 'COMMAND'"; exit 2 ;;
esac
