/* free_port: a loopback TCP port the kernel has just handed out as free, for a test's listener.
 * A fixed or pid-derived port can collide with another test's listener or with an outgoing
 * connection's ephemeral port (tests run side by side); binding port 0 asks the kernel instead.
 * The port is free when this returns; a test binds it right away. -1 if the kernel refuses. */
#ifndef STRATA_TEST_FREE_PORT_H
#define STRATA_TEST_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = -1;
    if (!bind(fd, (struct sockaddr *)&sa, sizeof sa) &&
        !getsockname(fd, (struct sockaddr *)&sa, &sl))
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

#endif
