#!/bin/bash
# make_deps: `make` on a machine without the build packages stops at once with one line naming
# the missing Debian packages and `make deps`, not with "rte_eal.h: No such file or directory".
# The machine here has them all, so their absence is simulated: a pkg-config that knows no
# libdpdk, a header directory that holds nothing (every header package is then named; the list
# grows with the project, so only its start is fixed here). Nothing is compiled (make -n).
set -u
cd "$(dirname "$0")/../.."
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

# expect NAME WANT MAKE-ARGS...: make fails and its message names WANT and `make deps`.
expect() {
    local name=$1 want=$2 out
    shift 2
    if out=$(make -n "$@" 2>&1); then
        nok "make $name" "make succeeded: ${out:0:200}"
    elif ! grep -q "missing packages: $want\. Install them .*with \`make deps\`" <<<"$out"; then
        nok "make $name" "message: $(tail -n 2 <<<"$out")"
    elif grep -q "No such file" <<<"$out"; then
        nok "make $name" "a compiler error came first: $out"
    else
        ok "make $name: '$(grep -o 'missing packages: [^.]*' <<<"$out")'"
    fi
}
expect "without DPDK" "libdpdk-dev" PKG_CONFIG=false all
expect "without pkg-config" "pkg-config libdpdk-dev" PKG_CONFIG=/nonexistent/pkg-config
expect "without the headers" "libibverbs-dev libcjson-dev libsodium-dev[a-z0-9 -]*" \
    DEPS_INCLUDE=/nonexistent SAN=1
# The goals that install the packages themselves, or need none, are not stopped.
if out=$(make -n PKG_CONFIG=false clean deps 2>&1) && ! grep -q "missing packages" <<<"$out"; then
    ok "make deps and clean run without the packages"
else
    nok "make deps and clean run without the packages" "${out:0:300}"
fi
# With everything present the check is silent.
if out=$(make -n all 2>&1) && ! grep -q "missing packages" <<<"$out"; then
    ok "make with the packages present says nothing"
else
    nok "make with the packages present says nothing" "$(grep 'missing' <<<"$out")"
fi
exit $fail
