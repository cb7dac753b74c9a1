#!/bin/sh
# fetch-kernel.sh: Debian's kernel, downloaded (never installed on the host) and unpacked.
#
#   image/fetch-kernel.sh [DIR]          (DIR defaults to build/kernel)
#   ARCH=arm64 image/fetch-kernel.sh DIR  Debian's arm64 kernel (linux-image-arm64), through the
#                                         private arm64 apt configuration of image/arm64-sysroot.sh
#
# Resolves the linux-image-ARCH metapackage to the versioned package it depends on
# (linux-image-6.1.0-NN-ARCH), fetches that .deb with `apt-get download` into DIR/debs (cached:
# a second run downloads nothing), and unpacks it into DIR/root. Afterwards:
#   DIR/vmlinuz      the kernel (a link into root/boot)
#   DIR/vmlinux      the same kernel uncompressed (ELF, taken out of the bzImage): QEMU boots it
#                    through its PVH entry point, which under software emulation reaches init in
#                    ~3.5 s instead of ~9 s (no real-mode loader, no emulated decompression).
#                    Use it with -kernel in QEMU tests; real machines and boot loaders use vmlinuz.
#                    (amd64 only)
#   DIR/Image        arm64: the kernel's Image (Debian 12's vmlinuz is one; a gzipped one is
#                    gunzipped), for qemu-system-aarch64 -kernel and the UKI (the Image is itself
#                    a PE/EFI application)
#   DIR/modules      the module tree (a link to root/lib/modules/VERSION)
#   DIR/version      the kernel release string, e.g. 6.1.0-56-amd64 (6.1.0-56-arm64)
# KERNEL_DEB=path.deb uses a given package instead of resolving and downloading one.
# Prints the kernel release on stdout; progress goes to stderr.
set -eu
DIR=${1:-build/kernel}
mkdir -p "$DIR/debs"
say() { echo "fetch-kernel: $*" >&2; }
case ${ARCH:-} in "" | amd64 | x86_64) KARCH=amd64 ;; arm64 | aarch64) KARCH=arm64 ;; *) KARCH=$ARCH ;; esac
case $KARCH in
amd64) APT_CACHE="apt-cache" APT_GET="apt-get" ;;
arm64)
    apt_arm64="$(cd "$(dirname "$0")" && pwd)/arm64-sysroot.sh --apt"
    APT_CACHE="$apt_arm64 apt-cache" APT_GET="$apt_arm64 apt-get"
    ;;
*) say "ARCH=$KARCH: want amd64 or arm64"; exit 1 ;;
esac

if [ -n "${KERNEL_DEB:-}" ]; then
    deb=$KERNEL_DEB
else
    # The metapackage only depends on the real one; resolve it (apt lists may be missing on a
    # fresh machine: update them once).
    pkg=$($APT_CACHE depends linux-image-$KARCH 2>/dev/null | sed -n "s/^ *Depends: \(linux-image-[0-9].*-$KARCH\)\$/\1/p" | head -n 1)
    if [ -z "$pkg" ] && [ "$KARCH" = amd64 ]; then
        say "apt lists have no linux-image-amd64; running apt-get update"
        apt-get update -qq >&2 || true
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n 1)
    fi
    [ -n "$pkg" ] || { say "cannot resolve linux-image-$KARCH to a versioned package"; exit 1; }
    ver=$($APT_CACHE policy "$pkg" | sed -n 's/^ *Candidate: //p')
    deb=$(ls "$DIR/debs/${pkg}_"*"_$KARCH.deb" 2>/dev/null | head -n 1 || true)
    case "$deb" in
    *"_$(echo "$ver" | sed 's/:/%3a/')_$KARCH.deb") say "cached $(basename "$deb")" ;;
    *)
        say "downloading $pkg $ver"
        rm -f "$DIR/debs/${pkg}_"*.deb
        (cd "$DIR/debs" && $APT_GET download -q "$pkg" >&2 2>/dev/null) ||
            (cd "$DIR/debs" && $APT_GET download "$pkg" >&2)
        deb=$(ls "$DIR/debs/${pkg}_"*"_$KARCH.deb" | head -n 1)
        ;;
    esac
fi

# Unpack once per package (the stamp names the .deb it came from).
stamp="$DIR/root/.from"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$(basename "$deb")" ]; then
    say "unpacking $(basename "$deb")"
    rm -rf "$DIR/root"
    mkdir -p "$DIR/root"
    dpkg-deb -x "$deb" "$DIR/root"
    basename "$deb" >"$stamp"
fi
release=$(ls "$DIR/root/lib/modules" | head -n 1)
[ -n "$release" ] && [ -f "$DIR/root/boot/vmlinuz-$release" ] || { say "no kernel in $deb"; exit 1; }
ln -sfn "root/boot/vmlinuz-$release" "$DIR/vmlinuz"

# arm64: QEMU's -kernel and the UKI want the Image itself (magic "ARM\x64" at byte 56). Debian
# 12's vmlinuz is that Image already; a gzipped one (other kernels) is gunzipped.
if [ "$KARCH" = arm64 ]; then
    if [ ! -f "$DIR/Image" ] || [ -n "$(find "$stamp" -newer "$DIR/Image")" ]; then
        v=$DIR/root/boot/vmlinuz-$release
        if [ "$(head -c 2 "$v" | od -An -tx1 | tr -d ' ')" = 1f8b ]; then
            say "gunzipping the Image"
            gzip -dc "$v" >"$DIR/Image.tmp"
        else
            cp "$v" "$DIR/Image.tmp"
        fi
        [ "$(tail -c +57 "$DIR/Image.tmp" | head -c 4 | od -An -tx1 | tr -d ' ')" = 41524d64 ] ||
            { rm -f "$DIR/Image.tmp"; say "vmlinuz-$release: no arm64 Image in it"; exit 1; }
        mv "$DIR/Image.tmp" "$DIR/Image"
    fi
# vmlinux: find the compressed payload by its magic (Debian uses xz; zstd and gzip for others)
# and keep the first candidate that decompresses to an ELF file.
elif [ ! -f "$DIR/vmlinux" ] || [ -n "$(find "$stamp" -newer "$DIR/vmlinux")" ]; then
    say "extracting vmlinux"
    rm -f "$DIR/vmlinux"
    for magic in "$(printf '\3757zXZ')" "$(printf '\050\265\057\375')" "$(printf '\037\213\010')"; do
        for off in $(LC_ALL=C grep -abo "$magic" "$DIR/root/boot/vmlinuz-$release" | cut -d: -f1 | head -n 4); do
            tail -c +$((off + 1)) "$DIR/root/boot/vmlinuz-$release" |
                { xz -dc 2>/dev/null || zstd -qdc 2>/dev/null || gzip -dc 2>/dev/null; } >"$DIR/vmlinux.tmp" || true
            if [ "$(head -c 4 "$DIR/vmlinux.tmp" | od -An -c | tr -d ' ')" = "177ELF" ]; then
                mv "$DIR/vmlinux.tmp" "$DIR/vmlinux"
                break 2
            fi
        done
    done
    rm -f "$DIR/vmlinux.tmp"
    [ -f "$DIR/vmlinux" ] || say "warning: no ELF kernel inside vmlinuz; QEMU tests fall back to vmlinuz"
fi
ln -sfn "root/lib/modules/$release" "$DIR/modules"
echo "$release" >"$DIR/version"
echo "$release"
