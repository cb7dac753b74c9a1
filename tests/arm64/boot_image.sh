#!/bin/bash
# boot_image: the arm64 appliance (make image-arm64: out/arm64/Image + initrd.img, model baked in)
# under qemu-system-aarch64 -M virt -cpu max in software emulation (TCG): init's steps on the
# console (the CPU check reads armv8-a+crc, the dot product and i8mm from the hwcaps: the engine's
# i8mm kernels are the ones chosen), then the server as PID 1 answering a completion through
# QEMU's forwarded port, equal to the native (x86) greedy output of the same model; then QEMU's
# power button (gpio-keys on the virt machine) shuts it down cleanly.
# On demand (make check-arm64-image), not in make test: the image it boots takes the arm64 sysroot
# (Debian's arm64 packages, downloaded once) and a cross build of the whole server; the boot
# itself takes about a minute here (docs/arm64.md).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_arm64
QEMU_BIN=qemu-system-aarch64
QEMU_MACHINE=virt
QEMU_MEM=1024
OUT=${ARM64_OUT:-out/arm64}
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

command -v "$QEMU_BIN" >/dev/null || { nok "arm64 boot" "no $QEMU_BIN (qemu-system-arm: make deps ARCH=arm64)"; exit 1; }
for f in Image initrd.img; do
    [ -f "$OUT/$f" ] || { nok "arm64 boot" "$OUT/$f missing (make image-arm64)"; exit 1; }
done
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start arm64 -kernel "$OUT/Image" -initrd "$OUT/initrd.img" \
    -append "console=ttyAMA0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.dns=10.0.2.3 strata.hugepages=16 $BOOT_ARGS" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop arm64' EXIT

if qemu_wait arm64 "strata-init: exec" 240 "Kernel panic" "strata-init: error"; then
    log=$(qemu_log arm64)
    ok "arm64 init reaches exec of the server ($(grep -a 'strata-init: modules: [0-9]' "$log" | tr -d '\r' | sed 's/.*modules: //'), $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
    line=$(grep -a "strata-init: cpu:" "$log" | tr -d '\r')
    case $line in
    *"armv8-a+crc (asimd, crc32) present; dotprod yes, i8mm yes"*) ok "arm64 cpu check: ${line#*cpu: }" ;;
    *) nok "arm64 cpu check (armv8-a+crc, dotprod and i8mm on -cpu max)" "${line:-no cpu line}" ;;
    esac
    grep -qa "strata-init: net: lo up, eth0 up 10.0.2.15/24 via 10.0.2.2" "$log" &&
        ok "arm64 network from strata.ip/gw (virtio-net-pci)" || nok "arm64 network from strata.ip/gw" "$(grep -a 'strata-init: net' "$log")"
    grep -qa "strata-init: hugepages: 16 x 2 MiB reserved" "$log" &&
        ok "arm64 hugepages reserved" || nok "arm64 hugepages reserved" "$(grep -a 'hugepages' "$log")"
    grep -qa "strata-init: exec: strata serve -m /model.gguf" "$log" &&
        ok "arm64 server gets the baked model" || nok "arm64 server gets the baked model" "$(grep -a 'strata-init: exec' "$log")"
else
    nok "arm64 init reaches exec of the server" "$(qemu_tail arm64 6)"
    exit 1
fi

# TCG runs the guest several times slower than the x86 boot tests' guests: the waits are doubled.
QEMU_TIMEOUT_SCALE=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { print s * 2 }')
boot_http arm64 "$port" "$t0"
boot_shutdown arm64
echo "# arm64 boot test: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s from QEMU start to power-off"
exit $fail
