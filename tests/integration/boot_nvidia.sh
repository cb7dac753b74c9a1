#!/bin/bash
# boot_nvidia: `make image NVIDIA=path` with a bundle this test makes, since Debian's main archive
# has no NVIDIA driver and this machine no GPU. The bundle is a fake NVIDIA-Linux-x86_64-999.0.run
# (a shell archive that honours --extract-only --target DIR, as NVIDIA's does) holding:
#   kernel-open/nvidia.ko, nvidia-uvm.ko   dummy modules built against Debian's kernel headers
#                                          (tests/fixtures/nvidia; the real ones are NVIDIA's open
#                                          modules built the same way, image/README.md)
#   libcuda.so.999.0                       a stub driver library (SONAME libcuda.so.1) whose
#                                          cuInit answers CUDA_ERROR_NO_DEVICE, and whose
#                                          cuGetErrorString says "(stub)"
# Checks: the files land at their paths in the initrd, /etc/modules loads nvidia before
# nvidia_uvm, the guest's init loads both and makes the /dev/nvidia* nodes, the server dlopen()s
# the stub and logs why the CUDA backend is out, and serves a completion on the CPU equal to the
# native greedy output.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_nvidia
W=build/test-nvidia
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

image/fetch-kernel.sh build/kernel >/dev/null 2>&1 || { nok "nvidia kernel" "image/fetch-kernel.sh failed"; exit 1; }
rel=$(cat build/kernel/version)
hdr=/usr/src/linux-headers-$rel
if [ ! -d "$hdr" ]; then
    echo "skip - nvidia bundle: $hdr missing (apt-get install linux-headers-$rel; make deps installs linux-headers-amd64)"
    exit 0
fi
rm -rf "$W" && mkdir -p "$W/bundle/kernel-open" "$W/kb" "$QEMU_DIR"

# --- the bundle --------------------------------------------------------------------------------
cp tests/fixtures/nvidia/Kbuild tests/fixtures/nvidia/nvidia.c tests/fixtures/nvidia/nvidia-uvm.c "$W/kb/"
if ! make -s -C "$hdr" M="$PWD/$W/kb" modules >"$W/kb.log" 2>&1; then
    nok "nvidia dummy modules build against $hdr" "$(tail -n 3 "$W/kb.log" | tr '\n' '|')"
    exit 1
fi
cp "$W/kb/nvidia.ko" "$W/kb/nvidia-uvm.ko" "$W/bundle/kernel-open/"
ok "nvidia dummy modules built for $rel ($(modinfo -F vermagic "$W/kb/nvidia.ko" | cut -d' ' -f1))"
# The stub exports every cu* entry point the binding resolves, whatever it grows to.
grep -o '"cu[A-Za-z0-9_]*"' drivers/cuda/cu_api.c | tr -d '"' | sort -u |
    grep -vx -e cuInit -e cuGetErrorString | sed 's/.*/STUB(&)/' >"$W/stubs.c"
if ! cat tests/fixtures/nvidia/stub_libcuda.c "$W/stubs.c" >"$W/stub.c" ||
    ! cc -shared -fPIC -Wall -Wextra -Werror -Wl,-soname,libcuda.so.1 -o "$W/bundle/libcuda.so.999.0" "$W/stub.c"; then
    nok "nvidia stub libcuda builds" "cc failed"
    exit 1
fi
ln -s libcuda.so.999.0 "$W/bundle/libcuda.so.1"
run=$W/NVIDIA-Linux-x86_64-999.0.run
{
    printf '#!/bin/sh\n# test stand-in for an NVIDIA .run package: --extract-only --target DIR\n'
    printf 't=""\nwhile [ $# -gt 0 ]; do [ "$1" = --target ] && t=$2; shift; done\n'
    printf '[ -n "$t" ] || exit 2\nmkdir -p "$t" && sed "1,/^__ARCHIVE__$/d" "$0" | tar -xz -C "$t"\nexit $?\n__ARCHIVE__\n'
    tar -czf - -C "$W/bundle" .
} >"$run"

