#!/bin/bash
# dhcp_renew: the appliance's DHCP client and the server's renewal schedule against an
# independent server (tests/tools/dhcp_server.py) across a veth pair between two network
# namespaces, with 8-second leases so that T1 (4 s) and T2 (7 s) come within the test:
#   normal             DISCOVER, OFFER, REQUEST, ACK; then renewals unicast to the server at T1
#   nak-first-renewal  a NAK makes the client drop the address and start over with a DISCOVER
#   ignore-unicast     renewals go unanswered, so at T2 the client rebinds by broadcast
# The client side is build/tools/dhcp_lease (os/common/dhcp_client.c, os/runtime/dhcp_renew.c, as the appliance
# runs them; DHCP_LEASE_TOOL=build/san/tools/dhcp_lease runs the sanitized build). Needs root
# (namespaces, packet sockets).
set -u
cd "$(dirname "$0")/../.."
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
[ "$(id -u)" = 0 ] || { echo "skip - dhcp renew: needs root"; exit 0; }
TOOL=${DHCP_LEASE_TOOL:-build/tools/dhcp_lease}
make -s "$TOOL" || { nok "dhcp renew build" "make $TOOL"; exit 1; }
ID=$$
SRV=sdhcp${ID}s CLI=sdhcp${ID}c DIR=build/dhcp_renew
mkdir -p "$DIR"
SPID=""
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    SPID=""
    ip netns del "$SRV" 2>/dev/null
    ip netns del "$CLI" 2>/dev/null
}
trap cleanup EXIT

# scenario MODE RENEWALS: fresh namespaces, the server in MODE, the client renewing RENEWALS
# times; leaves $DIR/MODE.{out,err,srv}.
scenario() {
    local mode=$1 n=$2
    cleanup
    ip netns add "$SRV" && ip netns add "$CLI" || return 1
    ip -n "$SRV" link add veth-s type veth peer name veth-c netns "$CLI" || return 1
    ip -n "$SRV" addr add 10.99.0.1/24 dev veth-s
    ip -n "$SRV" link set veth-s up
    ip -n "$CLI" link set veth-c up
    : >"$DIR/$mode.srv"
    ip netns exec "$SRV" python3 tests/tools/dhcp_server.py veth-s 10.99.0.1 10.99.0.50 8 "$mode" \
        "$DIR/$mode.srv" &
    SPID=$!
    for _ in $(seq 50); do grep -q listening "$DIR/$mode.srv" && break; sleep 0.1; done
    timeout 90 ip netns exec "$CLI" "$TOOL" veth-c "$DIR/$mode.lease" "$n" \
        >"$DIR/$mode.out" 2>"$DIR/$mode.err"
}

LEASE="veth-c 10.99.0.50/24 via 10.99.0.1, DNS 10.99.0.1, lease 8 s from 10.99.0.1"

scenario normal 2
if grep -qxF "acquired: $LEASE" "$DIR/normal.out" &&
    [ "$(grep -c "^renewal [12]: $LEASE" "$DIR/normal.out")" = 2 ] &&
    grep -qx "DISCOVER ciaddr=0.0.0.0 to=255.255.255.255 -> OFFER" "$DIR/normal.srv" &&
    grep -qx "REQUEST ciaddr=0.0.0.0 to=255.255.255.255 -> ACK" "$DIR/normal.srv" &&
    [ "$(grep -cx "REQUEST ciaddr=10.99.0.50 to=10.99.0.1 -> ACK" "$DIR/normal.srv")" = 2 ]; then
    ok "dhcp lease acquired, then renewed twice at T1 by unicast to the server"
else
    nok "dhcp lease acquired, then renewed twice at T1 by unicast to the server" \
        "client: $(tr '\n' '|' <"$DIR/normal.out") $(tail -n 3 "$DIR/normal.err" | tr '\n' '|') server: $(tr '\n' '|' <"$DIR/normal.srv")"
fi
if ip -n "$CLI" -4 addr show veth-c 2>/dev/null | grep -q "inet 10.99.0.50/24" &&
    ip -n "$CLI" route show default 2>/dev/null | grep -q "via 10.99.0.1"; then
    ok "dhcp lease applied: address and default route on the interface"
else
    nok "dhcp lease applied" "$(ip -n "$CLI" -4 addr show veth-c; ip -n "$CLI" route)"
fi
if grep -q "^ip=10.99.0.50/24$" "$DIR/normal.lease" && grep -q "^lease=8$" "$DIR/normal.lease"; then
    ok "dhcp lease file rewritten after each renewal"
else
    nok "dhcp lease file rewritten after each renewal" "$(tr '\n' ' ' <"$DIR/normal.lease")"
fi

scenario nak-first-renewal 1
if grep -q "the server refused the renewal (NAK); removing 10.99.0.50 and asking for a new lease" "$DIR/nak-first-renewal.err" &&
    grep -qx "REQUEST ciaddr=10.99.0.50 to=10.99.0.1 -> NAK" "$DIR/nak-first-renewal.srv" &&
    [ "$(grep -c "^DISCOVER" "$DIR/nak-first-renewal.srv")" = 2 ] &&
    grep -qxF "renewal 1: $LEASE" "$DIR/nak-first-renewal.out"; then
    ok "dhcp NAK on renewal: address dropped, a new lease from DISCOVER"
else
    nok "dhcp NAK on renewal" "client: $(tr '\n' '|' <"$DIR/nak-first-renewal.err") server: $(tr '\n' '|' <"$DIR/nak-first-renewal.srv")"
fi

scenario ignore-unicast 1
if grep -q "REQUEST ciaddr=10.99.0.50 to=10.99.0.1 -> (ignored)" "$DIR/ignore-unicast.srv" &&
    grep -qx "REQUEST ciaddr=10.99.0.50 to=255.255.255.255 -> ACK" "$DIR/ignore-unicast.srv" &&
    grep -qxF "renewal 1: $LEASE" "$DIR/ignore-unicast.out"; then
    ok "dhcp unanswered renewals: the client rebinds by broadcast at T2"
else
    nok "dhcp unanswered renewals: rebinding at T2" "client: $(tr '\n' '|' <"$DIR/ignore-unicast.err") server: $(tr '\n' '|' <"$DIR/ignore-unicast.srv")"
fi
exit $fail
