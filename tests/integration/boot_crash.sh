#!/bin/bash
# boot_crash: a crash of the server (PID 1) is never a silent panic. With strata.on_error=reboot:
#   segv   the server's crash handler prints the signal and the faulting address, then reboots;
#   panic  a crash no handler can catch (default action restored) kills PID 1, the kernel panics
#          ("Attempted to kill init"), and init's panic policy (the kernel's panic=N, here 1 s)
#          reboots the machine.
# Both guests may reboot (no -no-reboot): the proof is init starting a second time.
set -u
cd "$(dirname "$0")/../.."
BOOT_HOOKS=1 # the server is told to crash, hang or slow down (cmd/test_hooks.h)
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_crash
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! boot_have_serve; then echo "skip - crash: build/strata has no serve command yet"; exit 0; fi
if ! msg=$(boot_image); then nok "crash image" "$msg"; exit 1; fi
NET="-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile="
ARGS='strata.args="--max-batch 4 --step-tokens 32 --test-crash'

# wait_boots NAME N TIMEOUT: 0 once init has started N times.
wait_boots() {
    local i limit
    limit=$(awk -v t="$3" -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", t * s * 10 }')
    for ((i = 0; i < limit; i++)); do
        [ "$(qemu_count "$1" "strata-init: start")" -ge "$2" ] && return 0
        qemu_running "$1" || return 1
        sleep 0.1
    done
    return 1
}

# crash NAME HOW EXTRA-CMDLINE WANT...: every WANT line on the console, then a second boot.
crash() {
    local name=$1 how=$2 extra=$3 log w missing=""
    shift 3
    qemu_start_reboots "$name" -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
        -append "console=ttyS0 quiet strata.on_error=reboot $extra $ARGS $how\"" $NET
    log=$(qemu_log "$name")
    if ! wait_boots "$name" 2 180; then
        nok "crash $name reboots" "init did not start again: $(qemu_tail "$name" 6)"
    else
        for w in "$@"; do grep -qaF -- "$w" "$log" || missing="$missing '$w'"; done
        if [ -n "$missing" ]; then
            nok "crash $name reboots" "missing on the console:$missing: $(qemu_tail "$name" 8)"
        else
            ok "crash $name reboots: '$(grep -aF -m1 -- "$1" "$log" | tr -d '\r' | cut -c1-120)'"
        fi
    fi
    qemu_stop "$name"
}
crash segv segv "" \
    "strata: fatal: crashed with SIGSEGV at address 0x0000000000000010; rebooting (strata.on_error=reboot)" \
    "reboot: Restarting system"
crash panic panic "panic=1" \
    "Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b" \
    "strata-init: panic: a kernel panic or oops reboots after 1 s (strata.on_error=reboot)" \
    "Rebooting in 1 seconds"
exit $fail
