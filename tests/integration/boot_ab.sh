#!/bin/bash
# boot_ab: A/B updates of the UEFI disk under OVMF with systemd-boot's boot counting, two guests
# at once, each on its own copy of out/strata.img (slot a = the image as built):
#   fallback  image/update-disk.sh --tries 1 writes a broken image into slot b (the same kernel and
#             initrd, a command line whose init fails, strata.on_error=reboot). The loader tries
#             b once, the init fails and reboots, the loader then boots a, which serves a
#             completion; b is left marked bad (strata-2-b+0-1.efi) and the model partition as it
#             was.
#   bless     image/update-disk.sh writes a good image into slot b with 2 tries; it boots, serves,
#             and the server renames its entry to strata-2-b.efi (good), as systemd-bless-boot
#             would.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_ab
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

CODE=/usr/share/OVMF/OVMF_CODE_4M.fd VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
[ -f $CODE ] || { CODE=/usr/share/OVMF/OVMF_CODE.fd VARS=/usr/share/OVMF/OVMF_VARS.fd; }
[ -f $CODE ] || { nok "ab firmware" "OVMF is not installed (make deps)"; exit 1; }
if ! msg=$(boot_image); then nok "ab image" "$msg"; exit 1; fi
mkdir -p "$QEMU_DIR"
export MTOOLS_SKIP_CHECK=1
esp_ls() { # esp_ls DISK: the names in \EFI\Linux, space-separated
    local start
    start=$(sgdisk -p "$1" | awk '$6 == "EF00" { print $2; exit }')
    mdir -i "$1@@$((start * 512))" -b ::/EFI/Linux 2>/dev/null | sed 's|.*/||' | sort | tr '\n' ' '
}
model_part() { # the strata-model partition of an image, copied to a file
    local l
    l=$(sgdisk -p "$1" | awk '$7 == "strata-model" { print $2, $3; exit }')
    dd if="$1" of="$2" bs=512 skip="${l% *}" count=$((${l#* } - ${l% *} + 1)) status=none
}

# The model on the strata-model partition, hashed (a missing file hashes as nothing). The
# appliance may write there (its step-model cache, docs/serving.md: the partition remounted
# read-write for the moment of a write), so the check is the model file and a clean filesystem,
# not every byte of the partition.
model_sum() {
    model_part "$1" "$QEMU_DIR/model-part.img"
    debugfs -R "cat /model.gguf" "$QEMU_DIR/model-part.img" 2>/dev/null | sha256sum | cut -c1-16
}

model_fsck() { # e2fsck's verdict on the partition, read-only
    model_part "$1" "$QEMU_DIR/model-part.img"
    e2fsck -fn "$QEMU_DIR/model-part.img" >/dev/null 2>&1 && echo clean || echo "e2fsck -fn: status $?"
}

# The broken image: the image's own kernel, initrd and command line, plus a key init rejects.
cmd=$(objcopy -O binary --only-section=.cmdline "$BOOT_OUT/strata.efi" /dev/stdout 2>/dev/null | tr -d '\0')
[ -n "$cmd" ] || { nok "ab broken image" "no .cmdline in $BOOT_OUT/strata.efi"; exit 1; }
image/mkuki.sh "$QEMU_DIR/broken.efi" "$BOOT_OUT/vmlinuz" "$BOOT_OUT/initrd-base.img" \
    "$cmd strata.on_error=reboot strata.broken_on_purpose=1" ||
    { nok "ab broken image" "image/mkuki.sh failed"; exit 1; }

cp "$BOOT_OUT/strata.img" "$QEMU_DIR/fallback.img"
cp "$BOOT_OUT/strata.img" "$QEMU_DIR/bless.img"
sum0=$(model_sum "$QEMU_DIR/fallback.img")
out=$(image/update-disk.sh --tries 1 "$QEMU_DIR/fallback.img" "$QEMU_DIR/broken.efi" 2>&1) ||
    { nok "ab update-disk broken image" "$out"; exit 1; }
out2=$(image/update-disk.sh --tries 2 "$QEMU_DIR/bless.img" "$BOOT_OUT/strata.efi" 2>&1) ||
    { nok "ab update-disk good image" "$out2"; exit 1; }
l1=$(esp_ls "$QEMU_DIR/fallback.img") l2=$(esp_ls "$QEMU_DIR/bless.img")
if [ "$l1" = "strata-1-a.efi strata-2-b+1.efi " ] && [ "$l2" = "strata-1-a.efi strata-2-b+2.efi " ]; then
    ok "update-disk writes slot b with its tries counter ($l2)"
else
    nok "update-disk writes slot b with its tries counter" "fallback: $l1, bless: $l2"
fi

start() { # start NAME PORT
    cp $VARS "$QEMU_DIR/$1-vars.fd"
    qemu_start_reboots "$1" \
        -drive if=pflash,format=raw,readonly=on,file=$CODE -drive if=pflash,format=raw,file="$QEMU_DIR/$1-vars.fd" \
        -drive if=none,id=d0,format=raw,file="$QEMU_DIR/$1.img" -device virtio-blk-pci,drive=d0,bootindex=0 \
        -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$2-:8080" -device virtio-net-pci,netdev=n0,romfile=
}
trap 'qemu_stop fallback; qemu_stop bless' EXIT
port_f=$(qemu_free_port)
t0_f=$(date +%s.%N)
start fallback "$port_f"
port_b=$(qemu_free_port)
[ "$port_b" = "$port_f" ] && port_b=$((port_f + 1))
t0_b=$(date +%s.%N)
start bless "$port_b"

# --- fallback ------------------------------------------------------------------------------------
log=$(qemu_log fallback)
if qemu_wait fallback "strata-init: exec" 420 "Shell> " "Kernel panic"; then
    n_fail=$(qemu_count fallback "rebooting (strata.on_error=reboot)")
    if [ "$n_fail" = 1 ] && grep -qa "strata.broken_on_purpose" "$log"; then
        ok "fallback: the broken slot b was tried once, failed and rebooted"
    else
        nok "fallback: the broken slot b was tried once" "$n_fail failed boots: $(grep -a 'strata-init: error' "$log" | tr '\r\n' '  ')"
    fi
    if boot_have_serve; then boot_http fallback "$port_f" "$t0_f"; fi
    boot_shutdown fallback
    l=$(esp_ls "$QEMU_DIR/fallback.img")
    if [ "$l" = "strata-1-a.efi strata-2-b+0-1.efi " ]; then ok "fallback: slot a served, slot b is marked bad ($l)"
    else nok "fallback: slot b is marked bad" "ESP holds: $l"; fi
    sum1=$(model_sum "$QEMU_DIR/fallback.img") fsck1=$(model_fsck "$QEMU_DIR/fallback.img")
    if [ "$sum1" = "$sum0" ] && [ "$fsck1" = clean ]; then
        ok "fallback: the model on its partition is untouched, the filesystem clean"
    else nok "fallback: the model on its partition is untouched" "model.gguf $sum0 -> $sum1; $fsck1"; fi
else
    nok "fallback: a slot reaches the server" "$(qemu_tail fallback 8)"
fi

# --- bless ---------------------------------------------------------------------------------------
log=$(qemu_log bless)
if qemu_wait bless "strata-init: exec" 300 "Shell> " "Kernel panic" "strata-init: error"; then
    if boot_have_serve; then
        boot_http bless "$port_b" "$t0_b"
        if qemu_wait bless "serve: boot slot: " 60 && grep -qa 'strata-2-b+1-1.efi marked good (now strata-2-b.efi)' "$log"; then
            ok "bless: the server marks its slot good ($(sed -n 's/.*serve: boot slot: //p' "$log" | tr -d '\r' | head -n 1))"
        else
            nok "bless: the server marks its slot good" "$(grep -a 'boot slot' "$log" | tr '\r\n' '  ')"
        fi
        boot_shutdown bless
        l=$(esp_ls "$QEMU_DIR/bless.img")
        if [ "$l" = "strata-1-a.efi strata-2-b.efi " ]; then ok "bless: the ESP holds the good entry ($l)"
        else nok "bless: the ESP holds the good entry" "ESP holds: $l"; fi
    else
        echo "skip - bless: build/strata has no serve command yet"
    fi
else
    nok "bless: the updated slot boots" "$(qemu_tail bless 8)"
fi
exit $fail
