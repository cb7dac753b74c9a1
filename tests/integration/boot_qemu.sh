#!/bin/bash
# boot_qemu: the appliance from kernel + initrd (the model baked into the initrd) under QEMU in
# software emulation: init's steps on the console, then the server as PID 1 answering a real
# completion through QEMU's forwarded port, checked against the native greedy output; then the
# ACPI power button shuts it down cleanly.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_qemu
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! msg=$(boot_image); then nok "qemu image" "$msg"; exit 1; fi
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start qemu -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.dns=10.0.2.3 strata.hugepages=16 $BOOT_ARGS" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop qemu' EXIT

if qemu_wait qemu "strata-init: exec" 120 "Kernel panic" "strata-init: error"; then
    log=$(qemu_log qemu)
    ok "qemu init reaches exec of the server ($(grep -a 'strata-init: modules: [0-9]' "$log" | tr -d '\r' | sed 's/.*modules: //'))"
    grep -qa "strata-init: net: lo up, eth0 up 10.0.2.15/24 via 10.0.2.2" "$log" &&
        ok "qemu network from strata.ip/gw" || nok "qemu network from strata.ip/gw" "$(grep -a 'strata-init: net' "$log")"
    grep -qa "strata-init: hugepages: 16 x 2 MiB reserved" "$log" &&
        ok "qemu hugepages reserved" || nok "qemu hugepages reserved" "$(grep -a 'hugepages' "$log")"
    grep -qa "strata-init: exec: strata serve -m /model.gguf" "$log" &&
        ok "qemu server gets the baked model" || nok "qemu server gets the baked model" "$(grep -a 'strata-init: exec' "$log")"
else
    nok "qemu init reaches exec of the server" "$(qemu_tail qemu 6)"
    exit 1
fi

if boot_have_serve; then
    boot_http qemu "$port" "$t0"
    boot_shutdown qemu
else
    echo "skip - qemu http completion: build/strata has no serve command yet"
fi
exit $fail
