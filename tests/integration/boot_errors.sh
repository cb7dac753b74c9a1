#!/bin/bash
# boot_errors: bad kernel command lines end with a clear console error and then halt or reboot as
# strata.on_error asks, never a hang or a kernel panic. Kernel + initrd under QEMU (software
# emulation, -no-reboot: a reboot request ends QEMU).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_errors
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

if ! msg=$(boot_image); then nok "errors image" "$msg"; exit 1; fi
NET="-netdev user,id=n0 -device virtio-net-pci,netdev=n0"
BASE="console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2"

# expect NAME INITRD APPEND CONSOLE-TEXT END(halt|reboot): CONSOLE-TEXT is init's error line
# ("strata-init: error: ...") or the server's ("strata: fatal: ...").
expect() {
    local name=$1 initrd=$2 append=$3 text=$4 end=$5 log
    qemu_start "$name" -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/$initrd" -append "$append" $NET
    log=$(qemu_log "$name")
    if [ "$end" = halt ]; then
        qemu_wait "$name" "reboot: System halted" 60
    else
        qemu_wait_exit "$name" 60
    fi
    if ! grep -qaF "$text" "$log"; then
        nok "errors $name" "no console line '$text': $(qemu_tail "$name" 4)"
    elif [ "$end" = halt ] && ! grep -qa "reboot: System halted" "$log"; then
        nok "errors $name" "did not halt: $(qemu_tail "$name" 3)"
    elif [ "$end" = halt ] && ! qemu_running "$name"; then
        nok "errors $name" "QEMU exited instead of staying halted: $(qemu_tail "$name" 3)"
    elif [ "$end" = reboot ] && { qemu_running "$name" || ! grep -qa "reboot: Restarting system" "$log"; }; then
        nok "errors $name" "did not reboot: $(qemu_tail "$name" 3)"
    elif grep -qa "Kernel panic" "$log"; then
        nok "errors $name" "kernel panic: $(grep -a -m1 'Kernel panic' "$log")"
    else
        ok "errors $name: '$(grep -aF -m1 "$text" "$log" | tr -d '\r' | cut -c1-110)' then $end"
    fi
    qemu_stop "$name"
}

expect unknown-key initrd.img "$BASE strata.colour=blue" \
    "strata-init: error: strata.colour: unknown key (see boot/cmdline.md)" halt
expect malformed-address initrd.img "console=ttyS0 quiet strata.ip=10.0.2.300/24" \
    "strata-init: error: strata.ip=10.0.2.300/24: malformed address (want A.B.C.D/PREFIX, dhcp or off)" halt
expect no-model-in-image initrd-base.img "$BASE" \
    "strata-init: error: strata.model=/model.gguf: model /model.gguf: No such file or directory (no strata.model= given" halt
expect reboot-on-error initrd.img "$BASE strata.port=http strata.on_error=reboot" \
    "strata-init: error: strata.port=http: want a TCP port 1..65535" reboot
# The server's own fatal errors, once it is PID 1: a model that is not GGUF, and a usage error
# that makes it leave main() before it set up anything (os/runtime/pid1.c arms itself before main).
expect server-bad-model initrd.img "$BASE strata.model=/init strata.on_error=reboot" \
    "strata: fatal: serve: " reboot
expect server-usage-error initrd.img "$BASE strata.args=--no-such-flag" \
    "strata: fatal: the server exited without a shutdown request" halt
exit $fail
