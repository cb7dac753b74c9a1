#!/bin/bash
# boot_cpu: on a CPU without what the server's libraries are compiled for (QEMU's default qemu64
# model: no SSSE3, SSE4.1, SSE4.2, POPCNT), init refuses to exec the server with one console line
# naming the missing features and the fix, then halts (or reboots, strata.on_error=reboot) --
# instead of PID 1 dying of an invalid opcode in a library constructor and a kernel panic.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_cpu
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! msg=$(boot_image); then nok "cpu image" "$msg"; exit 1; fi
LINE="strata-init: error: cpu: QEMU Virtual CPU version 2.5+ lacks SSSE3 SSE4.1 SSE4.2 POPCNT, which the server's libraries need (x86-64-v2: DPDK is built for -march=corei7); under QEMU use -cpu max or -cpu host"
NET="-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile="
# no_timer_check: on a loaded host the emulated qemu64 guest can fail the kernel's IO-APIC timer
# check ("IO-APIC + timer doesn't work!") before init runs; that is not what this test is about.

# qemu64 END(halt|reboot)
run() {
    local end=$1 name=qemu64-$1 log
    QEMU_CPU=qemu64 qemu_start "$name" -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
        -append "console=ttyS0 quiet no_timer_check strata.on_error=$end" $NET
    log=$(qemu_log "$name")
    if [ "$end" = halt ]; then qemu_wait "$name" "reboot: System halted" 60; else qemu_wait_exit "$name" 60; fi
    if ! grep -qaF "$LINE" "$log"; then
        nok "cpu $name" "no console line '$LINE': $(grep -a 'strata-init: \(cpu\|error\)' "$log" | tr -d '\r' | tr '\n' '|') $(qemu_tail "$name" 3)"
    elif grep -qa "Kernel panic\|invalid opcode\|strata-init: exec" "$log"; then
        nok "cpu $name" "went on anyway: $(grep -a -m1 'Kernel panic\|invalid opcode\|strata-init: exec' "$log")"
    elif [ "$end" = halt ] && { ! grep -qa "reboot: System halted" "$log" || ! qemu_running "$name"; }; then
        nok "cpu $name" "did not stay halted: $(qemu_tail "$name" 3)"
    elif [ "$end" = reboot ] && { qemu_running "$name" || ! grep -qa "reboot: Restarting system" "$log"; }; then
        nok "cpu $name" "did not reboot: $(qemu_tail "$name" 3)"
    else
        ok "cpu $name: one line names the missing features and the fix, then $end"
    fi
    qemu_stop "$name"
}
run halt
run reboot
exit $fail
