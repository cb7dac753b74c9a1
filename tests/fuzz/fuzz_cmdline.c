/* fuzz_cmdline: any byte string as a kernel command line. The parser must never read or write out
 * of bounds, must leave every string field terminated, and on failure must say which strata key
 * was wrong. */
#include "os/common/boot_cmdline.h"
#include "os/common/errmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *line = malloc(size + 1);
    if (!line) return 0;
    memcpy(line, data, size);
    line[size] = 0;
    struct boot_config cfg;
    char err[ERRMSG_LEN];
    err[0] = 0;
    int rc = boot_cmdline_parse(line, &cfg, err);
    if (rc == -1 && strncmp(err, "strata.", 7)) abort();
    if (rc == 0) {
        if (cfg.port < 1 || cfg.port > 65535) abort();
        if (cfg.has_ip && (cfg.prefix < 0 || cfg.prefix > 32)) abort();
        if (cfg.n_dns < 0 || cfg.n_dns > BOOT_DNS_MAX) abort();
    }
    if (strlen(cfg.model) >= sizeof cfg.model || strlen(cfg.args) >= sizeof cfg.args ||
        strlen(cfg.peers) >= sizeof cfg.peers || strlen(cfg.api_key) >= sizeof cfg.api_key)
        abort();
    free(line);
    return 0;
}
