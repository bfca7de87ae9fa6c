# gpu-env.sh — sourced by the scripts that build on the GPU machine (which has
# nvcc and gcc but none of the Debian -dev packages): unpacks the jansson and
# PCRE2 packages carried in .gpudeps/ (scripts/fetch-gpu-deps.sh fetches them)
# into /tmp/ddt-deps and sets the flags every GPU build uses:
#   CFLAGS   gcc flags for the C sources      NVFLAGS  nvcc flags for src/backend/cuda
#   LIBS     link line (CUDA runtime, cuBLAS, static jansson + PCRE2)
#   ddt_nvcc_objs DIR   compile every src/backend/cuda/*.cu into DIR (in parallel)
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
DEPS=/tmp/ddt-deps
if [ -d .gpudeps ] && [ ! -d "$DEPS/usr" ]; then
  mkdir -p "$DEPS"
  for f in .gpudeps/*.deb; do dpkg -x "$f" "$DEPS"; done
fi
DEPLIB=$DEPS/usr/lib/x86_64-linux-gnu
CFLAGS="-std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -ffp-contract=off -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -I$CUDA_HOME/include -I$DEPS/usr/include"
NVFLAGS="-std=c++17 -O3 -arch=sm_90a --fmad=false -Iinclude -Isrc -Xcompiler -Wall"
LIBS="-L$CUDA_HOME/lib64 -lcublas -lcudart $DEPLIB/libjansson.a $DEPLIB/libpcre2-8.a -lm -lstdc++ -lpthread -ldl -lrt"
ddt_nvcc_objs() {
  mkdir -p "$1"
  local pids=() f
  for f in src/backend/cuda/*.cu; do
    nvcc $NVFLAGS -c "$f" -o "$1/$(basename "$f" .cu).o" & pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
