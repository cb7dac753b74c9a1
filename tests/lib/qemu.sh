#!/bin/bash
# qemu.sh: boot QEMU guests for tests and read their serial console, like u-root's and
# buildroot's harnesses: the console goes to a file, tests wait for marker strings with timeouts.
#
# As a library (source it from a test script):
#   . tests/lib/qemu.sh
#   qemu_start vm1 -kernel build/kernel/vmlinuz -initrd out/initrd.img \
#       -append "console=ttyS0 strata.ip=10.0.2.15/24" \
#       -netdev user,id=n0,hostfwd=tcp:127.0.0.1:18080-:8080 -device virtio-net-pci,netdev=n0
#   qemu_wait vm1 "strata: serving" 60 || echo "not ok - boot: $(qemu_tail vm1)"
#   qemu_monitor vm1 system_powerdown      # HMP command on the guest's monitor
#   qemu_wait_exit vm1 30                  # 0 when QEMU has exited (guest halted, -no-reboot)
#   qemu_stop vm1                          # kill it if still running (always call at the end)
# Every guest gets: -machine $QEMU_MACHINE(q35) -cpu $QEMU_CPU(max) -m $QEMU_MEM(512) -smp $QEMU_SMP(2) -nodefaults
# -display none -no-reboot, the first serial port in $QEMU_DIR/NAME.log, an HMP monitor on a unix
# socket, and -accel $QEMU_ACCEL (default tcg: /dev/kvm exists on the CI machine but does not
# work; `qemu_accel_probe` answers kvm only if a guest actually boots with it).
# Timeouts given to qemu_wait* are multiplied by $QEMU_TIMEOUT_SCALE (default 1) for slow hosts.
# The guest's -no-reboot makes a reboot request end QEMU too: use qemu_start_reboots NAME ... to
# let a guest reboot (then each boot appends to the same log).
#
# As a command (for a one-off boot by hand):
#   tests/lib/qemu.sh run [--wait MARKER] [--timeout S] -- QEMU-ARGS...
#     boots, prints the console as it comes, exits 0 when MARKER appears (the guest is then killed)
#     or when the guest halts if no MARKER is given, 1 on timeout.

QEMU_BIN=${QEMU_BIN:-qemu-system-x86_64}
QEMU_MACHINE=${QEMU_MACHINE:-q35}   # arm64 guests: QEMU_BIN=qemu-system-aarch64 QEMU_MACHINE=virt
QEMU_DIR=${QEMU_DIR:-build/qemu}
QEMU_MEM=${QEMU_MEM:-512}
QEMU_SMP=${QEMU_SMP:-2}
QEMU_ACCEL=${QEMU_ACCEL:-tcg}
QEMU_TIMEOUT_SCALE=${QEMU_TIMEOUT_SCALE:-1}
declare -A QEMU_PIDS=()

# qemu_accel_probe [KERNEL]: "kvm" when a guest really runs under KVM here (a kernel with no root
# file system must reach its panic within a few seconds), "tcg" otherwise.
qemu_accel_probe() {
    local k=${1:-build/kernel/vmlinuz} out
    [ -w /dev/kvm ] && [ -f "$k" ] || { echo tcg; return; }
    out=$(timeout 15 "$QEMU_BIN" -accel kvm -machine q35 -cpu host -m 256 -nodefaults \
        -display none -no-reboot -serial stdio -kernel "$k" \
        -append "console=ttyS0 panic=-1 loglevel=1" 2>/dev/null | head -c 65536)
    case $out in *"Kernel panic"*) echo kvm ;; *) echo tcg ;; esac
}

_qemu_launch() { # _qemu_launch NAME REBOOT(0|1) ARGS...
    local name=$1 reboot=$2 cpu=${QEMU_CPU:-max}
    shift 2
    mkdir -p "$QEMU_DIR"
    local log=$QEMU_DIR/$name.log mon=$QEMU_DIR/$name.mon
    rm -f "$log" "$mon"
    : >"$log"
    [ "$QEMU_ACCEL" = kvm ] && [ -z "${QEMU_CPU:-}" ] && cpu=host
    local noreboot=-no-reboot
    [ "$reboot" = 1 ] && noreboot=
    "$QEMU_BIN" -machine "$QEMU_MACHINE" -accel "$QEMU_ACCEL" -cpu "$cpu" -m "$QEMU_MEM" -smp "$QEMU_SMP" \
        -nodefaults -display none $noreboot \
        -serial "file:$log" -monitor "unix:$mon,server,nowait" "$@" \
        >"$QEMU_DIR/$name.qemu.log" 2>&1 &
    QEMU_PIDS[$name]=$!
}

