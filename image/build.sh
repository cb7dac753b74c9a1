#!/bin/bash
# build.sh: the appliance image (`make image` runs it after building build/strata and build/init).
#
#   image/build.sh [OUT]     (OUT defaults to out/)
# Environment:
#   MODEL=path.gguf        the model baked into out/initrd.img and put on the disk's model partition
#                          (default: build/models/stories260K.gguf, converted from ../shared/models)
#   CMDLINE="..."          the kernel command line built into out/strata.efi (UEFI/disk boot), after
#                          the defaults "console=tty0 console=ttyS0 quiet panic=10
#                          strata.model=part:strata-model" (the address comes from DHCP; a static
#                          one is strata.ip/gw/dns here)
#   EXTRA_MODULES=dir      more kernel modules (*.ko, e.g. the NVIDIA driver's), loaded last
#   EXTRA_LIBS=dir         more libraries for /usr/lib/x86_64-linux-gnu in the image (libcuda ...)
#   SOURCE_DATE_EPOCH=t    the time stamped on every file (default: the last commit's)
# Writes:
#   out/vmlinuz            Debian's kernel (linux-image-amd64, via image/fetch-kernel.sh)
#   out/vmlinux            the same kernel uncompressed (ELF): QEMU boots it directly (PVH), ~2.5x
#                          faster to init under software emulation; real machines use vmlinuz
#   out/initrd-base.img    init, server, its glibc closure, modules; no model (zstd cpio)
#   out/initrd.img         initrd-base.img + a second cpio holding /model.gguf (kernel+initrd/PXE)
#   out/strata.efi         UEFI unified kernel image: systemd-boot's stub + kernel + initrd-base +
#                          CMDLINE
#   out/strata.img         raw GPT disk: EFI system partition (\EFI\BOOT\BOOTX64.EFI = strata.efi)
#                          and an ext4 partition named strata-model holding /model.gguf
#   out/strata.ipxe, out/pxelinux.cfg/default   copies of boot/ (out/ is a TFTP root as is)
# initrd-base.img and initrd.img are reproducible: same inputs, same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
KDIR=build/kernel
STUB=${STUB:-/usr/lib/systemd/boot/efi/linuxx64.efi.stub}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
T0=$(date +%s)
step() { echo "image: [$1/6] $2 ($(($(date +%s) - T0)) s)"; }
die() { echo "image: error: $*" >&2; exit 1; }
mkdir -p "$OUT" build/image

# Modules the appliance needs: NICs (virtio in QEMU; add real NIC drivers with EXTRA_MODULES or
# here), Soft-RoCE and its crc32 helper, VFIO and uio for DPDK/GPU passthrough, disks for the model
# partition, and the ACPI power button (read by os/runtime/pid1.c through evdev).
MODULES="virtio_pci virtio_net virtio_blk rdma_rxe vfio-pci uio_pci_generic ext4 button evdev"
# Not every kernel has every one as a module (some are built in): mkinitrd skips built-ins.
# Hardware watchdogs (strata.watchdog, os/runtime/watchdog.h): QEMU's i6300esb, Intel's TCO, AMD's, ACPI's.
MODULES="$MODULES i6300esb iTCO_wdt sp5100_tco wdat_wdt"

step 1 "kernel"
release=$(image/fetch-kernel.sh "$KDIR")
cp -L "$KDIR/vmlinuz" "$OUT/vmlinuz"
# The uncompressed kernel for QEMU (PVH boot, see fetch-kernel.sh).
[ -f "$KDIR/vmlinux" ] && cp "$KDIR/vmlinux" "$OUT/vmlinux"

step 2 "server and init"
[ -x build/strata ] || die "build/strata missing (make)"
[ -x build/init ] || die "build/init missing (make build/init; needs musl-tools)"
BINS=(-b build/strata:/bin/strata)
# Libraries the server dlopen()s, which ldd cannot see: the Soft-RoCE and mlx5 verbs providers.
for p in rxe mlx5; do
    so=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/lib$p-rdmav*.so 2>/dev/null | head -n 1 || true)
    if [ -n "$so" ] && ldd build/strata | grep -q libibverbs; then
        BINS+=(-b "$so" -f "/etc/libibverbs.d/$p.driver:/etc/libibverbs.d/$p.driver")
    fi
