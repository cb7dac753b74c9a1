#!/bin/bash
# boot_mkinitrd: the initramfs builder on its own. An initrd with a busybox script as init and
# the appliance's module set (virtio, rdma_rxe + deps, vfio-pci, uio_pci_generic) boots under QEMU
# (software emulation), every module loads in the order /etc/modules gives (dependencies first),
# a Soft-RoCE device appears on the virtio NIC, and two builds give the same bytes.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/qemu.sh
QEMU_DIR=build/qemu/boot_mkinitrd
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! image/fetch-kernel.sh build/kernel >/dev/null 2>&1; then
    nok "mkinitrd kernel" "image/fetch-kernel.sh failed"
    exit 1
fi
BB=$(command -v busybox || true)
[ -n "$BB" ] || { nok "mkinitrd busybox" "busybox-static is not installed (make deps)"; exit 1; }

T=build/test-mkinitrd
mkdir -p $T
cat >$T/init <<'SH'
#!/bin/busybox sh
bb=/bin/busybox
$bb mount -t proc proc /proc
$bb mount -t sysfs sys /sys
$bb mount -t devtmpfs dev /dev
n=0
for m in $($bb cat /etc/modules); do
    if $bb insmod "$m"; then n=$((n + 1)); else echo "MODULE-FAILED $m"; fi
done
echo "MODULES-LOADED $n"
$bb ip link set lo up
$bb ip link set eth0 up
# A glibc binary with its ldd closure (iproute2's rdma) adds the Soft-RoCE link.
/usr/bin/rdma link add rxe0 type rxe netdev eth0 || echo "RDMA-LINK-ADD-FAILED"
echo "RDMA-DEVICES $($bb ls /sys/class/infiniband 2>/dev/null)"
echo "TEST-DONE"
$bb poweroff -f
SH
MODS="-m virtio_pci -m virtio_net -m rdma_rxe -m vfio-pci -m uio_pci_generic"
# EXTRA_MODULES / EXTRA_LIBS directories (how a GPU driver gets in): a module and a library.
mkdir -p $T/extra-mods $T/extra-libs
cp "$(find -L build/kernel/modules/kernel/drivers/net -name dummy.ko | head -n 1)" $T/extra-mods/
echo "not really a library" >$T/extra-libs/libextra.so.1
MODS="$MODS -M $T/extra-mods -L $T/extra-libs"
RDMA=$(command -v rdma || true)
[ -n "$RDMA" ] || { nok "mkinitrd rdma tool" "iproute2's rdma is not installed (make deps)"; exit 1; }
build() { image/mkinitrd.sh -o "$1" -i $T/init -b "$BB":/bin/busybox -b "$RDMA":/usr/bin/rdma $MODS; }
if build $T/a.img && build $T/b.img; then
    ok "mkinitrd builds"
else
    nok "mkinitrd builds" "image/mkinitrd.sh failed"
    exit 1
fi
if cmp -s $T/a.img $T/b.img; then ok "mkinitrd reproducible"; else nok "mkinitrd reproducible" "two builds differ"; fi

want=$(zstd -dc $T/a.img | cpio -i --quiet --to-stdout etc/modules | wc -l)
order=$(zstd -dc $T/a.img | cpio -i --quiet --to-stdout etc/modules | tr '\n' ' ')
case $order in
*crc32_generic.ko*rdma_rxe.ko*) ok "mkinitrd crc32_generic before rdma_rxe" ;;
*) nok "mkinitrd crc32_generic before rdma_rxe" "order: $order" ;;
esac
case $order in
*ib_core.ko*ib_uverbs.ko*rdma_rxe.ko*) ok "mkinitrd dependencies first" ;;
*) nok "mkinitrd dependencies first" "order: $order" ;;
esac
case $order in
*"/dummy.ko ") ok "mkinitrd extra modules last" ;;
*) nok "mkinitrd extra modules last" "order: $order" ;;
esac
if zstd -dc $T/a.img | cpio -t --quiet | grep -qx usr/lib/x86_64-linux-gnu/libextra.so.1; then
    ok "mkinitrd extra libraries"
else
    nok "mkinitrd extra libraries" "no usr/lib/x86_64-linux-gnu/libextra.so.1 in the archive"
fi

K=build/kernel/vmlinux # uncompressed: QEMU's PVH entry, much faster under emulation
[ -f $K ] || K=build/kernel/vmlinuz
qemu_start vm -kernel $K -initrd $T/a.img -append "console=ttyS0 quiet" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0
if qemu_wait vm "TEST-DONE" 90; then
    got=$(grep -a MODULES-LOADED "$(qemu_log vm)" | tr -d '\r' | awk '{print $2}')
    if [ "$got" = "$want" ]; then ok "mkinitrd modules load in order ($got)"; else
        nok "mkinitrd modules load in order" "$got of $want loaded: $(grep -a MODULE-FAILED "$(qemu_log vm)" | tr '\n' ' ')"
    fi
    if grep -qa "RDMA-DEVICES .*rxe" "$(qemu_log vm)"; then ok "mkinitrd soft-roce device"; else
        nok "mkinitrd soft-roce device" "$(grep -a RDMA-DEVICES "$(qemu_log vm)")"
    fi
else
    nok "mkinitrd boot" "no TEST-DONE on the console: $(qemu_tail vm)"
fi
qemu_stop vm
exit $fail
