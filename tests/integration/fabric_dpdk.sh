#!/bin/bash
# Fabric over DPDK (net_af_packet on veth pairs in network namespaces, one process per node):
# chains of 3 and 4 nodes end with the exact bytes (jumbo frames; then 1500-byte frames with loss,
# reordering and delay), a killed source is replaced by another holder, a wrong cluster key is
# refused, forged and corrupted datagrams are dropped, a corrupt span is re-fetched, a real GGUF
# model streams through a chain, and the kernel's own traffic (ARP, ICMP, HTTP) reaches it
# through the exception-path TAP while weights stream on the same port.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
if [ "$(id -u)" != 0 ]; then echo "skip - fabric_dpdk: needs root for network namespaces"; exit 0; fi
[ -x "$STRATA" ] || { echo "not ok - fabric_dpdk: $STRATA not built"; exit 1; }
ls /usr/lib/*/dpdk/pmds-*/librte_net_af_packet.so >/dev/null 2>&1 ||
    { echo "skip - fabric_dpdk: DPDK's net_af_packet driver is not installed"; exit 0; }
W=$(mktemp -d /tmp/fabric_dpdk.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
FAB_TRANSPORT=dpdk
. tests/lib/fabric_scenarios.sh
FAB_MTU=9000 chain dpdk_chain_3_nodes_jumbo 2 32M
FAB_MTU=1500 chain dpdk_chain_4_nodes_loss_reorder_delay 3 16M loss 3% delay 2ms 1ms reorder 10% 50%
FAB_MTU=1500
kill_source dpdk_kill_source_resume_from_other_holder
kill_relay dpdk_kill_chain_predecessor_resume_from_source
wrong_key dpdk_wrong_cluster_key_refused
forged_packets dpdk_forged_and_corrupted_packets_dropped
corrupt_span dpdk_corrupt_span_refetched
gguf_chain dpdk_gguf_model_chain
exception_path dpdk_exception_path_arp_icmp_http_via_tap
exit $fail
