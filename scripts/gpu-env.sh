# gpu-env.sh — sourced by the scripts that build on the GPU machine (which has
# nvcc and gcc but none of the Debian -dev packages): unpacks the jansson and
# PCRE2 packages carried in .gpudeps/ (scripts/fetch-gpu-deps.sh fetches them)
# into /tmp/ddt-deps and sets the flags every GPU build uses:
#   CFLAGS   gcc flags for the C sources      NVFLAGS  nvcc flags for src/backend/cuda
#   LIBS     link line (CUDA runtime, cuBLAS, NCCL, static jansson + PCRE2)
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
# NCCL (the multi-GPU engine): the CUDA toolkit's, else the nvidia-nccl wheel's;
# a header missing from both comes from .gpudeps/nccl/include (git-ignored, copied
# from a toolkit that has it: NVIDIA's file is never committed)
NCCL_INC="" NCCL_LIB="-lnccl"
if [ ! -f "$CUDA_HOME/include/nccl.h" ] || ! ls "$CUDA_HOME"/lib*/libnccl.so >/dev/null 2>&1; then
  NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)
  if [ -n "$NCCL_DIR" ] && ls "$NCCL_DIR"/lib/libnccl.so* >/dev/null 2>&1; then
    NCCL_SO=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -1)
    NCCL_LIB="$NCCL_SO -Wl,-rpath,$NCCL_DIR/lib"
    if [ -f "$NCCL_DIR/include/nccl.h" ]; then NCCL_INC="-I$NCCL_DIR/include"; fi
  fi
  if [ -z "$NCCL_INC" ] && [ ! -f "$CUDA_HOME/include/nccl.h" ] && [ -f .gpudeps/nccl/include/nccl.h ]; then
    NCCL_INC="-I$PWD/.gpudeps/nccl/include"
  fi
fi
CFLAGS="$CFLAGS $NCCL_INC"
LIBS="-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib -lcublas -lcudart $NCCL_LIB $DEPLIB/libjansson.a $DEPLIB/libpcre2-8.a -lm -lstdc++ -lpthread -ldl -lrt"
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
