#!/bin/bash
# arm64-sysroot.sh: an arm64 sysroot unpacked from Debian's arm64 packages, for cross-building the
# appliance (make image-arm64) without touching the host's apt configuration: apt runs with a
# private configuration under build/arm64-apt (its own sources, package lists, cache and an empty
# dpkg status), so no `dpkg --add-architecture`, nothing installed, the host's lists untouched.
#
#   image/arm64-sysroot.sh [SYSROOT]        (default build/arm64-sysroot)
#       downloads the arm64 .debs of PKGS below and everything they depend on (the closure as
#       apt computes it: Depends and Pre-Depends, recursively, no Recommends) into
#       build/arm64-apt/debs (cached) and unpacks them with `dpkg -x` into SYSROOT. A stamp
#       (SYSROOT/.stamp: the package list and versions) makes a second run do nothing.
#   image/arm64-sysroot.sh --apt COMMAND...
#       runs apt-get/apt-cache COMMAND under the same private configuration (the package lists
#       are fetched first if missing): e.g. `--apt apt-get download linux-image-6.1.0-NN-arm64`.
# Environment: REFRESH=1 fetches the package lists again (apt-get update, private lists only).
# Sources: the host's Debian suites (/etc/apt/sources.list.d/debian.sources or sources.list:
# bookworm, bookworm-updates, bookworm-security), same mirrors, read as arm64.
# Progress goes to stderr, one line a step.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
A=$ROOT/build/arm64-apt
say() { echo "arm64-sysroot: $*" >&2; }
die() { echo "arm64-sysroot: error: $*" >&2; exit 1; }

# What the server links (the -dev packages pull their runtime libraries), what the static init is
# built from (musl-dev), libc's development files for --sysroot, the verbs providers the image
# carries (dlopen()ed, so no -dev package names them), systemd-boot's arm64 EFI stub and loader
# (the UKI and the disk's BOOTAA64.EFI).
PKGS="libc6-dev linux-libc-dev libdpdk-dev libibverbs-dev ibverbs-providers libcjson-dev
      libsodium-dev libraft-dev libuv1-dev musl-dev systemd-boot-efi"
# Packages in the closure that only matter on an installed system (maintainer scripts, docs,
# interpreters); their files would only bloat the sysroot.
# The compiler and binutils (libc6-dev's and dpkg-dev's dependencies) are the host's cross ones.
SKIP_RE='^(perl-base|perl|perl-modules-.*|libperl.*|lib.*-perl|python3.*|libpython3.*|debconf|cdebconf|dpkg|tar|install-info|init-system-helpers|lsb-base|sysvinit-utils|adduser|passwd|udev|systemd|sed|usrmerge|usr-is-merged|sgml-base|xml-core|readline-common|libreadline8|libnewt0.52|libslang2|libtextwrap1|libdebian-installer4|libsemanage.*|libpam.*|libaudit.*|libdb5.3|libgdbm.*|pkg-config|pkgconf|pkgconf-bin|libpkgconf3|gcc|gcc-12|cpp|cpp-12|binutils|binutils-.*|libbinutils|libctf.*|libgprofng0|libisl23|libmpc3|libmpfr6|libgmp10|libcc1-0|libgcc-12-dev|libasan8|libhwasan0|liblsan0|libtsan2|libubsan1|libitm1|rpcsvc-proto)$'

APT_OPTS=(
    -o APT::Architecture=arm64 -o APT::Architectures=arm64
    -o Dir::Etc::sourcelist="$A/sources.list" -o Dir::Etc::sourceparts="$A/sources.list.d"
    -o Dir::Etc::preferences="$A/preferences" -o Dir::Etc::preferencesparts="$A/preferences.d"
    -o Dir::State="$A/state" -o Dir::State::Lists="$A/state/lists"
    -o Dir::State::status="$A/state/status" -o Dir::Cache="$A/cache"
    -o Dir::Cache::archives="$A/cache/archives" -o Debug::NoLocking=1
    -o APT::Get::AllowUnauthenticated=false
)
# As root, apt hands downloads to its _apt user, who cannot write under build/: download as root.
[ "$(id -u)" = 0 ] && APT_OPTS+=(-o APT::Sandbox::User=root)

