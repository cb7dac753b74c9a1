#!/bin/bash
# boot_uefi: the raw GPT disk (out/strata.img) under OVMF (UEFI firmware), software emulation. The
# firmware finds \EFI\BOOT\BOOTX64.EFI (the unified kernel image) on the EFI system partition; the
# kernel command line inside it points the init at the disk's strata-model partition (ext4). Ends
# with a completion from outside the VM checked against the native greedy output.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_uefi
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

CODE=/usr/share/OVMF/OVMF_CODE_4M.fd VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
[ -f $CODE ] || { CODE=/usr/share/OVMF/OVMF_CODE.fd VARS=/usr/share/OVMF/OVMF_VARS.fd; }
[ -f $CODE ] || { nok "uefi firmware" "OVMF is not installed (make deps)"; exit 1; }
if ! msg=$(boot_image); then nok "uefi image" "$msg"; exit 1; fi
mkdir -p "$QEMU_DIR"
cp $VARS "$QEMU_DIR/vars.fd"
port=$(qemu_free_port)
t0=$(date +%s.%N)
# snapshot=on: the guest's writes never reach the image file.
qemu_start uefi \
    -drive if=pflash,format=raw,readonly=on,file=$CODE -drive if=pflash,format=raw,file="$QEMU_DIR/vars.fd" \
    -drive if=none,id=d0,format=raw,snapshot=on,file="$BOOT_OUT/strata.img" \
    -device virtio-blk-pci,drive=d0,bootindex=0 \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop uefi' EXIT

if qemu_wait uefi "strata-init: exec" 180 "Shell> " "Kernel panic"; then
    log=$(qemu_log uefi)
    ok "uefi firmware boots the unified kernel image from the disk"
    if grep -qa "strata-init: model: partition strata-model (/dev/vda2) mounted read-only" "$log" &&
        grep -qa "strata-init: exec: strata serve -m /mnt/model/model.gguf" "$log"; then
        ok "uefi model from the disk's strata-model partition"
    else
        nok "uefi model from the disk's strata-model partition" "$(grep -a 'strata-init: \(model\|exec\|error\)' "$log" | tr '\r\n' '  ')"
    fi
else
    nok "uefi firmware boots the unified kernel image from the disk" "$(qemu_tail uefi 6)"
    exit 1
fi

if boot_have_serve; then
    boot_http uefi "$port" "$t0"
    boot_shutdown uefi
else
    echo "skip - uefi http completion: build/strata has no serve command yet"
fi
exit $fail
