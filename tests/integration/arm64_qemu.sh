#!/bin/bash
# arm64_qemu: the engine cross-built for aarch64 and its matrix kernels checked under qemu-aarch64
# user emulation (docs/arm64.md), the share of `make check-arm64` that fits make test (~50 s of
# CPU here, ~40 s of wall time on an idle 2-core machine: ~20 s of cross build, ~28 s of
# emulation): test_matmul on qemu's `max` CPU, which walks the scalar, neon, dotprod and i8mm
# tables against the reference and against each other (the K-quants bit for bit), test_quant
# (fp16 against the hardware's FCVT) and test_gguf there, and test_fwd_kernels on `max`, a
# Neoverse N1 and a Cortex-A57, where the engine must choose i8mm, dotprod and neon by itself;
# and clang's view of the NEON files. `make check-arm64` runs the rest (test_engine on every
# table, the tokenizers, the quantizers against llama-quantize's files).
set -u
cd "$(dirname "$0")/../.."
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    echo "skip - arm64_qemu: gcc-aarch64-linux-gnu or qemu-user not installed (make deps)"
    exit 0
fi
TESTS="test_matmul test_quant test_gguf test_fwd_kernels"
if ! out=$(make -s -j"$(nproc)" $(printf 'build/arm64/tests/%s ' $TESTS) 2>&1); then
    echo "not ok - arm64_qemu: the aarch64 cross build failed"
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
    exit 1
fi
echo "ok - arm64_qemu: the engine and $TESTS cross-built for aarch64 with -Werror"
# The fuzz build and a native arm64 build may use clang: its arm_neon.h wants the feature macros
# the NEON files define for it (kernels_neon_dotprod.c).
fail=0
if command -v clang >/dev/null; then
    bad=""
    : >build/arm64/clang.err
    for f in serving/engine/kernels_neon*.c serving/engine/matmul.c; do
        clang --target=aarch64-linux-gnu -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I. \
            -fopenmp-simd -fsyntax-only "$f" 2>>build/arm64/clang.err || bad="$bad $f"
    done
    if [ -z "$bad" ]; then
        echo "ok - arm64_qemu: the NEON kernels pass clang for aarch64 too (-fsyntax-only)"
    else
        echo "not ok - arm64_qemu: clang --target=aarch64-linux-gnu fails on$bad"
        head -n 20 build/arm64/clang.err | sed 's/^/    /'
        fail=1
    fi
fi
scripts/check-arm64.sh build/arm64/tests $TESTS || fail=1
exit $fail
