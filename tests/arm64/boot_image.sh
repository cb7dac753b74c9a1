#!/bin/bash
# boot_image: the arm64 appliance (make image-arm64: out/arm64) under qemu-system-aarch64 -M virt
# -cpu max in software emulation (TCG), booted twice in turn:
#   kernel + initrd   out/arm64/Image and initrd.img (model baked in), console ttyAMA0: init's
#                     steps on the console (the CPU check reads armv8-a+crc, the dot product and
#                     i8mm from the hwcaps: the engine's i8mm kernels are the ones chosen), network
#                     from strata.ip, hugepages; QEMU's power button reaches the server through
#                     gpio-keys (device tree)
#   UEFI disk         out/arm64/strata.img under AAVMF (qemu-efi-aarch64): the firmware boots
#                     \EFI\BOOT\BOOTAA64.EFI (systemd-boot), which boots the unified kernel image;
#                     the model from the disk's strata-model partition, the address from DHCP; the
#                     power button through ACPI
# Each: /health 200 with the server as PID 1, a completion equal to the native (x86) greedy
# output of the same model, and a clean power-off. Before them, the cross-built test_wire under
# qemu-aarch64 (crc32c's Armv8 instructions against the table).
# Run by make check-arm64-image (out/arm64) and by make test's tests/integration/boot_arm64.sh
# (ARM64_OUT=build/test-image-arm64); the two boots take about 1.5 minutes here (docs/arm64.md).
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

command -v "$QEMU_BIN" >/dev/null || { nok "arm64 boot" "no $QEMU_BIN (qemu-system-arm: make deps)"; exit 1; }
for f in Image initrd.img; do
    [ -f "$OUT/$f" ] || { nok "arm64 boot" "$OUT/$f missing (make image-arm64)"; exit 1; }
done
# The fabric's wire format and crc32c on aarch64 first (user emulation, a second): test_wire
# compares Armv8's crc32c instructions with the table; it is cross-built with the server.
wire=build/arm64-image/tests/test_wire
if [ -x "$wire" ] && command -v qemu-aarch64 >/dev/null; then
    out=$(qemu-aarch64 -L build/arm64-sysroot "$wire" 2>&1)
    rc=$?
    if [ $rc = 0 ] && ! grep -q '^not ok' <<<"$out"; then
        ok "arm64 test_wire under qemu-aarch64 ($(grep -c '^ok' <<<"$out") ok, crc32c_hw_matches_table_and_chains among them)"
    else
        nok "arm64 test_wire under qemu-aarch64" "rc $rc: $(grep '^not ok' <<<"$out" | head -n 3 | tr '\n' '|')"
    fi
else
    nok "arm64 test_wire under qemu-aarch64" "$wire or qemu-aarch64 missing (make arm64-server; qemu-user)"
fi

# TCG runs these guests several times slower than the x86 boot tests' guests: waits are doubled.
QEMU_TIMEOUT_SCALE=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { print s * 2 }')
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# --- kernel + initrd --------------------------------------------------------------------------
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start arm64 -kernel "$OUT/Image" -initrd "$OUT/initrd.img" \
    -append "console=ttyAMA0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.dns=10.0.2.3 strata.hugepages=16 $BOOT_ARGS" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop arm64; qemu_stop arm64-uefi' EXIT

if qemu_wait arm64 "strata-init: exec" 120 "Kernel panic" "strata-init: error"; then
    log=$(qemu_log arm64)
    ok "arm64 init reaches exec of the server ($(grep -a 'strata-init: modules: [0-9]' "$log" | tr -d '\r' | sed 's/.*modules: //'), $(since "$t0") s)"
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
    boot_http arm64 "$port" "$t0"
    boot_shutdown arm64
else
    nok "arm64 init reaches exec of the server" "$(qemu_tail arm64 6)"
fi
qemu_stop arm64
echo "# arm64 kernel + initrd: $(since "$t0") s from QEMU start to power-off"

# --- UEFI disk --------------------------------------------------------------------------------
CODE=/usr/share/AAVMF/AAVMF_CODE.fd VARS=/usr/share/AAVMF/AAVMF_VARS.fd
if [ ! -f "$CODE" ]; then
    nok "arm64-uefi firmware" "AAVMF is not installed (qemu-efi-aarch64: make deps)"
    exit 1
fi
[ -f "$OUT/strata.img" ] || { nok "arm64 uefi" "$OUT/strata.img missing (make image-arm64)"; exit 1; }
mkdir -p "$QEMU_DIR"
cp "$VARS" "$QEMU_DIR/vars.fd"
port=$(qemu_free_port)
t0=$(date +%s.%N)
# snapshot=on: the guest's writes never reach the image file.
qemu_start arm64-uefi \
    -drive if=pflash,format=raw,readonly=on,file=$CODE -drive if=pflash,format=raw,file="$QEMU_DIR/vars.fd" \
    -drive if=none,id=d0,format=raw,snapshot=on,file="$OUT/strata.img" \
    -device virtio-blk-pci,drive=d0,bootindex=0 \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
if qemu_wait arm64-uefi "strata-init: exec" 180 "Shell> " "Kernel panic" "strata-init: error"; then
    log=$(qemu_log arm64-uefi)
    ok "arm64-uefi firmware boots the unified kernel image from the disk ($(since "$t0") s)"
    if grep -qa "strata-init: model: partition strata-model (/dev/vda2) mounted read-only" "$log" &&
        grep -qa "strata-init: exec: strata serve -m /mnt/model/model.gguf" "$log"; then
        ok "arm64-uefi model from the disk's strata-model partition"
    else
        nok "arm64-uefi model from the disk's strata-model partition" "$(grep -a 'strata-init: \(model\|exec\|error\)' "$log" | tr '\r\n' '  ')"
    fi
    grep -qa "strata-init: dhcp: eth0 10.0.2.15/24 via 10.0.2.2" "$log" &&
        ok "arm64-uefi address from DHCP" || nok "arm64-uefi address from DHCP" "$(grep -a 'strata-init: \(net\|dhcp\)' "$log" | tr '\r\n' '  ')"
    boot_http arm64-uefi "$port" "$t0"
    boot_shutdown arm64-uefi
else
    nok "arm64-uefi firmware boots the unified kernel image from the disk" "$(qemu_tail arm64-uefi 6)"
fi
echo "# arm64 UEFI disk: $(since "$t0") s from QEMU start to power-off"
exit $fail
