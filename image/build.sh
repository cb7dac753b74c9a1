#!/bin/bash
# build.sh: the appliance image (`make image` runs it after building build/strata-appliance, the
# server without the simulator, and build/init).
#
#   image/build.sh [OUT]     (OUT defaults to out/)
# Environment:
#   ARCH=arm64             the arm64 image (`make image-arm64`, OUT out/arm64): Debian's
#                          linux-image-arm64 (ARCH=arm64 image/fetch-kernel.sh into
#                          build/kernel-arm64), build/arm64-image/strata-appliance and init, the
#                          libraries from build/arm64-sysroot (image/arm64-sysroot.sh); writes
#                          OUT/Image, OUT/vmlinuz, OUT/initrd-base.img, OUT/initrd.img, and
#                          OUT/strata.efi, OUT/strata.img with systemd-boot-efi:arm64's stub and
#                          loader (\EFI\BOOT\BOOTAA64.EFI), console ttyAMA0. Default amd64.
#   MODEL=path.gguf        the model baked into out/initrd.img and put on the disk's model partition
#                          (default: build/models/stories260K.gguf, converted from ../shared/models)
#   CMDLINE="..."          the kernel command line built into out/strata.efi (UEFI/disk boot), after
#                          the defaults "console=tty0 console=ttyS0 quiet panic=10
#                          strata.model=part:strata-model" (the address comes from DHCP; a static
#                          one is strata.ip/gw/dns here)
#   NVIDIA=path            NVIDIA's driver: the .run package or a directory it was extracted to,
#                          with the open kernel modules built for this kernel (image/README.md);
#                          see image/nvidia-bundle.sh for what is taken
#   EXTRA_MODULES=dir      more kernel modules (*.ko), loaded after the built-in list
#   EXTRA_LIBS=dir         more libraries for /usr/lib/x86_64-linux-gnu in the image
#   SOURCE_DATE_EPOCH=t    the time stamped on every file (default: the last commit's)
#   SERVER=path            the server binary (default build/strata-appliance; the tests' hooked
#                          build/strata-appliance-test for the boot tests that need --test-*)
# Writes:
#   out/vmlinuz            Debian's kernel (linux-image-amd64, via image/fetch-kernel.sh)
#   out/vmlinux            the same kernel uncompressed (ELF): QEMU boots it directly (PVH), ~2.5x
#                          faster to init under software emulation; real machines use vmlinuz
#   out/initrd-base.img    init, server, its glibc closure, modules; no model (zstd cpio)
#   out/initrd.img         initrd-base.img + a second cpio holding /model.gguf (kernel+initrd/PXE)
#   out/strata.efi         UEFI unified kernel image: systemd-boot's stub + kernel + initrd-base +
#                          CMDLINE
#   out/strata.img         raw GPT disk: EFI system partition (\EFI\BOOT\BOOTX64.EFI = systemd-boot,
#                          \loader\loader.conf, \EFI\Linux\strata-1-a.efi = strata.efi: boot slot
#                          a; updates go to slot b with image/update-disk.sh or `strata update`)
#                          and an ext4 partition named strata-model holding /model.gguf
#   out/strata.ipxe, out/pxelinux.cfg/default   copies of boot/ (out/ is a TFTP root as is)
# initrd-base.img and initrd.img are reproducible: same inputs, same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
case ${ARCH:-} in "" | amd64 | x86_64) ARCH=amd64 ;; arm64 | aarch64) ARCH=arm64 ;; esac
case $ARCH in
amd64)
    KDIR=build/kernel TRIPLET=x86_64-linux-gnu SYSROOT="" INIT=build/init
    SERVER=${SERVER:-build/strata-appliance}
    ;;
arm64)
    KDIR=build/kernel-arm64 TRIPLET=aarch64-linux-gnu SYSROOT=build/arm64-sysroot
    INIT=build/arm64-image/init SERVER=${SERVER:-build/arm64-image/strata-appliance}
    ;;
*) echo "image: error: ARCH=$ARCH: want amd64 or arm64" >&2; exit 1 ;;
esac
# The UEFI parts: systemd-boot's stub and loader for the architecture, the name the firmware boots
# from removable media, the serial console, the binutils that read the stub's PE format.
if [ "$ARCH" = arm64 ]; then
    STUB=${STUB:-$SYSROOT/usr/lib/systemd/boot/efi/linuxaa64.efi.stub}
    SDBOOT=${SDBOOT:-$SYSROOT/usr/lib/systemd/boot/efi/systemd-bootaa64.efi}
    EFI_BOOT=BOOTAA64.EFI CONSOLE=ttyAMA0 KERNEL_PE=Image
    export OBJCOPY=aarch64-linux-gnu-objcopy OBJDUMP=aarch64-linux-gnu-objdump
