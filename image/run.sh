#!/bin/bash
# run.sh: boot the appliance image under QEMU with the API on localhost (`make run` builds the
# image first and then runs this).
#
#   image/run.sh [OUT]          (OUT defaults to out/, as `make image` writes it)
# Environment:
#   PORT=8080        host port forwarded to the guest's API port 8080
#   ACCEL=kvm|tcg    default: kvm when a guest really runs under it here (probed once, cached in
#                    build/qemu-accel), else tcg (software emulation)
#   MEM=MiB          guest memory (default: 1024, or 3x the model plus 512 when larger)
#   SMP=N            guest CPUs (default: the host's, at most 8)
#   APPEND="..."     more kernel command-line keys (boot/cmdline.md), e.g. "strata.api_key=k";
#                    the guest has an i6300esb watchdog for APPEND="strata.watchdog=30"; no
#                    strata.ip: the address comes from QEMU's DHCP server (10.0.2.15)
#   DISK=1           boot out/strata.img under OVMF (UEFI) instead of kernel + initrd
#   GPU=0000:01:00.0 pass a host PCI device (a GPU) to the guest through VFIO. Needs KVM, an IOMMU
#                    (intel_iommu=on / amd_iommu=on on the host), the device bound to the host's
#                    vfio-pci driver, and its driver in the image (`make image NVIDIA=path`,
#                    image/README.md). Not testable on the CI machine (no working KVM, no GPU).
#   NATIVE=1         skip QEMU: run build/strata serve on the host instead
# The console is this terminal (Ctrl-A X quits QEMU; `system_powerdown` on the QEMU monitor,
# Ctrl-A C, presses the power button and the server shuts down cleanly).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
PORT=${PORT:-8080}
MODEL_FILE=${MODEL:-build/models/stories260K.gguf}

if [ "${NATIVE:-0}" = 1 ]; then
    echo "run: native: build/strata serve -m $MODEL_FILE --port $PORT"
    exec build/strata serve -m "$MODEL_FILE" --port "$PORT"
fi

. tests/lib/qemu.sh
if [ -z "${ACCEL:-}" ]; then
    if [ -f build/qemu-accel ]; then ACCEL=$(cat build/qemu-accel); else
        echo "run: probing KVM (once; cached in build/qemu-accel)"
        ACCEL=$(qemu_accel_probe "$OUT/vmlinuz")
        echo "$ACCEL" >build/qemu-accel
    fi
fi
cpu=max
[ "$ACCEL" = kvm ] && cpu=host
smp=${SMP:-$(nproc)}
[ "$smp" -gt 8 ] && smp=8
mem=${MEM:-1024}
if [ -z "${MEM:-}" ] && [ -f "$MODEL_FILE" ]; then
    need=$(($(stat -c %s "$MODEL_FILE") * 3 / 1048576 + 512))
    [ "$need" -gt "$mem" ] && mem=$need
fi
# Software emulation is ~50x slower than the host: smaller serving limits keep the server's
# start-up calibration short. Under KVM the server's defaults apply.
args=""
[ "$ACCEL" = tcg ] && args='strata.args="--max-batch 4 --step-tokens 32"'

Q=(qemu-system-x86_64 -machine q35 -accel "$ACCEL" -cpu "$cpu" -m "$mem" -smp "$smp"
    -nodefaults -display none -serial mon:stdio
    -netdev "user,id=n0,hostfwd=tcp::$PORT-:8080" -device virtio-net-pci,netdev=n0,romfile=
    -device i6300esb -action watchdog=reset)
if [ -n "${GPU:-}" ]; then
    [ "$ACCEL" = kvm ] || { echo "run: GPU=$GPU needs KVM (ACCEL=$ACCEL)" >&2; exit 1; }
    Q+=(-device "vfio-pci,host=$GPU")
fi
if [ "${DISK:-0}" = 1 ]; then
    mkdir -p build/qemu
    cp /usr/share/OVMF/OVMF_VARS_4M.fd build/qemu/run-vars.fd
    Q+=(-drive if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd
        -drive if=pflash,format=raw,file=build/qemu/run-vars.fd
        -drive "if=none,id=d0,format=raw,snapshot=on,file=$OUT/strata.img"
        -device virtio-blk-pci,drive=d0,bootindex=0)
else
    kernel=$OUT/vmlinux # uncompressed: QEMU's PVH entry skips the slow emulated decompression
    [ -f "$kernel" ] || kernel=$OUT/vmlinuz
    Q+=(-kernel "$kernel" -initrd "$OUT/initrd.img"
        -append "console=ttyS0 quiet panic=10 $args ${APPEND:-}")
fi
echo "run: QEMU ($ACCEL, $smp CPUs, $mem MiB); API on http://localhost:$PORT once the console says 'ready'"
echo "run: curl localhost:$PORT/v1/completions -d '{\"prompt\":\"Once upon a time\",\"max_tokens\":40}'"
exec "${Q[@]}"
