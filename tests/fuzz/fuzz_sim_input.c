/* fuzz_sim_input: any bytes as a simulator config file (first byte 0 mod 3), an Azure trace CSV
 * (1 mod 3) or a requests file (2 mod 3). The parsers must never read or write out of bounds; on
 * failure they say what was wrong; on success every value is in its stated range. */
#include "cluster/sim/sim.h"
#include "os/common/errmsg.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char err[ERRMSG_LEN];
    err[0] = 0;
    if (data[0] % 3 == 0) {
        static struct sim_config c;
        sim_config_default(&c);
        int rc = sim_config_parse(&c, text, err);
        if (rc == -1 && !err[0]) abort();
        if (rc == 0) {
            if (c.n_types < 1 || c.n_types > SIM_MAX_TYPES || c.n_failures < 0 ||
                c.n_failures > 16 || !(c.tiers.nic_Bps > 0) || c.max_seqs < 1)
                abort();
            for (int t = 0; t < c.n_types; t++)
                if (c.type_gpus[t] < 1) abort();
            if (c.n_spans < 0 || c.n_spans > SIM_MAX_SPANS || c.model.layers < 1 ||
                c.n_scaleouts < 0 || c.n_scaleouts > SIM_MAX_SCALEOUTS || c.chunk_bytes < 0)
                abort();
            for (int k = 0; k < c.n_spans; k++)
                if (!(c.span_bytes[k] >= 1)) abort();
            for (int k = 0; k < c.n_scaleouts; k++) {
                const struct sim_scaleout_spec *so = &c.scaleouts[k];
                if (so->n < 1 || so->n > SIM_SCALEOUT_MAX_CHAIN || so->src < 0) abort();
                for (int j = 0; j < so->n; j++)
                    if (so->chain[j] < 0 || so->chain[j] == so->src) abort();
            }
        }
    } else if (data[0] % 3 == 2) {
        struct sim_request *r = NULL;
        int n = 0;
        int rc = sim_requests_parse(text, size - 1, &r, &n, err);
        if (rc == -1 && !err[0]) abort();
        if (rc == 0) {
            for (int i = 0; i < n; i++)
                if (!(r[i].t >= 0) || r[i].in < 1 || r[i].out < 1 || (i && r[i].t < r[i - 1].t))
                    abort();
            free(r);
        }
    } else {
        struct sim_request *r = NULL;
        int n = 0;
        int rc = sim_trace_parse(text, size - 1, 1.5, 0, 0, &r, &n, err);
        if (rc == -1 && !err[0]) abort();
        if (rc == 0) {
            for (int i = 0; i < n; i++)
                if (!(r[i].t >= 0) || r[i].in < 0 || r[i].out < 0 || (i && r[i].t < r[i - 1].t))
                    abort();
            free(r);
        }
    }
    free(text);
    return 0;
}
