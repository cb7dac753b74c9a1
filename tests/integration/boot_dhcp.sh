#!/bin/bash
# boot_dhcp: the appliance booted with no strata.ip (a flashed disk in a rack, or plain
# `qemu -kernel -initrd`) gets its address, router and DNS from QEMU's user-network DHCP server
# (10.0.2.15 from 10.0.2.2), shows the lease on the console, hands it to the server (which
# schedules its renewal), and answers a real completion through the forwarded port.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_dhcp
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! msg=$(boot_image); then nok "dhcp image" "$msg"; exit 1; fi
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start dhcp -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "console=ttyS0 quiet $BOOT_ARGS" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop dhcp' EXIT
log=$(qemu_log dhcp)

if qemu_wait dhcp "strata-init: exec" 120 "Kernel panic" "strata-init: error"; then
    lease=$(grep -a "strata-init: dhcp: " "$log" | tr -d '\r')
    if grep -qa "strata-init: dhcp: eth0 10.0.2.15/24 via 10.0.2.2, DNS 10.0.2.3, lease 86400 s from 10.0.2.2" "$log"; then
        ok "dhcp lease on the console: ${lease#*dhcp: }"
    else
        nok "dhcp lease on the console" "${lease:-no dhcp line}: $(qemu_tail dhcp 4)"
    fi
else
    nok "dhcp init reaches exec of the server" "$(qemu_tail dhcp 6)"
    exit 1
fi

if boot_have_serve; then
    if qemu_wait dhcp "strata: dhcp: eth0: keeping 10.0.2.15/24 from 10.0.2.2; first renewal in" 120 "Kernel panic" "strata: fatal"; then
        ok "dhcp server takes the lease over for renewal ($(grep -a 'strata: dhcp: ' "$log" | tr -d '\r' | sed 's/.*renewal in/first renewal in/'))"
    else
        nok "dhcp server takes the lease over for renewal" "$(qemu_tail dhcp 4)"
    fi
    boot_http dhcp "$port" "$t0"
    boot_shutdown dhcp
else
    echo "skip - dhcp http completion: build/strata has no serve command yet"
fi
exit $fail
