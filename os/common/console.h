/* console: the one console writer of the init and the server.
 *
 * console_say(prefix, fmt, ...) writes PREFIX, the message and a newline in one write(2) to fd 2:
 * the console is shared with the kernel's messages, and one write keeps a line whole. A line is at
 * most ERRMSG_LEN + 64 bytes (longer is cut). os/init says "strata-init: STEP: ..." through it
 * (init_say), the server's DHCP renewal "strata: dhcp: ...". */
#ifndef STRATA_CONSOLE_H
#define STRATA_CONSOLE_H

#include <stdarg.h>

void console_say(const char *prefix, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void console_vsay(const char *prefix, const char *fmt, va_list ap);

#endif
