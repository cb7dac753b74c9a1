#!/bin/bash
# nvidia-bundle.sh: stage NVIDIA's driver for the image (`make image NVIDIA=path` runs it).
#
#   image/nvidia-bundle.sh SRC OUTDIR KERNEL-RELEASE
#
# SRC is NVIDIA's .run package (NVIDIA-Linux-x86_64-VER.run, unpacked here with
# `sh SRC --extract-only --target DIR`) or a directory it was extracted to. It must hold the open
# kernel modules built for KERNEL-RELEASE (the image's kernel, build/kernel/version): the .run
# carries their sources, not binaries; image/README.md says how to build them against Debian's
# kernel headers. Taken from SRC:
#   nvidia.ko nvidia-uvm.ko nvidia-modeset.ko nvidia-drm.ko [nvidia-peermem.ko]
#             from kernel-open/ (where the build leaves them), else anywhere under SRC; their
#             vermagic must name KERNEL-RELEASE
#   libcuda.so.VER, libnvidia-ptxjitcompiler.so.VER, libnvidia-nvvm.so.VER,
#   libnvidia-gpucomp.so.VER, libnvidia-ml.so.VER (those present; libcuda required), each
#             installed under its SONAME (libcuda.so.1 ...), which is the name the server and
#             libcuda itself dlopen()
#   firmware/gsp_*.bin  the GSP firmware the open modules load, to nvidia/VER/
# Writes OUTDIR/modules/*.ko, OUTDIR/libs/*, OUTDIR/firmware/nvidia/VER/*; prints what it took.
set -euo pipefail
SRC=${1:?usage: nvidia-bundle.sh SRC OUTDIR KERNEL-RELEASE}
OUT=${2:?usage: nvidia-bundle.sh SRC OUTDIR KERNEL-RELEASE}
REL=${3:?usage: nvidia-bundle.sh SRC OUTDIR KERNEL-RELEASE}
say() { echo "nvidia: $*" >&2; }
die() { echo "nvidia: error: $*" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/modules" "$OUT/libs" "$OUT/firmware"
if [ -f "$SRC" ]; then
    say "extracting $SRC"
    sh "$SRC" --extract-only --target "$OUT/extracted" >/dev/null 2>&1 ||
        die "$SRC: 'sh $SRC --extract-only --target DIR' failed (not an NVIDIA .run package?)"
    SRC=$OUT/extracted
fi
[ -d "$SRC" ] || die "$SRC: neither a .run package nor a directory"

# --- kernel modules --------------------------------------------------------------------------
for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
    ko=""
    [ -f "$SRC/kernel-open/$m.ko" ] && ko=$SRC/kernel-open/$m.ko
    [ -n "$ko" ] || ko=$(find -L "$SRC" -name "$m.ko" -type f 2>/dev/null | LC_ALL=C sort | head -n 1)
    if [ -z "$ko" ]; then
        case $m in
        nvidia | nvidia-uvm)
            die "$SRC has no $m.ko: build the open kernel modules for $REL first" \
                "(make -C $SRC/kernel-open SYSSRC=/usr/src/linux-headers-$REL modules; image/README.md)" ;;
        *) continue ;;
        esac
    fi
    vm=$(modinfo -F vermagic "$ko" 2>/dev/null || true)
    [ "${vm%% *}" = "$REL" ] || die "$ko: built for kernel '${vm%% *}', the image's is $REL (rebuild against linux-headers-$REL)"
    cp "$ko" "$OUT/modules/$m.ko"
    say "module $m.ko ($(stat -c %s "$ko") bytes)"
done

# --- user-space libraries, under their SONAMEs -------------------------------------------------
soname() { objdump -p "$1" 2>/dev/null | sed -n 's/^ *SONAME *//p'; }
ver=""
for lib in libcuda libnvidia-ptxjitcompiler libnvidia-nvvm libnvidia-gpucomp libnvidia-ml; do
    # The versioned file (libcuda.so.580.65.06), not the links; the .run keeps them at its top.
    f=$(find "$SRC" -maxdepth 2 -name "$lib.so.*.*" -type f 2>/dev/null | LC_ALL=C sort | head -n 1)
    if [ -z "$f" ]; then
        [ "$lib" = libcuda ] && die "$SRC has no $lib.so.* (the driver's user-space library)"
        continue
    fi
    so=$(soname "$f")
    [ -n "$so" ] || die "$f: no SONAME"
    cp "$f" "$OUT/libs/$so"
    [ "$lib" = libcuda ] && ver=${f##*/libcuda.so.}
    say "library $so <- ${f#"$SRC"/} ($(stat -c %s "$f") bytes)"
done

# --- GSP firmware (the open modules refuse to bind without it) ----------------------------------
for f in "$SRC"/firmware/*.bin; do
    [ -f "$f" ] || continue
    mkdir -p "$OUT/firmware/nvidia/$ver"
    cp "$f" "$OUT/firmware/nvidia/$ver/"
    say "firmware nvidia/$ver/${f##*/}"
done
rm -rf "$OUT/extracted"
