#!/bin/bash
# gpu-check: on a machine with an NVIDIA GPU, build Strata, run the CUDA tests and the CUDA
# benchmark, and keep their output for the README / the issue note. One command:
#   tools/gpu-check.sh            tests + full benchmark (1B and 7B shapes, F16/Q8_0/Q4_0)
#   tools/gpu-check.sh --quick    tests + 1B shapes only
# Needs: nvcc (the kernels are compiled into the binary), the NVIDIA driver (libcuda.so.1), the
# shared models at ../shared/models (or STRATA_SHARED=...). Output: build/gpu-check.log.
# Exit status: non-zero if a test failed or was skipped (on a GPU machine nothing may skip).
set -u
cd "$(dirname "$0")/.."
LOG=build/gpu-check.log
mkdir -p build
exec > >(tee "$LOG") 2>&1

echo "== gpu-check $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "nvcc not found: install the CUDA toolkit"; exit 1; }

echo "== build"
make -j"$(nproc)" all benches >build/gpu-check-build.log 2>&1 || { tail -30 build/gpu-check-build.log; exit 1; }

echo "== tests (build/tests/test_cuda)"
build/tests/test_cuda | tee build/gpu-check-test.log
rc=${PIPESTATUS[0]}
fails=$(grep -c '^not ok' build/gpu-check-test.log)
skips=$(grep -c '^skip' build/gpu-check-test.log)
echo "test_cuda: $(grep -c '^ok' build/gpu-check-test.log) ok, $fails failed, $skips skipped (status $rc)"

echo "== benchmark (build/bench/bench_cuda ${1:-})"
build/bench/bench_cuda "$@"
brc=$?

echo "== done: tests status $rc, $skips skipped; bench status $brc; log in $LOG"
[ "$rc" -eq 0 ] && [ "$skips" -eq 0 ] && [ "$brc" -eq 0 ]
