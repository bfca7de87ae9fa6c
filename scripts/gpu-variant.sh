#!/usr/bin/env bash
# gpu-variant.sh — a compile-time variant of the CUDA benchmarks without a second build tree:
# one source of libddt_cuda rebuilt with extra -D flags (the CMake build's own nvcc flags and
# includes), put into a copy of libddt_cuda.a, and the named programs relinked against that copy,
# into $GPU_VARIANT_DIR/NAME (default ab/var/NAME: untracked).  Seconds to a minute for one source on the 2-core machine,
# where a second build tree takes ~6 minutes.  Then pack it for the GPU like any build:
#     scripts/gpu-variant.sh bps1 src/backend/cuda/mla_verify_cuda.cu "-DDDT_MLA_MIN_BPS=1" cuda_bench_mla cuda_bench_k26
#     scripts/gpu-local.sh pack vbps1 ab/var/bps1 cuda_bench_mla cuda_bench_k26
# PROGRAMs are CMake targets (ddtree_cli makes ddtree); each keeps its binary's name.  BUILD
# (default build) is a configured and built CMake tree of this checkout, with the CUDA backend.
# Exit status: 2 on a usage error or a missing build, else the compiler's or linker's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: scripts/gpu-variant.sh NAME SOURCE.cu \"-DFLAGS...\" PROGRAM..."; exit 2; }
name=$1 src=$2 defs=$3
shift 3
root=$(pwd)
build=$(cd "${BUILD:-build}" && pwd) || exit 2
dir=$build/CMakeFiles/ddt_cuda.dir
if [ ! -f "$dir/flags.make" ] || [ ! -f "$build/libddt_cuda.a" ] || [ ! -f "$root/$src" ]; then
  echo "gpu-variant: no built CMake tree at $build, or no source $src"
  exit 2
fi
out=${GPU_VARIANT_DIR:-$root/ab/var}/$name
rm -rf "$out" && mkdir -p "$out"
# the build's own compiler, defines and flags (flags.make), and each program's own link line
nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
flags="$(sed -n 's/^CUDA_DEFINES = //p' "$dir/flags.make") $(sed -n 's/^CUDA_FLAGS = //p' "$dir/flags.make")"
obj=$(basename "$src").o # the archive's member name (CMake names objects source.cu.o)
# shellcheck disable=SC2086 # flags and defs are word lists
(cd "$build" && "${nvcc:-nvcc}" -forward-unknown-to-host-compiler --options-file "$dir/includes_CUDA.rsp" $flags $defs \
  -x cu -c "$root/$src" -o "$out/$obj")
cp "$build/libddt_cuda.a" "$out/libddt_cuda.a"
(cd "$out" && ar r libddt_cuda.a "$obj" && rm "$obj")
for p in "$@"; do
  link=$build/CMakeFiles/$p.dir
  if [ ! -f "$link/linkLibs.rsp" ] || [ ! -f "$link/link.txt" ]; then
    echo "gpu-variant: no program $p in $build"
    exit 2
  fi
  bin=$(sed -n 's/.* -o \([^ ]*\) .*/\1/p' "$link/link.txt")
  sed "s# libddt_cuda.a # $out/libddt_cuda.a #" "$link/linkLibs.rsp" > "$out/$p.rsp"
  # link.txt's command with the output and the library list moved to the variant's
  sed "s# -o $bin # -o $out/$bin #; s#@CMakeFiles/$p.dir/linkLibs.rsp#@$out/$p.rsp#" "$link/link.txt" > "$out/$p.link"
  (cd "$build" && bash "$out/$p.link")
  rm "$out/$p.rsp" "$out/$p.link"
done
echo "gpu-variant: $name: $src with $defs -> $out ($*)"
