/* dhcp_client: DHCPv4 exchanges with a server over a packet socket (AF_PACKET, SOCK_DGRAM): the
 * client has no address to bind a UDP socket to while it asks for one, so it builds the IPv4/UDP
 * packets itself (os/common/dhcp_msg.h) and the kernel adds the Ethernet header.
 *
 * dhcp_acquire: DISCOVER, the first OFFER, REQUEST, ACK (a NAK starts over), retransmitting after
 * 1, 2, 4, 8, 8... s, until timeout_s has passed. The interface must be up; nothing is
 * configured on it (the caller applies the lease with os/common/net_config.h).
 * dhcp_renew: one renewal (RFC 2131 4.4.5): REQUEST with ciaddr = the leased address, unicast to
 * the server (to its IP and, at layer 2, to the MAC its ACK came from) or broadcast when
 * rebinding, retransmitted after 1, 2, 4 s within timeout_s. On ACK the lease is updated (address,
 * mask, router, DNS, times, start); the caller compares and re-applies.
 * Both return 0 on ACK, 1 on NAK (dhcp_renew; dhcp_acquire retries those), -1 with err when no
 * answer came in time or a socket call failed ("dhcp: eth0: no OFFER in 30 s (6 DISCOVERs)").
 * Replies must match the transaction id and our MAC; others are ignored. */
#ifndef STRATA_DHCP_CLIENT_H
#define STRATA_DHCP_CLIENT_H

#include "os/common/dhcp_lease.h"

int dhcp_acquire(const char *iface, double timeout_s, struct dhcp_lease *l, char *err);
int dhcp_renew(struct dhcp_lease *l, int rebinding, double timeout_s, char *err);

#endif