else
    STUB=${STUB:-/usr/lib/systemd/boot/efi/linuxx64.efi.stub}
    SDBOOT=${SDBOOT:-/usr/lib/systemd/boot/efi/systemd-bootx64.efi}
    EFI_BOOT=BOOTX64.EFI CONSOLE=ttyS0 KERNEL_PE=vmlinuz
fi
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
T0=$(date +%s)
step() { echo "image: [$1/6] $2 ($(($(date +%s) - T0)) s)"; }
die() { echo "image: error: $*" >&2; exit 1; }
mkdir -p "$OUT" build/image

# Modules the appliance needs (mkinitrd adds what each depends on; /etc/modules keeps this order):
#   disks     virtio_blk (QEMU), nvme, ahci + sd_mod (SATA): the model partition's controller
#   NICs      virtio_net (QEMU), e1000e, and the datacenter NICs with their RDMA halves: mlx5_core +
#             mlx5_ib (ConnectX), ice + irdma (Intel E810), bnxt_en (Broadcom; Debian's 6.1 kernel
#             builds no bnxt_re), i40e, ixgbe; rdma_rxe (Soft-RoCE, tests)
#   DPDK/GPU  vfio-pci, uio_pci_generic
#   files     ext4 (the model partition); vfat + its code pages (the EFI system partition, mounted
#             to mark a boot slot good and by `strata update`); efivarfs (the boot loader's
#             variables: which slot booted)
#   power     button + evdev: the ACPI power button, read by os/runtime/pid1.c
#   watchdog  i6300esb (QEMU), iTCO_wdt (Intel), sp5100_tco (AMD), wdat_wdt (ACPI): strata.watchdog
# A module the hardware does not need fails to bind and costs nothing but its bytes; a module a
# kernel has built in is skipped by mkinitrd.
MODULES="virtio_pci virtio_net virtio_blk nvme ahci sd_mod
         e1000e mlx5_core mlx5_ib ice irdma bnxt_en i40e ixgbe rdma_rxe
         vfio-pci uio_pci_generic ext4 vfat nls_cp437 nls_ascii nls_utf8 efivarfs button evdev
         i6300esb iTCO_wdt sp5100_tco wdat_wdt"
# arm64: the same disks, NICs and files; QEMU's virt machine signals its power button through
# gpio-keys (on the PL061 GPIO, built in) rather than ACPI's button (built in there); the watchdogs
# are i6300esb (QEMU), wdat_wdt (ACPI) and sbsa_gwdt (Arm's generic watchdog: Grace, Altra).
[ "$ARCH" = arm64 ] && MODULES="virtio_pci virtio_mmio virtio_net virtio_blk nvme ahci sd_mod
         e1000e mlx5_core mlx5_ib ice irdma bnxt_en i40e ixgbe rdma_rxe
         vfio-pci uio_pci_generic ext4 vfat nls_cp437 nls_ascii nls_utf8 efivarfs gpio_keys evdev
         i6300esb wdat_wdt sbsa_gwdt"

step 1 "kernel"
release=$(ARCH=$ARCH image/fetch-kernel.sh "$KDIR")
cp -L "$KDIR/vmlinuz" "$OUT/vmlinuz"
# The uncompressed kernel for QEMU (PVH boot, see fetch-kernel.sh); arm64's Image.
[ "$ARCH" = amd64 ] && [ -f "$KDIR/vmlinux" ] && cp "$KDIR/vmlinux" "$OUT/vmlinux"
[ "$ARCH" = arm64 ] && cp "$KDIR/Image" "$OUT/Image"

step 2 "server and init"
# The appliance's server: build/strata-appliance (every command but `sim`, no SimGrid, no test
# hooks). SERVER=build/strata-appliance-test builds the test image of the boot tests that crash or
# hang the server on purpose (cmd/test_hooks.h); never the image anyone ships.
[ -x "$SERVER" ] || die "$SERVER missing (make${SYSROOT:+ arm64-server})"
[ -x "$INIT" ] || die "$INIT missing (make $INIT; needs musl-tools${SYSROOT:+, or musl-dev:arm64 in the sysroot})"
BINS=(-b "$SERVER:/bin/strata")
# LIBDIR: where the libraries are on the build machine (the sysroot's, for arm64); the image holds
# them under /usr/lib/TRIPLET.
LIBDIR=$SYSROOT/usr/lib/$TRIPLET
XARGS=(-A "$ARCH")
[ -n "$SYSROOT" ] && XARGS+=(-R "$SYSROOT")
# Objects the server dlopen()s, which ldd cannot see: the verbs providers of the RDMA NICs above
# (libibverbs reads /etc/libibverbs.d/NAME.driver, then loads libNAME-rdmav*.so), and DPDK's
# drivers for the same NICs with the PCI bus and the mempool driver (the EAL loads every object in
# its plugin directory).
# ldd's whole output first: `ldd | grep -q` under pipefail fails at random when grep stops reading
# before ldd is done (SIGPIPE), which once left the DPDK drivers out of one of two builds.
# A cross-built server: its NEEDED entries (ldd cannot run it).
if [ -n "$SYSROOT" ]; then
    SERVER_LIBS=$(aarch64-linux-gnu-readelf -d "$SERVER")