done

step 3 "model"
MODEL=${MODEL:-build/models/stories260K.gguf}
if [ ! -f "$MODEL" ] && [ "$MODEL" = build/models/stories260K.gguf ]; then
    mkdir -p build/models
    if build/strata help 2>/dev/null | grep -q ' convert'; then
        build/strata convert --tokenizer ../shared/models/tok512.bin ../shared/models/stories260K.bin \
            "$MODEL" >&2 || die "strata convert failed"
    fi
fi
if [ -f "$MODEL" ]; then
    echo "image:       model $MODEL ($(stat -c %s "$MODEL") bytes)"
else
    echo "image:       warning: no model ($MODEL missing, no converter yet): images carry none"
    MODEL=""
fi

step 4 "initrd"
EXTRA=()
[ -n "${EXTRA_MODULES:-}" ] && EXTRA+=(-M "$EXTRA_MODULES")
[ -n "${EXTRA_LIBS:-}" ] && EXTRA+=(-L "$EXTRA_LIBS")
MODARGS=()
for m in $MODULES; do MODARGS+=(-m "$m"); done
image/mkinitrd.sh -S -o "$OUT/initrd-base.img" -i build/init -k "$KDIR/modules" \
    "${BINS[@]}" "${MODARGS[@]}" "${EXTRA[@]+"${EXTRA[@]}"}"
# The model rides in a second archive appended to the first (the kernel unpacks concatenated
# archives in turn), so the base stays the same bytes whatever the model, and its size is the
# image's own.
cp "$OUT/initrd-base.img" "$OUT/initrd.img.tmp"
if [ -n "$MODEL" ]; then
    # Pad to 4 bytes: the kernel skips zeros between archives.
    pad=$(((4 - $(stat -c %s "$OUT/initrd.img.tmp") % 4) % 4))
    head -c "$pad" /dev/zero >>"$OUT/initrd.img.tmp"
    ms=build/image/model-stage
    rm -rf "$ms" && mkdir -p "$ms"
    cp "$MODEL" "$ms/model.gguf"
    chmod 0644 "$ms/model.gguf"
    touch -d "@$SOURCE_DATE_EPOCH" "$ms/model.gguf"
    (cd "$ms" && echo model.gguf | cpio --quiet -o -H newc --reproducible -R 0:0) |
        zstd -q -T1 -3 -c >>"$OUT/initrd.img.tmp"
fi
mv "$OUT/initrd.img.tmp" "$OUT/initrd.img"

step 5 "UEFI unified kernel image"
[ -f "$STUB" ] || die "$STUB missing (systemd-boot-efi)"
# panic=10: a panic before init has read strata.on_error reboots (init then sets the policy).
CMD="console=tty0 console=ttyS0 quiet panic=10 strata.model=part:strata-model${CMDLINE:+ $CMDLINE}"
printf '%s' "$CMD" >build/image/cmdline.txt
printf 'ID=strata\nNAME=Strata\nPRETTY_NAME="Strata appliance (kernel %s)"\n' "$release" >build/image/os-release
# Sections go after the stub's own, each on a fresh 1 MiB boundary so none overlaps the next.
align() { echo $((($1 + 0xfffff) / 0x100000 * 0x100000)); }
end=0
while read -r idx _ size vma _; do
    case $idx in [0-9]*) [ $((0x$vma + 0x$size)) -gt $end ] && end=$((0x$vma + 0x$size)) ;; esac
done < <(objdump -h "$STUB")
osrel=$(align "$end")
cmdl=$((osrel + 0x10000))
linux=$(align $((cmdl + 0x10000)))
initrd=$(align $((linux + $(stat -c %s "$OUT/vmlinuz"))))
objcopy \
    --add-section .osrel=build/image/os-release --change-section-vma .osrel="$(printf 0x%x "$osrel")" \
    --add-section .cmdline=build/image/cmdline.txt --change-section-vma .cmdline="$(printf 0x%x "$cmdl")" \
    --add-section .linux="$OUT/vmlinuz" --change-section-vma .linux="$(printf 0x%x "$linux")" \
    --add-section .initrd="$OUT/initrd-base.img" --change-section-vma .initrd="$(printf 0x%x "$initrd")" \
    "$STUB" "$OUT/strata.efi"
