#!/bin/bash
# boot_arm64: the arm64 appliance image built and booted, as `make check-arm64-image` does but
# into a test directory: the arm64 sysroot from Debian's arm64 packages (image/arm64-sysroot.sh:
# ~50 MB downloaded once, the host's apt untouched), the server and init cross-built, the image
# (zstd level 9, as the x86 test images) in build/test-image-arm64, then tests/arm64/boot_image.sh:
# kernel + initrd and the UEFI disk under qemu-system-aarch64 -M virt -cpu max (TCG), a completion
# equal to the native greedy text, power-off. About 4 minutes from nothing, 1.5 once built
# (docs/arm64.md).
set -u
cd "$(dirname "$0")/../.."
OUT=build/test-image-arm64
mkdir -p "$OUT"
if ! make -s arm64-server build/arm64-image/init build/strata >"$OUT.log" 2>&1; then
    echo "not ok - arm64 cross build: $(tail -n 3 "$OUT.log" | tr '\n' '|')"
    exit 1
fi
if ! ZSTD_LEVEL=9 ARCH=arm64 image/build.sh "$OUT" >>"$OUT.log" 2>&1; then
    echo "not ok - arm64 image: $(tail -n 3 "$OUT.log" | tr '\n' '|')"
    exit 1
fi
echo "ok - arm64 image from Debian's arm64 packages ($(sed -n 's/^image: done in \(.*\), kernel \(.*\):$/\1, kernel \2/p' "$OUT.log"))"
ARM64_OUT=$OUT exec bash tests/arm64/boot_image.sh
