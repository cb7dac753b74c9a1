#!/bin/bash
# mkuki.sh: a UEFI unified kernel image (UKI): systemd-boot's stub with the kernel, an initrd, the
# kernel command line and an os-release added as PE sections. Reproducible: the PE time stamp is
# SOURCE_DATE_EPOCH (default 0) and the header checksum is zeroed (UEFI does not check it).
#
#   image/mkuki.sh OUT.efi VMLINUZ INITRD "CMDLINE" [RELEASE]
# Environment: STUB (default /usr/lib/systemd/boot/efi/linuxx64.efi.stub, systemd-boot-efi);
# OBJCOPY, OBJDUMP (default objcopy, objdump; aarch64-linux-gnu-* for arm64's linuxaa64.efi.stub,
# whose PE format the host's binutils do not read).
# image/build.sh makes out/strata.efi with it; tests make variants (another command line).
set -euo pipefail
OUT=${1:?usage: mkuki.sh OUT.efi VMLINUZ INITRD CMDLINE [RELEASE]}
KERNEL=${2:?} INITRD=${3:?} CMD=${4?} RELEASE=${5:-}
STUB=${STUB:-/usr/lib/systemd/boot/efi/linuxx64.efi.stub}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
OBJCOPY=${OBJCOPY:-objcopy} OBJDUMP=${OBJDUMP:-objdump}
[ -f "$STUB" ] || { echo "mkuki: $STUB missing (systemd-boot-efi)" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mkuki.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
printf '%s' "$CMD" >"$tmp/cmdline.txt"
printf 'ID=strata\nNAME=Strata\nPRETTY_NAME="Strata appliance%s"\n' "${RELEASE:+ (kernel $RELEASE)}" >"$tmp/os-release"
# Sections go after the stub's own, each on a fresh 1 MiB boundary so none overlaps the next.
align() { echo $((($1 + 0xfffff) / 0x100000 * 0x100000)); }
end=0
while read -r idx _ size vma _; do
    case $idx in [0-9]*) [ $((0x$vma + 0x$size)) -gt $end ] && end=$((0x$vma + 0x$size)) ;; esac
done < <("$OBJDUMP" -h "$STUB")
osrel=$(align "$end")
cmdl=$((osrel + 0x10000))
linux=$(align $((cmdl + 0x10000)))
initrd=$(align $((linux + $(stat -c %s "$KERNEL"))))
"$OBJCOPY" \
    --add-section .osrel="$tmp/os-release" --change-section-vma .osrel="$(printf 0x%x "$osrel")" \
    --add-section .cmdline="$tmp/cmdline.txt" --change-section-vma .cmdline="$(printf 0x%x "$cmdl")" \
    --add-section .linux="$KERNEL" --change-section-vma .linux="$(printf 0x%x "$linux")" \
    --add-section .initrd="$INITRD" --change-section-vma .initrd="$(printf 0x%x "$initrd")" \
    "$STUB" "$OUT.tmp"
le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $((($1 >> 8) & 255)))\\$(printf %03o $((($1 >> 16) & 255)))\\$(printf %03o $((($1 >> 24) & 255)))"; }
pe=$(od -An -tu4 -j 60 -N 4 "$OUT.tmp" | tr -d ' ')
le32 "$SOURCE_DATE_EPOCH" | dd of="$OUT.tmp" bs=1 seek=$((pe + 8)) conv=notrunc status=none
le32 0 | dd of="$OUT.tmp" bs=1 seek=$((pe + 88)) conv=notrunc status=none
touch -d "@$SOURCE_DATE_EPOCH" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