# objcopy stamps the PE header with the build time: use SOURCE_DATE_EPOCH instead, and zero the
# optional header's checksum that covered it (UEFI does not check it) -- same inputs, same bytes.
le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $((($1 >> 8) & 255)))\\$(printf %03o $((($1 >> 16) & 255)))\\$(printf %03o $((($1 >> 24) & 255)))"; }
pe=$(od -An -tu4 -j 60 -N 4 "$OUT/strata.efi" | tr -d ' ')
le32 "$SOURCE_DATE_EPOCH" | dd of="$OUT/strata.efi" bs=1 seek=$((pe + 8)) conv=notrunc status=none
le32 0 | dd of="$OUT/strata.efi" bs=1 seek=$((pe + 88)) conv=notrunc status=none
touch -d "@$SOURCE_DATE_EPOCH" "$OUT/strata.efi"

step 6 "disk image"
MiB=1048576
efi_size=$(stat -c %s "$OUT/strata.efi")
esp_mib=$(((efi_size / MiB) * 2 + 34))          # room for one update beside it; FAT32 wants >= 33 MiB
model_size=0
[ -n "$MODEL" ] && model_size=$(stat -c %s "$MODEL")
model_mib=$((model_size / MiB + model_size / MiB / 8 + 16)) # ext4 metadata and journal headroom
esp=build/image/esp.img part=build/image/model.img
rm -f "$esp" "$part"
mkfs.vfat -C -F 32 -n STRATA-ESP -i 5354a001 "$esp" $((esp_mib * 1024)) >/dev/null
# Copy a staged tree with fixed times (-s -m keeps them) so that the FAT's entries are the same
# from build to build.
es=build/image/esp-stage
rm -rf "$es" && mkdir -p "$es/EFI/BOOT"
cp "$OUT/strata.efi" "$es/EFI/BOOT/BOOTX64.EFI"
find "$es" -exec touch -d "@$SOURCE_DATE_EPOCH" {} +
mcopy -s -m -i "$esp" "$es/EFI" ::/
ms=build/image/model-stage
rm -rf "$ms" && mkdir -p "$ms"
[ -n "$MODEL" ] && cp "$MODEL" "$ms/model.gguf"
find "$ms" -exec touch -d "@$SOURCE_DATE_EPOCH" {} +
E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mkfs.ext4 -q -F -L strata-model -U 5354a000-0000-4000-8000-000000000002 \
    -E root_owner=0:0,hash_seed=5354a000-0000-4000-8000-000000000003 -d "$ms" "$part" "${model_mib}M" >/dev/null
# GPT: 1 MiB before the first partition, 1 MiB after the last for the backup table.
total=$((1 + esp_mib + model_mib + 1))
rm -f "$OUT/strata.img"
truncate -s $((total * MiB)) "$OUT/strata.img"
sgdisk -U 5354a000-0000-4000-8000-000000000000 \
    -n 1:1M:+${esp_mib}M -t 1:ef00 -c 1:EFI -u 1:5354a000-0000-4000-8000-000000000001 \
    -n 2:0:+${model_mib}M -t 2:8300 -c 2:strata-model -u 2:5354a000-0000-4000-8000-000000000004 \
    "$OUT/strata.img" >/dev/null
dd if="$esp" of="$OUT/strata.img" bs=1M seek=1 conv=notrunc status=none
dd if="$part" of="$OUT/strata.img" bs=1M seek=$((1 + esp_mib)) conv=notrunc status=none

cp boot/strata.ipxe "$OUT/strata.ipxe"
mkdir -p "$OUT/pxelinux.cfg"
cp boot/pxelinux.cfg/default "$OUT/pxelinux.cfg/default"

echo "image: done in $(($(date +%s) - T0)) s, kernel $release:"
for f in vmlinuz initrd-base.img initrd.img strata.efi strata.img; do
    printf 'image:   %-16s %6.1f MiB\n' "$f" "$(awk -v b="$(stat -c %s "$OUT/$f")" 'BEGIN { print b / 1048576 }')"
done
