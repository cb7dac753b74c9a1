#!/bin/sh
# Install the Debian packages Strata needs, only those missing (idempotent, quiet when all there).
set -eu
PKGS="build-essential clang pkg-config libclang-rt-14-dev
dpdk-dev libdpdk-dev rdma-core libibverbs-dev ibverbs-utils
musl-tools busybox-static cpio kmod zstd xz-utils
gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user qemu-system-arm qemu-efi-aarch64
qemu-system-x86 qemu-utils ovmf ipxe-qemu systemd-boot-efi mtools dosfstools fdisk gdisk e2fsprogs
linux-headers-amd64
pxelinux syslinux-common
libcjson-dev libsodium-dev libraft-dev libuv1-dev
python3-numpy python3-requests python3-yaml iproute2 curl
libsimgrid-dev gnuplot-nox
chromium"
# The arm64 image (make image-arm64, tests/integration/boot_arm64.sh) is built with the cross
# compiler above and booted with qemu-system-arm and AAVMF (qemu-efi-aarch64); its arm64
# libraries come from image/arm64-sysroot.sh, which leaves the host's apt configuration alone.
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# Node.js (for the official openai client in tests): Debian's nodejs brings npm along on Debian
# 12 through the npm package; a machine that already has node and npm keeps its own.
if ! command -v npm >/dev/null 2>&1; then missing="$missing nodejs npm"; fi
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