# qemu_start NAME QEMU-ARGS...: start a guest in the background (exits QEMU on reboot).
qemu_start() { _qemu_launch "$1" 0 "${@:2}"; }
# qemu_start_reboots NAME QEMU-ARGS...: the same, but a guest reboot restarts it.
qemu_start_reboots() { _qemu_launch "$1" 1 "${@:2}"; }

qemu_log() { echo "$QEMU_DIR/$1.log"; }
qemu_running() { local p=${QEMU_PIDS[$1]:-}; [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

# qemu_wait NAME MARKER TIMEOUT [FAIL-MARKER...]: 0 when MARKER (a fixed string) is on the
# console, 1 on timeout, 2 when QEMU exited first, 3 when a FAIL-MARKER showed up first (e.g.
# "Kernel panic", or the UEFI shell's "Shell>" when the firmware found nothing to boot).
qemu_wait() {
    local name=$1 marker=$2 limit f
    limit=$(awk -v t="$3" -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", t * s * 10 }')
    shift 3
    local i=0
    while [ $i -lt "$limit" ]; do
        grep -qaF -- "$marker" "$QEMU_DIR/$name.log" 2>/dev/null && return 0
        for f in "$@"; do grep -qaF -- "$f" "$QEMU_DIR/$name.log" 2>/dev/null && return 3; done
        qemu_running "$name" || { grep -qaF -- "$marker" "$QEMU_DIR/$name.log" && return 0; return 2; }
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# qemu_count NAME MARKER: how many console lines hold MARKER (e.g. boots seen after a reboot).
qemu_count() { grep -caF -- "$2" "$QEMU_DIR/$1.log" 2>/dev/null || true; }

# qemu_wait_exit NAME TIMEOUT: 0 when QEMU has exited within TIMEOUT seconds, 1 otherwise.
qemu_wait_exit() {
    local name=$1 limit i=0
    limit=$(awk -v t="$2" -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", t * s * 10 }')
    while [ $i -lt "$limit" ]; do
        qemu_running "$name" || return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# qemu_monitor NAME COMMAND: run one HMP command (system_powerdown, quit, info ...).
qemu_monitor() {
    python3 - "$QEMU_DIR/$1.mon" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(2)
try:
    s.recv(4096)
except OSError:
    pass
s.sendall((sys.argv[2] + "\n").encode())
time.sleep(0.3)
try:
    sys.stdout.write(s.recv(65536).decode(errors="replace"))
except OSError:
    pass
PY
}

# qemu_stop NAME: end the guest if it still runs (kill, then wait for it).
qemu_stop() {
    local p=${QEMU_PIDS[$1]:-}
    [ -n "$p" ] || return 0
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    unset "QEMU_PIDS[$1]"
    return 0
}

# qemu_tail NAME [N]: the last N (5) console lines on one line, for "not ok" messages.
qemu_tail() { tail -n "${2:-5}" "$QEMU_DIR/$1.log" 2>/dev/null | tr -d '\r' | tr '\n' '|'; }

# qemu_free_port: a TCP port on 127.0.0.1 that nothing listens on now.
qemu_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    [ "${1:-}" = run ] || { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
    shift
    marker="" timeout=120
    while [ $# -gt 0 ]; do
        case $1 in
        --wait) marker=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    trap 'qemu_stop cli' EXIT
    qemu_start cli "$@"
    tail -F -n +1 "$QEMU_DIR/cli.log" 2>/dev/null &
    tailpid=$!
    if [ -n "$marker" ]; then qemu_wait cli "$marker" "$timeout"; rc=$?; else qemu_wait_exit cli "$timeout"; rc=$?; fi
    sleep 0.2
    kill $tailpid 2>/dev/null
    [ $rc = 0 ] && exit 0 || exit 1
fi
