#!/bin/bash
# boot_watchdog: strata.watchdog=3 arms QEMU's i6300esb; the server pets it from its serve loop,
# so it keeps serving well past the timeout; then --test-hang stops the loop and the watchdog
# resets the machine (a hardware reset: no kernel "Restarting system" line), and init starts
# again.
set -u
cd "$(dirname "$0")/../.."
BOOT_HOOKS=1 # the server is told to crash, hang or slow down (cmd/test_hooks.h)
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_watchdog
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! boot_have_serve; then echo "skip - watchdog: build/strata has no serve command yet"; exit 0; fi
if ! msg=$(boot_image); then nok "watchdog image" "$msg"; exit 1; fi
HANG=20
port=$(qemu_free_port)
t0=$(date +%s.%N)
qemu_start_reboots wd -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "console=ttyS0 quiet strata.watchdog=3 strata.args=\"--max-batch 4 --step-tokens 32 --test-hang $HANG\"" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile= \
    -device i6300esb -action watchdog=reset
trap 'qemu_stop wd' EXIT
log=$(qemu_log wd)

if qemu_wait wd "strata: watchdog: /dev/watchdog" 120 "Kernel panic" "strata: fatal" "strata-init: error"; then
    ok "watchdog armed: '$(grep -a -m1 'strata: watchdog:' "$log" | tr -d '\r')'"
else
    nok "watchdog armed" "$(qemu_tail wd 6)"
    exit 1
fi
if ! qemu_wait wd "strata serve: ready" 120 "Kernel panic" "strata: fatal"; then
    nok "watchdog server ready" "$(qemu_tail wd 4)"
    exit 1
fi
# Alive past several timeouts: the loop pets it. The completion also proves the API answers.
sleep 8
if [ "$(qemu_count wd "strata-init: start")" = 1 ]; then
    ok "watchdog petted: still the first boot 8 s (> 2 x 3 s) after ready"
else
    nok "watchdog petted" "rebooted while the loop was running: $(qemu_tail wd 4)"
fi
boot_http wd "$port" "$t0"
# Then the loop hangs, nobody pets, the device resets the machine.
limit=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", 120 * s * 10 }')
for ((i = 0; i < limit; i++)); do
    [ "$(qemu_count wd "strata-init: start")" -ge 2 ] && break
    sleep 0.1
done
if [ "$(qemu_count wd "strata-init: start")" -ge 2 ] && grep -qa -- "--test-hang: the serve loop stops here" "$log"; then
    if grep -qa "reboot: Restarting system\|Kernel panic" "$log"; then
        nok "watchdog resets a hung server" "the kernel rebooted, not the watchdog: $(qemu_tail wd 4)"
    else
        ok "watchdog resets a hung server: init starts again after the loop stopped"
    fi
else
    nok "watchdog resets a hung server" "no second boot: $(qemu_tail wd 5)"
fi
exit $fail