setup() {
    mkdir -p "$A/sources.list.d" "$A/preferences.d" "$A/state/lists/partial" \
        "$A/cache/archives/partial" "$A/debs"
    : >"$A/preferences"
    [ -f "$A/state/status" ] || : >"$A/state/status"
    # The host's Debian sources, as they are (their mirror, snapshot or proxy); apt reads them for
    # arm64 because of APT::Architectures. Other repositories (vendors' amd64 ones) are left out.
    if [ ! -f "$A/sources.list.d/debian.sources" ] && [ ! -f "$A/sources.list" ]; then
        if [ -f /etc/apt/sources.list.d/debian.sources ]; then
            grep -v '^Architectures:' /etc/apt/sources.list.d/debian.sources >"$A/sources.list.d/debian.sources"
            : >"$A/sources.list"
        elif [ -f /etc/apt/sources.list ] && grep -q '^deb .*debian' /etc/apt/sources.list; then
            grep '^deb .*debian' /etc/apt/sources.list | sed 's/\[arch=[^] ]*\] *//' >"$A/sources.list"
        else
            die "no Debian sources on the host (/etc/apt/sources.list.d/debian.sources, /etc/apt/sources.list)"
        fi
    fi
    [ -f "$A/sources.list" ] || : >"$A/sources.list"
    if [ "${REFRESH:-0}" = 1 ] || ! ls "$A/state/lists/"*_Packages* >/dev/null 2>&1; then
        say "fetching the arm64 package lists (private: $A/state/lists)"
        nice apt-get "${APT_OPTS[@]}" -q update >&2 || die "apt-get update (private arm64 lists) failed"
    fi
}

if [ "${1:-}" = --apt ]; then
    shift
    [ $# -ge 1 ] || die "--apt wants a command (apt-get ... or apt-cache ...)"
    setup
    cmd=$1
    shift
    exec "$cmd" "${APT_OPTS[@]}" "$@"
fi

cd "$ROOT"
SYSROOT=${1:-build/arm64-sysroot}
T0=$(date +%s)
setup

# The closure, by apt: every package named under the roots by Depends/Pre-Depends, recursively.
# Virtual names (<...>) are dropped: apt lists the packages that provide them too.
say "resolving the closure of: $(echo $PKGS)"
closure=$(apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances $PKGS 2>/dev/null | grep -v '^ ' | grep -v '^<' |
    sed 's/:arm64$//' | LC_ALL=C sort -u | grep -Ev "$SKIP_RE")
[ -n "$closure" ] || die "apt-cache depends gave nothing (package lists?)"
# name=version for each, the candidate apt would download.
want=$(apt-cache "${APT_OPTS[@]}" policy $closure 2>/dev/null | awk '
    /^[^ ]/ { sub(/:.*$/, "", $1); name = $1 }
    /^  Candidate:/ { if ($2 != "(none)") print name "=" $2 }' | LC_ALL=C sort -u)
n=$(echo "$want" | wc -l)
if [ -f "$SYSROOT/.stamp" ] && [ "$(cat "$SYSROOT/.stamp")" = "$want" ]; then
    say "$SYSROOT is up to date ($n packages)"
    exit 0
fi

# Download what the cache lacks (file names: NAME_VERSION_ARCH.deb, the epoch's ':' as %3a).
missing=()
while IFS='=' read -r p v; do
    f=$(ls "$A/debs/${p}_${v//:/%3a}_"*.deb 2>/dev/null | head -n 1 || true)
    [ -n "$f" ] || missing+=("$p=$v")
done <<<"$want"
if [ ${#missing[@]} -gt 0 ]; then
    say "downloading ${#missing[@]} of $n packages into $A/debs"
    (cd "$A/debs" && nice apt-get "${APT_OPTS[@]}" -q download "${missing[@]}" >&2) ||
        die "apt-get download failed"
else
    say "all $n packages cached in $A/debs"
fi

say "unpacking $n packages into $SYSROOT"
rm -rf "$SYSROOT.tmp"
mkdir -p "$SYSROOT.tmp"
while IFS='=' read -r p v; do
    f=$(ls "$A/debs/${p}_${v//:/%3a}_"*.deb | head -n 1)
    dpkg-deb -x "$f" "$SYSROOT.tmp" || die "dpkg-deb -x $f failed"
done <<<"$want"
# Absolute symbolic links (libfoo.so -> /lib/aarch64-linux-gnu/libfoo.so.1) would point into the
# host: make them relative to the sysroot.
find "$SYSROOT.tmp" -type l -lname '/*' | while IFS= read -r l; do
    t=$(readlink "$l")
    rel=$(realpath -m --relative-to="$(dirname "$l")" "$SYSROOT.tmp$t")
    ln -sfn "$rel" "$l"
done
echo "$want" >"$SYSROOT.tmp/.stamp"
rm -rf "$SYSROOT"
mv "$SYSROOT.tmp" "$SYSROOT"
say "done: $n packages, $(du -sm "$SYSROOT" | cut -f1) MiB in $SYSROOT ($(($(date +%s) - T0)) s)"