# --- the image -----------------------------------------------------------------------------------
# A light zstd level: this image is built for this test only.
if ! NVIDIA=$run ZSTD_LEVEL=3 CMDLINE="$BOOT_KERNEL_ARGS $BOOT_ARGS" image/build.sh "$W/out" >"$W/build.log" 2>&1; then
    nok "make image NVIDIA=.run" "$(grep -a 'error' "$W/build.log" | tail -n 3 | tr '\n' '|')"
    exit 1
fi
ok "make image NVIDIA=.run takes the bundle ($(sed -n 's/^nvidia: \(module\|library\) \([^ ]*\).*/\2/p' "$W/build.log" | tr '\n' ' '))"
list=$(zstd -dc "$W/out/initrd-base.img" | cpio -t --quiet 2>/dev/null)
mods=$(zstd -dc "$W/out/initrd-base.img" | cpio -i --quiet --to-stdout etc/modules 2>/dev/null)
missing=""
for f in lib/modules/nvidia.ko lib/modules/nvidia_uvm.ko usr/lib/x86_64-linux-gnu/libcuda.so.1; do
    grep -qx "$f" <<<"$list" || missing="$missing /$f"
done
if [ -z "$missing" ]; then ok "nvidia files at their paths in the initrd"
else nok "nvidia files at their paths in the initrd" "missing:$missing"; fi
a=$(grep -nx /lib/modules/nvidia.ko <<<"$mods" | cut -d: -f1)
b=$(grep -nx /lib/modules/nvidia_uvm.ko <<<"$mods" | cut -d: -f1)
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]; then ok "/etc/modules loads nvidia (line $a) before nvidia_uvm (line $b)"
else nok "/etc/modules loads nvidia before nvidia_uvm" "lines ${a:-none} and ${b:-none}"; fi

# --- the guest -----------------------------------------------------------------------------------
port=$(qemu_free_port)
t0=$(date +%s.%N)
kernel=$W/out/vmlinux
[ -f "$kernel" ] || kernel=$W/out/vmlinuz
qemu_start nv -kernel "$kernel" -initrd "$W/out/initrd.img" \
    -append "console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 $BOOT_KERNEL_ARGS $BOOT_ARGS" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop nv' EXIT
if ! qemu_wait nv "strata-init: exec" 180 "Kernel panic" "strata-init: error"; then
    nok "nvidia guest boots" "$(qemu_tail nv 6)"
    exit 1
fi
log=$(qemu_log nv)
a=$(grep -an "strata-init: modules: nvidia.ko" "$log" | cut -d: -f1)
b=$(grep -an "strata-init: modules: nvidia_uvm.ko" "$log" | cut -d: -f1)
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]; then ok "guest init loads nvidia, then nvidia_uvm"
else nok "guest init loads nvidia, then nvidia_uvm" "$(grep -a 'modules: .*nvidia' "$log" | tr '\r\n' '  ')"; fi
if grep -qa "strata-init: nvidia: 3 device nodes" "$log"; then ok "guest init makes /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools"
else nok "guest init makes the /dev/nvidia* nodes" "$(grep -a 'strata-init: nvidia' "$log" | tr '\r\n' '  ')"; fi
if boot_have_serve; then
    boot_http nv "$port" "$t0"
    # "(stub)" is only in the stub's cuGetErrorString: the server loaded the bundle's library.
    if grep -qa "backend cpu: .*no CUDA device (cuInit: no CUDA-capable device is detected (stub))" "$log"; then
        ok "server dlopens the bundle's libcuda.so.1 and says why the CPU serves ($(sed -n 's/.*engine: //p' "$log" | tr -d '\r' | head -n 1))"
    else
        nok "server dlopens the bundle's libcuda.so.1" "$(grep -a 'backend' "$log" | tr '\r\n' '  ')"
    fi
else
    echo "skip - nvidia http completion: build/strata has no serve command yet"
fi
exit $fail
