/* libFuzzer target: what a joiner does with a holder's bytes before any weight lands: a manifest
 * message (wire_manifest_decode), the GGUF header (gguf_parse_header, model_plan,
 * tokenizer_from_gguf: loader_open_header without the arena) and the check of one against the
 * other (stream_loader_check_manifest). Input: u16 n, then n bytes of manifest message, then the
 * header. Any out-of-bounds read or crash is a bug. */
#include "cluster/manifest_check.h"
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "serving/engine/tokenizer.h"
#include "transport/wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct wire_manifest man;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERRMSG_LEN];
    if (size < 2) return 0;
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2, size -= 2;
    if (n > size) n = size;
    /* Private copies of exactly the right sizes, so ASan flags any read past the end. */
    uint8_t *msg = malloc(n ? n : 1), *hdr = malloc(size - n ? size - n : 1);
    if (!msg || !hdr) goto out;
    memcpy(msg, data, n);
    memcpy(hdr, data + n, size - n);
    int have_man = wire_manifest_decode(&man, msg, n, err) == 0;
    struct gguf g;
    if (gguf_parse_header(&g, hdr, size - n, err) == 0) {
        struct model m;
        if (model_plan(&m, &g, "fuzz", err) == 0) {
            if (have_man) stream_loader_check_manifest(&m, &man, err);
            model_free(&m);
        }
        struct tokenizer t;
        if (tokenizer_from_gguf(&t, &g, err) == 0) tokenizer_free(&t);
        gguf_free(&g);
    }
out:
    free(msg);
    free(hdr);
    return 0;
}
