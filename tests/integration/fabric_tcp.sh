#!/bin/bash
# Fabric over kernel TCP, one process per network namespace (veth pairs to a bridge): a chain
# source -> n1 -> n2 ends with the exact bytes everywhere, also under netem loss, delay and
# reordering; a joiner whose source is killed mid-stream completes from another holder; a wrong
# cluster key is refused; a span corrupted at the source is detected and re-fetched.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
if [ "$(id -u)" != 0 ]; then echo "skip - fabric_tcp: needs root for network namespaces"; exit 0; fi
[ -x "$STRATA" ] || { echo "not ok - fabric_tcp: $STRATA not built"; exit 1; }
W=$(mktemp -d /tmp/fabric_tcp.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
FAB_TRANSPORT=tcp
. tests/lib/fabric_scenarios.sh
run_common_scenarios tcp
exit $fail
