#!/bin/bash
# mkinitrd.sh: a reproducible initramfs (sorted newc cpio, fixed times and owners, deterministic
# compression) from an init program, binaries with their shared-library closure, kernel modules
# with their dependencies, and extra files.
#
#   image/mkinitrd.sh -o OUT -i INIT [options]
#     -o OUT         the initrd to write
#     -i INIT        the program that becomes /init (static binary, or a script whose interpreter
#                    you also include, e.g. -b /bin/busybox and "#!/bin/busybox sh")
#     -b BIN[:DEST]  an ELF binary or library and its ldd closure (ld-linux included). An absolute
#                    BIN keeps its path in the image, a relative one goes to /bin/NAME, unless
#                    DEST is given. Repeatable. For dlopen()ed objects (libibverbs providers, DPDK
#                    PMDs) name them with -b too: ldd cannot see them.
#     -m MODULE      a kernel module by name (virtio_net, rdma_rxe, ...) with everything its
#                    modinfo depends= (and softdep pre:) names, recursively. Repeatable; the order
#                    given is kept where dependencies allow.
#     -k MODDIR      the kernel's module tree (default build/kernel/modules, see fetch-kernel.sh)
#     -M DIR         extra modules: every *.ko under DIR (e.g. the NVIDIA driver's), loaded after
#                    the -m ones, dependencies resolved against DIR and MODDIR; -m may name them
#                    to fix their order. Repeatable.
#     -L DIR         extra libraries: DIR's files go to /usr/lib/TRIPLET (x86_64-linux-gnu; glibc's
#                    default search path, so no ld.so.cache is needed). Repeatable.
#     -A ARCH        amd64 (default) or arm64: the multiarch triplet (aarch64-linux-gnu) and the
#                    binutils (aarch64-linux-gnu-strip, -readelf) used for the image's files
#     -R SYSROOT     the binaries' libraries come from SYSROOT (a cross build's, e.g.
#                    build/arm64-sysroot): the closure is walked by hand from readelf's NEEDED
#                    entries and the program interpreter (ldd cannot run foreign binaries),
#                    searching SYSROOT/{lib,usr/lib}/TRIPLET then SYSROOT/{lib,usr/lib}; each goes
#                    to its path inside SYSROOT. A -b BIN under SYSROOT keeps that path too.
#     -f SRC:DEST    an extra file (DEST is its absolute path in the image). Repeatable.
#     -z COMP        zstd (default, level $ZSTD_LEVEL or 19) | xz | gzip | none
#     -S             strip ELF files (--strip-unneeded) as they are copied in
#     -v             list what goes in
# The image gets /lib/modules/NAME.ko for each module and /etc/modules: their paths, one a line,
# in load order (dependencies first), for init to finit_module() in turn. Debian's kernel package
# has no modules.dep, hence modinfo. Known missing edges: rdma_rxe needs crc32_generic loaded
# first but does not declare it (it asks the crypto API for "crc32" at run time), and
# crc64-rocksoft (t10-pi, under sd_mod and nvme) likewise wants crc64_rocksoft_generic: added.
# Empty /dev /proc /sys /run /tmp /mnt are created; /dev/console and /dev/null too when this runs
# as root (the kernel opens /dev/console for init before devtmpfs is mounted).
# Times are SOURCE_DATE_EPOCH (default: the last commit's time, else 0): the same inputs give the
# same bytes.
set -euo pipefail

OUT="" INIT="" MODDIR=build/kernel/modules COMP=zstd STRIP=0 VERBOSE=0 ARCH=amd64 SYSROOT=""
BINS=() MODS=() FILES=() EXTRA_MODS=() EXTRA_LIBS=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while getopts "o:i:b:m:k:M:L:f:z:A:R:Svh" opt; do
    case $opt in
    o) OUT=$OPTARG ;;
    i) INIT=$OPTARG ;;
    b) BINS+=("$OPTARG") ;;
    m) MODS+=("$OPTARG") ;;
    k) MODDIR=$OPTARG ;;
    M) EXTRA_MODS+=("$OPTARG") ;;
    L) EXTRA_LIBS+=("$OPTARG") ;;
    f) FILES+=("$OPTARG") ;;
    z) COMP=$OPTARG ;;
    A) ARCH=$OPTARG ;;
    R) SYSROOT=${OPTARG%/} ;;
    S) STRIP=1 ;;
    v) VERBOSE=1 ;;
    *) usage ;;
    esac
done
[ -n "$OUT" ] && [ -n "$INIT" ] || usage
die() { echo "mkinitrd: $*" >&2; exit 1; }
say() { [ "$VERBOSE" = 1 ] && echo "mkinitrd: $*" >&2 || true; }
case $ARCH in
amd64) TRIPLET=x86_64-linux-gnu STRIP_TOOL=strip READELF=readelf ;;
arm64) TRIPLET=aarch64-linux-gnu STRIP_TOOL=aarch64-linux-gnu-strip READELF=aarch64-linux-gnu-readelf ;;
*) die "-A $ARCH: want amd64 or arm64" ;;
esac
[ -z "$SYSROOT" ] || [ -d "$SYSROOT" ] || die "-R $SYSROOT: not a directory"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$(dirname "$0")" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/mkinitrd.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{dev,proc,sys,run,tmp,mnt,etc,bin,lib/modules}

