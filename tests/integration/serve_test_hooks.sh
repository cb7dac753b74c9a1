#!/bin/bash
# serve_test_hooks: the test hooks (cmd/test_hooks.h) are in the tests' binaries only. The shipped
# server, build/strata-appliance, refuses each hook option with the reason before anything starts
# and carries none of the hooks' code; build/strata and build/strata-appliance-test (the hooked
# boot tests' image) parse each one (a good value passes to the next check, -m missing; a bad one
# gets the option's own error). No model, no network: about a second.
set -u
cd "$(dirname "$0")/../.."
fail=0
ok() { echo "ok - serve_test_hooks: $1"; }
nok() { echo "not ok - serve_test_hooks: $1"; fail=1; }
for b in build/strata build/strata-appliance build/strata-appliance-test; do
    [ -x "$b" ] || { nok "$b missing (make)"; exit 1; }
done
REFUSED='a test hook, and this binary is built without them (build/strata and build/strata-appliance-test have them)'
NEEDS_M='strata serve: -m MODEL.gguf is required (or --peers to pull it from, or --cluster to wait for the planner)'
# option, a good value ("" for a flag), a bad value and its error ("" when any value is good)
HOOKS=(
    "--test-crash|segv|boom|strata serve: --test-crash boom: want segv or panic"
    "--test-hang|3|-1|strata serve: --test-hang: '-1' is not a number in [0, 3600]"
    "--test-step-delay-us|300|x|strata serve: --test-step-delay-us: 'x' is not a number in [0, 1000000]"
    "--test-kv-fault|die|odd|strata serve: --test-kv-fault odd: want seq, layer, short, die or refuse"
    "--test-clock-file|/tmp/none||"
    "--test-refuse|replicate||"
    "--cluster-standby|||"
    "--test-scale-in|500|0|strata serve: --test-scale-in: '0' is not a number in [1, 3600000]"
)
for h in "${HOOKS[@]}"; do
    IFS='|' read -r opt good bad badmsg <<<"$h"
    args=("$opt")
    [ -n "$good" ] && args+=("$good")
    out=$(build/strata-appliance serve "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    first=$(head -n 1 <<<"$out")
    if [ "$rc" = 2 ] && [ "$first" = "strata serve: $opt: $REFUSED" ]; then
        ok "build/strata-appliance refuses $opt (exit 2, the reason named)"
    else
        nok "build/strata-appliance serve ${args[*]}: exit $rc, '$first'"
    fi
    for b in build/strata build/strata-appliance-test; do
        first=$($b serve "${args[@]}" 2>&1 >/dev/null | head -n 1)
        [ "$first" = "$NEEDS_M" ] || nok "$b serve ${args[*]}: '$first', want the option accepted ('$NEEDS_M')"
        if [ -n "$bad" ]; then
            first=$($b serve "$opt" "$bad" 2>&1 >/dev/null | head -n 1)
            [ "$first" = "$badmsg" ] || nok "$b serve $opt $bad: '$first', want '$badmsg'"
        fi
    done
done
[ "$fail" = 0 ] && ok "build/strata and build/strata-appliance-test take all ${#HOOKS[@]} hook options"
# The hooks' code itself is not linked into the appliance.
for s in "crashing on purpose" "the serve loop stops here" "the wall clock jumps by"; do
    if grep -qa -- "$s" build/strata-appliance; then
        nok "build/strata-appliance contains '$s'"
    elif ! grep -qa -- "$s" build/strata-appliance-test; then
        nok "build/strata-appliance-test lacks '$s'"
    else
        ok "'$s' is in build/strata-appliance-test only"
    fi
done
if build/strata-appliance serve 2>&1 | grep -q -- '--test-\|--cluster-standby'; then
    nok "build/strata-appliance's usage lists a test hook"
else
    ok "build/strata-appliance's usage lists no test hook"
fi
exit $fail
