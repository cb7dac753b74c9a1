#!/bin/bash
# arm64_qemu: the engine cross-built for aarch64 and its matrix kernels checked under qemu-aarch64
# user emulation (docs/arm64.md), the share of `make check-arm64` that fits make test (~35 s of
# CPU here: ~12 s of cross build, the rest emulation): test_matmul on qemu's `max` CPU, which walks
# the scalar, neon, dotprod and i8mm tables against the reference and against each other (the
# K-quants bit for bit), test_quant (fp16 against the hardware's FCVT) and test_gguf there, and
# test_fwd_kernels on `max`, a Neoverse N1 and a Cortex-A57, where the engine must choose i8mm,
# dotprod and neon by itself. `make check-arm64` runs the rest (test_engine on every table, the
# tokenizers, the quantizers against llama-quantize's files).
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
exec scripts/check-arm64.sh build/arm64/tests $TESTS