is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }

# put SRC DEST: copy one file into the image (following links: the image holds plain files).
put() {
    local src=$1 dest=$2
    [ -e "$STAGE$dest" ] && return 0
    mkdir -p "$(dirname "$STAGE$dest")"
    cp -L "$src" "$STAGE$dest"
    if [ "$STRIP" = 1 ] && is_elf "$STAGE$dest"; then
        "$STRIP_TOOL" --strip-unneeded "$STAGE$dest" 2>/dev/null || true
    fi
    say "$dest"
}

# closure_sysroot BIN: the same from SYSROOT, by hand: the program interpreter, then every
# NEEDED entry, recursively, found where the interpreter's default search would find it (the
# multiarch directories first). Paths printed are inside SYSROOT, as the image will hold them.
closure_sysroot() {
    local queue=("$1") seen=" " f lib d found interp
    interp=$("$READELF" -l "$1" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \([^]]*\)\]/\1/p')
    [ -n "$interp" ] && echo "$interp"
    while [ ${#queue[@]} -gt 0 ]; do
        f=${queue[0]}
        queue=("${queue[@]:1}")
        for lib in $("$READELF" -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            case $seen in *" $lib "*) continue ;; esac
            seen="$seen$lib "
            found=""
            for d in /lib/$TRIPLET /usr/lib/$TRIPLET /lib /usr/lib; do
                if [ -e "$SYSROOT$d/$lib" ]; then found=$d/$lib; break; fi
            done
            if [ -z "$found" ]; then echo "missing $lib"; continue; fi
            echo "$found"
            queue+=("$SYSROOT$found")
        done
    done
}

# closure BIN: every shared object ldd says BIN needs, at the path ldd names (which is where
# ld-linux will look in the image too).
closure() {
    [ -n "$SYSROOT" ] && { closure_sysroot "$1"; return; }
    local line path
    ldd "$1" 2>/dev/null | while read -r line; do
        case $line in
        *"=> not found"*) echo "missing ${line%% *}" ;;
        *"=> /"*) path=${line#*=> }; echo "${path%% (*}" ;;
        /*) echo "${line%% (*}" ;;
        esac
    done
}

# --- init, binaries, libraries, files --------------------------------------------------------
[ -f "$INIT" ] || die "$INIT: no such init program"
put "$INIT" /init
chmod 0755 "$STAGE/init"

for spec in "${BINS[@]+"${BINS[@]}"}"; do
    src=${spec%%:*} dest=${spec#*:}
    if [ "$dest" = "$spec" ]; then
        case $src in
        "$SYSROOT"/*) [ -n "$SYSROOT" ] && dest=${src#"$SYSROOT"} || dest=$src ;;
        /*) dest=$src ;;
        *) dest=/bin/$(basename "$src") ;;
        esac
    fi
    [ -f "$src" ] || die "$src: no such binary"
    put "$src" "$dest"
    while read -r lib; do
        case $lib in missing*) die "$src: needs ${lib#missing }, which ${SYSROOT:-ldd} cannot find" ;; esac
        put "$SYSROOT$lib" "$lib"
    done < <(closure "$src")
done

for dir in "${EXTRA_LIBS[@]+"${EXTRA_LIBS[@]}"}"; do
    [ -d "$dir" ] || die "-L $dir: not a directory"
    while IFS= read -r f; do
        put "$f" "/usr/lib/$TRIPLET/${f#"$dir"/}"
    done < <(find "$dir" -type f -o -type l | LC_ALL=C sort)
done

for spec in "${FILES[@]+"${FILES[@]}"}"; do
    src=${spec%%:*} dest=${spec#*:}
    [ "$dest" != "$spec" ] && [ "${dest#/}" != "$dest" ] || die "-f $spec: want SRC:/ABSOLUTE/DEST"
    [ -f "$src" ] || die "$src: no such file"
    put "$src" "$dest"
done

# --- modules ---------------------------------------------------------------------------------
# Module names treat '-' and '_' alike; index every .ko by its normalised name.
declare -A MODPATH=() BUILTIN=() SEEN=()
norm() { local n=${1##*/}; n=${n%%.ko*}; echo "${n//-/_}"; }
if [ ${#MODS[@]} -gt 0 ] || [ ${#EXTRA_MODS[@]} -gt 0 ]; then
    [ -d "$MODDIR" ] || die "$MODDIR: no module tree (run image/fetch-kernel.sh)"
    # name<TAB>path for all ~4000 modules in one awk pass (a subshell per file would take seconds).
    keyed() { awk '{ n = $0; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n); print n "\t" $0 }'; }
    while IFS=$'\t' read -r n f; do MODPATH[$n]=$f; done < <(find -L "$MODDIR" -name '*.ko*' -type f | keyed)
    if [ -f "$MODDIR/modules.builtin" ]; then
        while IFS=$'\t' read -r n f; do BUILTIN[$n]=1; done < <(keyed <"$MODDIR/modules.builtin")
    fi
fi
EXTRA_LIST=()
for dir in "${EXTRA_MODS[@]+"${EXTRA_MODS[@]}"}"; do
    [ -d "$dir" ] || die "-M $dir: not a directory"
    while IFS= read -r f; do
        MODPATH[$(norm "$f")]=$f
        EXTRA_LIST+=("$(norm "$f")")
    done < <(find -L "$dir" -name '*.ko*' -type f | LC_ALL=C sort)
done

# Dependencies the modules do not declare (see the header).
declare -A HIDDEN_DEPS=([rdma_rxe]="crc32_generic" [crc64_rocksoft]="crc64_rocksoft_generic")

mod_deps() {
    local f=${MODPATH[$1]} d s x
    d=$(modinfo -F depends "$f" 2>/dev/null | tr ',' ' ')
    s=$(modinfo -F softdep "$f" 2>/dev/null | sed -n 's/.*pre: *\([^:]*\)\( post:.*\)\{0,1\}$/\1/p' | sed 's/ post$//')
    for x in $s; do d="$d $(resolve_soft "$x")"; done
    echo "$d ${HIDDEN_DEPS[$1]:-}"
}

# A softdep may name an alias: "crypto-crc32c" is the crypto API's name for crc32c, provided by
# crc32c_generic (or an accelerated variant). Map those; a softdep that still names nothing here is
# optional by definition and is left out.
resolve_soft() {
    local n=$1 c
    for c in "$n" "${n#crypto-}" "${n#crypto-}_generic"; do
        c=$(norm "$c")
        if [ -n "${MODPATH[$c]:-}" ] || [ -n "${BUILTIN[$c]:-}" ]; then echo "$c"; return; fi
    done
}

ORDER=()
visit() { # depth-first: a module goes in after everything it needs
    local m d
    m=$(norm "$1")
    [ -n "${SEEN[$m]:-}" ] && return 0
    [ -n "${BUILTIN[$m]:-}" ] && { SEEN[$m]=1; return 0; }
    [ -n "${MODPATH[$m]:-}" ] || die "module $m: not found under $MODDIR${EXTRA_MODS[*]:+ or ${EXTRA_MODS[*]}}"
    SEEN[$m]=visiting
    for d in $(mod_deps "$m"); do
        [ "${SEEN[$(norm "$d")]:-}" = visiting ] && die "module $m: dependency cycle through $d"
        visit "$d"
    done
    SEEN[$m]=1
    ORDER+=("$m")
}
for m in "${MODS[@]+"${MODS[@]}"}" "${EXTRA_LIST[@]+"${EXTRA_LIST[@]}"}"; do visit "$m"; done

: >"$STAGE/etc/modules"
for m in "${ORDER[@]+"${ORDER[@]}"}"; do
    src=${MODPATH[$m]} dest=/lib/modules/$m.ko
    case $src in
    *.ko.xz) xz -dc "$src" >"$STAGE$dest" ;;
    *.ko.zst) zstd -qdc "$src" >"$STAGE$dest" ;;
    *.ko.gz) gzip -dc "$src" >"$STAGE$dest" ;;
    *) cp -L "$src" "$STAGE$dest" ;;
    esac
    echo "$dest" >>"$STAGE/etc/modules"
    say "$dest"
done

# --- device nodes, permissions, times, archive -------------------------------------------------
if [ "$(id -u)" = 0 ]; then
    mknod -m 0600 "$STAGE/dev/console" c 5 1
    mknod -m 0666 "$STAGE/dev/null" c 1 3
fi
find "$STAGE" -type d -exec chmod 0755 {} +
find "$STAGE" -type f -exec sh -c 'for f; do if [ -x "$f" ]; then chmod 0755 "$f"; else chmod 0644 "$f"; fi; done' sh {} +
find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

case $COMP in
zstd) compress() { zstd -q -T1 "-${ZSTD_LEVEL:-19}" -c; } ;;
xz) compress() { xz -T1 --check=crc32 -c; } ;;   # the kernel's xz wants crc32
gzip) compress() { gzip -n -9 -c; } ;;
none) compress() { cat; } ;;
*) die "-z $COMP: want zstd, xz, gzip or none" ;;
esac
mkdir -p "$(dirname "$OUT")"
(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort |
    cpio --quiet -o -H newc --reproducible -R 0:0) | compress >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
say "$OUT: $(stat -c %s "$OUT") bytes, ${#ORDER[@]} modules"