else
    SERVER_LIBS=$(ldd "$SERVER")
fi
if grep -q libibverbs <<<"$SERVER_LIBS"; then
    for p in rxe mlx5 irdma bnxt_re; do
        so=$(ls "$LIBDIR"/libibverbs/lib$p-rdmav*.so 2>/dev/null | head -n 1 || true)
        [ -n "$so" ] || die "verbs provider $p missing (rdma-core / ibverbs-providers)"
        BINS+=(-b "$so:${so#"$SYSROOT"}" -f "$SYSROOT/etc/libibverbs.d/$p.driver:/etc/libibverbs.d/$p.driver")
    done
fi
if grep -q librte_eal <<<"$SERVER_LIBS"; then
    pmds=$(ls -d "$LIBDIR"/dpdk/pmds-* 2>/dev/null | head -n 1 || true)
    [ -n "$pmds" ] || die "no DPDK plugin directory ($LIBDIR/dpdk/pmds-*)"
    for p in bus_pci mempool_ring net_mlx5 net_ice net_bnxt net_i40e net_ixgbe net_e1000; do
        [ -f "$pmds/librte_$p.so" ] || die "$pmds/librte_$p.so missing (librte-${p//_/-}* package)"
        BINS+=(-b "$pmds/librte_$p.so:${pmds#"$SYSROOT"}/librte_$p.so")
    done
fi

# NVIDIA=path: the driver bundle (image/nvidia-bundle.sh stages its modules, libraries, firmware).
NV=()
if [ -n "${NVIDIA:-}" ]; then
    nv=build/image/nvidia
    image/nvidia-bundle.sh "$NVIDIA" "$nv" "$release" || die "NVIDIA=$NVIDIA: see above"
    NV+=(-M "$nv/modules" -L "$nv/libs")
    # Load order: the core driver first, then what stacks on it (depends= agrees).
    for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
        [ -f "$nv/modules/$m.ko" ] && NV+=(-m "$m")
    done
    while IFS= read -r f; do NV+=(-f "$f:/lib/firmware/${f#"$nv"/firmware/}"); done \
        < <(find "$nv/firmware" -type f 2>/dev/null | LC_ALL=C sort)
fi

step 3 "model"
MODEL=${MODEL:-build/models/stories260K.gguf}
if [ ! -f "$MODEL" ] && [ "$MODEL" = build/models/stories260K.gguf ]; then
    mkdir -p build/models
    if grep -q ' convert' <<<"$(build/strata help 2>/dev/null)"; then
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
image/mkinitrd.sh -S -o "$OUT/initrd-base.img" -i "$INIT" -k "$KDIR/modules" "${XARGS[@]}" \
    "${BINS[@]}" "${MODARGS[@]}" "${EXTRA[@]+"${EXTRA[@]}"}" "${NV[@]+"${NV[@]}"}"
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
# panic=10: a panic before init has read strata.on_error reboots (init then sets the policy).
CMD="console=tty0 console=$CONSOLE quiet panic=10 strata.model=part:strata-model${CMDLINE:+ $CMDLINE}"
STUB=$STUB image/mkuki.sh "$OUT/strata.efi" "$OUT/$KERNEL_PE" "$OUT/initrd-base.img" "$CMD" "$release"

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
# The ESP: systemd-boot as the removable-media loader, and the image as boot slot a, generation
# 1, known good (no boot counter): see os/boot_slots.h for the A/B scheme, image/update-disk.sh
# and `strata update` for updates. No `default` in loader.conf: systemd-boot then boots the last
# entry in version order that is not bad, i.e. the newest generation that is good or on trial.
es=build/image/esp-stage
rm -rf "$es" && mkdir -p "$es/EFI/BOOT" "$es/EFI/Linux" "$es/loader"
[ -f "$SDBOOT" ] || die "$SDBOOT missing (systemd-boot-efi)"
cp "$SDBOOT" "$es/EFI/BOOT/$EFI_BOOT"
cp "$OUT/strata.efi" "$es/EFI/Linux/strata-1-a.efi"
printf 'timeout 0\neditor no\nauto-entries no\nauto-firmware no\n' >"$es/loader/loader.conf"
find "$es" -exec touch -d "@$SOURCE_DATE_EPOCH" {} +
mcopy -s -m -i "$esp" "$es/EFI" "$es/loader" ::/
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
files="vmlinuz initrd-base.img initrd.img strata.efi strata.img"
[ "$ARCH" = arm64 ] && files="Image initrd-base.img initrd.img strata.efi strata.img"
for f in $files; do
    printf 'image:   %-16s %6.1f MiB\n' "$f" "$(awk -v b="$(stat -c %s "$OUT/$f")" 'BEGIN { print b / 1048576 }')"
done
