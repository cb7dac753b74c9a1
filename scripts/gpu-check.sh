#!/bin/bash
# gpu-check: on a machine with an NVIDIA GPU, build Strata, run the CUDA tests and the CUDA
# benchmark, and keep their output for the README / the issue note. One command:
#   scripts/gpu-check.sh            tests + full benchmark (1B and 7B shapes, F16/Q8_0/Q4_0)
#   scripts/gpu-check.sh --quick    tests + 1B shapes only
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

echo "== end to end: strata generate, CPU vs CUDA backend, stories260K greedy"
S=${STRATA_SHARED:-../shared}
e2e=1
if build/strata convert --tokenizer "$S/models/tok512.bin" "$S/models/stories260K.bin" \
        build/gpu-check-s260k.gguf >/dev/null 2>&1; then
    STRATA_BACKEND=cpu build/strata generate -m build/gpu-check-s260k.gguf -p "Once upon a time" \
        -n 80 >build/gpu-check-cpu.txt 2>/dev/null
    build/strata generate -v -m build/gpu-check-s260k.gguf -p "Once upon a time" -n 80 \
        >build/gpu-check-gpu.txt 2>build/gpu-check-gpu.log
    grep "backend" build/gpu-check-gpu.log
    if grep -q "backend cuda" build/gpu-check-gpu.log && cmp -s build/gpu-check-cpu.txt build/gpu-check-gpu.txt; then
        echo "ok - generate_cuda_equals_cpu"; e2e=0
    else
        echo "not ok - generate_cuda_equals_cpu: see build/gpu-check-{cpu,gpu}.txt and gpu-check-gpu.log"
    fi
else
    echo "not ok - generate_cuda_equals_cpu: cannot convert $S/models/stories260K.bin"
fi

echo "== benchmark (build/bench/bench_cuda ${1:-})"
build/bench/bench_cuda "$@"
brc=$?

echo "== done: tests status $rc, $skips skipped; end-to-end $([ $e2e -eq 0 ] && echo ok || echo FAILED); bench status $brc; log in $LOG"
[ "$rc" -eq 0 ] && [ "$skips" -eq 0 ] && [ "$e2e" -eq 0 ] && [ "$brc" -eq 0 ]
