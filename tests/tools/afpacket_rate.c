/* afpacket_rate: the raw AF_PACKET frame rate of an interface, the ceiling any af_packet-based
 * transport can reach on it (benchmarks only).
 *
 *   afpacket_rate tx IFACE SECONDS FRAME_BYTES   send broadcast frames of ethertype 0x88b5
 *   afpacket_rate rx IFACE SECONDS               count them; prints "rx: N frames, B bytes,
 *                                                X Gbit/s" over the time frames were arriving */
#include "os/runtime/clock.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ETHERTYPE_BENCH 0x88b5 /* IEEE local experimental */

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: afpacket_rate tx|rx IFACE SECONDS [FRAME_BYTES]\n");
        return 2;
    }
    int tx = !strcmp(argv[1], "tx");
    double secs = atof(argv[3]);
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETHERTYPE_BENCH));
    if (fd < 0) {
        perror("afpacket_rate: socket");
        return 1;
    }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET,
                              .sll_protocol = htons(ETHERTYPE_BENCH),
                              .sll_ifindex = (int)if_nametoindex(argv[2])};
    if (!sll.sll_ifindex || bind(fd, (struct sockaddr *)&sll, sizeof sll)) {
        perror("afpacket_rate: bind");
        return 1;
    }
    static unsigned char buf[65536];
    double t0 = clock_now(), first = 0, last = 0;
    unsigned long long n = 0, bytes = 0;
    if (tx) {
        int size = argc > 4 ? atoi(argv[4]) : 1514;
        if (size < 60 || size > (int)sizeof buf) size = 1514;
        memset(buf, 0xff, 6);
        memset(buf + 6, 0x02, 6);
        buf[12] = ETHERTYPE_BENCH >> 8;
        buf[13] = ETHERTYPE_BENCH & 0xff;
        while (clock_now() - t0 < secs) {
            if (send(fd, buf, (size_t)size, 0) == size) n++, bytes += (unsigned long long)size;
        }
        printf("tx: %llu frames, %llu bytes\n", n, bytes);
        return 0;
    }
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (clock_now() - t0 < secs) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) continue;
        last = clock_now();
        if (!n) first = last;
        n++;
        bytes += (unsigned long long)r;
    }
    double dt = last - first;
    printf("rx: %llu frames, %llu bytes, %.2f Gbit/s\n", n, bytes,
           dt > 0 ? bytes * 8 / dt / 1e9 : 0.0);
    return 0;
}
