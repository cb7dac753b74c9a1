#!/bin/sh
# fetch-kernel.sh: Debian's kernel, downloaded (never installed on the host) and unpacked.
#
#   image/fetch-kernel.sh [DIR]          (DIR defaults to build/kernel)
#
# Resolves the linux-image-amd64 metapackage to the versioned package it depends on
# (linux-image-6.1.0-NN-amd64), fetches that .deb with `apt-get download` into DIR/debs (cached:
# a second run downloads nothing), and unpacks it into DIR/root. Afterwards:
#   DIR/vmlinuz      the kernel (a link into root/boot)
#   DIR/vmlinux      the same kernel uncompressed (ELF, taken out of the bzImage): QEMU boots it
#                    through its PVH entry point, which under software emulation reaches init in
#                    ~3.5 s instead of ~9 s (no real-mode loader, no emulated decompression).
#                    Use it with -kernel in QEMU tests; real machines and boot loaders use vmlinuz.
#   DIR/modules      the module tree (a link to root/lib/modules/VERSION)
#   DIR/version      the kernel release string, e.g. 6.1.0-56-amd64
# KERNEL_DEB=path.deb uses a given package instead of resolving and downloading one.
# Prints the kernel release on stdout; progress goes to stderr.
set -eu
DIR=${1:-build/kernel}
mkdir -p "$DIR/debs"
say() { echo "fetch-kernel: $*" >&2; }

if [ -n "${KERNEL_DEB:-}" ]; then
    deb=$KERNEL_DEB
else
    # The metapackage only depends on the real one; resolve it (apt lists may be missing on a
    # fresh machine: update them once).
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n 1)
    if [ -z "$pkg" ]; then
        say "apt lists have no linux-image-amd64; running apt-get update"
        apt-get update -qq >&2 || true
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n 1)
    fi
    [ -n "$pkg" ] || { say "cannot resolve linux-image-amd64 to a versioned package"; exit 1; }
    ver=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
    deb=$(ls "$DIR/debs/${pkg}_"*"_amd64.deb" 2>/dev/null | head -n 1 || true)
    case "$deb" in
    *"_$(echo "$ver" | sed 's/:/%3a/')_amd64.deb") say "cached $(basename "$deb")" ;;
    *)
        say "downloading $pkg $ver"
        rm -f "$DIR/debs/${pkg}_"*.deb
        (cd "$DIR/debs" && apt-get download -q "$pkg" >&2 2>/dev/null) ||
            (cd "$DIR/debs" && apt-get download "$pkg" >&2)
        deb=$(ls "$DIR/debs/${pkg}_"*"_amd64.deb" | head -n 1)
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

# vmlinux: find the compressed payload by its magic (Debian uses xz; zstd and gzip for others)
# and keep the first candidate that decompresses to an ELF file.
if [ ! -f "$DIR/vmlinux" ] || [ -n "$(find "$stamp" -newer "$DIR/vmlinux")" ]; then
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
