#!/bin/bash
# boot_pxe: network boot as a rack would do it. QEMU's user network is the DHCP and TFTP server
# (tftp=the image's out dir, bootfile=test.ipxe, which sets strata-args and chains strata.ipxe); the virtio NIC's iPXE ROM (ipxe-qemu) runs boot/strata.ipxe,
# which fetches vmlinuz and initrd.img; the appliance then takes its own DHCP lease (it renews it).
# Software emulation; ends with a completion from outside the VM checked against the native
# greedy output.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_pxe
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

[ -f /usr/lib/ipxe/qemu/efi-virtio.rom ] || { nok "pxe rom" "ipxe-qemu is not installed (make deps)"; exit 1; }
if ! msg=$(boot_image); then nok "pxe image" "$msg"; exit 1; fi
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start pxe -boot n \
    -netdev "user,id=n0,tftp=$BOOT_OUT,bootfile=test.ipxe,hostfwd=tcp:127.0.0.1:$port-:8080" \
    -device virtio-net-pci,netdev=n0
trap 'qemu_stop pxe' EXIT

if qemu_wait pxe "strata-init: exec" 180 "Kernel panic" "strata-init: error" "network boot failed"; then
    log=$(qemu_log pxe)
    ok "pxe iPXE script boots kernel and initrd over TFTP"
    if grep -qa "strata-init: dhcp: eth0 10.0.2.15/24 via 10.0.2.2, DNS 10.0.2.3, lease 86400 s from 10.0.2.2" "$log"; then
        ok "pxe appliance takes its own DHCP lease after iPXE"
    else
        nok "pxe appliance takes its own DHCP lease after iPXE" "$(grep -a 'strata-init: \(cmdline\|net\|dhcp\)' "$log" | tr '\r\n' '  ')"
    fi
else
    nok "pxe iPXE script boots kernel and initrd over TFTP" "$(qemu_tail pxe 6)"
    exit 1
fi

if boot_have_serve; then
    boot_http pxe "$port" "$t0"
    boot_shutdown pxe
else
    echo "skip - pxe http completion: build/strata has no serve command yet"
fi
qemu_stop pxe

# The same through PXELINUX (boot/pxelinux.cfg/default), the appliance again taking its own lease.
PXL=/usr/lib/PXELINUX/pxelinux.0 LDL=/usr/lib/syslinux/modules/bios/ldlinux.c32
if [ ! -f $PXL ] || [ ! -f $LDL ]; then
    nok "pxelinux boot" "pxelinux/syslinux-common are not installed (make deps)"
    exit 1
fi
T=build/test-pxelinux
rm -rf $T && mkdir -p $T/pxelinux.cfg
cp $PXL $LDL "$BOOT_OUT/vmlinuz" "$BOOT_OUT/initrd.img" $T/
sed "s|^\(  APPEND .*\)|\1 $BOOT_ARGS|" boot/pxelinux.cfg/default >$T/pxelinux.cfg/default
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start pxelinux -boot n \
    -netdev "user,id=n0,tftp=$T,bootfile=pxelinux.0,hostfwd=tcp:127.0.0.1:$port-:8080" \
    -device virtio-net-pci,netdev=n0
trap 'qemu_stop pxe; qemu_stop pxelinux' EXIT
if qemu_wait pxelinux "strata-init: exec" 180 "Kernel panic" "strata-init: error"; then
    if grep -qa "strata-init: dhcp: eth0 10.0.2.15/24 via 10.0.2.2, DNS 10.0.2.3" "$(qemu_log pxelinux)"; then
        ok "pxelinux boots, the appliance takes its own DHCP lease"
    else
        nok "pxelinux boots, the appliance takes its own DHCP lease" "$(grep -a 'strata-init: \(cmdline\|net\|dhcp\)' "$(qemu_log pxelinux)" | tr '\r\n' '  ')"
    fi
    boot_have_serve && boot_http pxelinux "$port" "$t0"
else
    nok "pxelinux boots, the appliance takes its own DHCP lease" "$(qemu_tail pxelinux 6)"
fi
exit $fail
