/* libFuzzer target: gguf_parse / gguf_parse_header, then model_plan, model_fill/bind and
 * tokenizer_from_gguf on whatever parses. Any out-of-bounds read or crash is a bug. */
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "serving/engine/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void use_model(const struct gguf *g)
{
    char err[ERRMSG_LEN];
    struct model m;
    if (model_plan(&m, g, "fuzz.gguf", err) == 0) {
        /* Tensors lie inside the file, so the image is about the file's size plus padding. */
        if (m.image_size <= (64u << 20)) {
            uint8_t *image = malloc(m.image_size ? m.image_size : 1);
            if (image) {
                for (int s = 0; s < m.n_spans; s++) model_fill(&m, image, s, err);
                model_bind(&m, image);
                free(image);
            }
        }
        model_free(&m);
    }
    struct tokenizer t;
    if (tokenizer_from_gguf(&t, g, err) == 0) {
        int ids[64], n;
        if (tokenizer_encode(&t, "Hello \xf0\x9f\x98\x80 world", 15, 1, ids, 64, &n, err) == 0)
            for (int i = 0; i < n; i++) {
                char s[4];
                size_t l;
                tokenizer_decode(&t, i ? ids[i - 1] : -1, ids[i], s, &l);
            }
        tokenizer_free(&t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERRMSG_LEN];
    struct gguf g;
    /* A private copy of exactly `size` bytes, so ASan flags any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    if (gguf_parse(&g, buf, size, err) == 0) {
        use_model(&g);
        gguf_free(&g);
    }
    if (gguf_parse_header(&g, buf, size, err) == 0) {
        struct model m;
        if (model_plan(&m, &g, "fuzz.gguf", err) == 0) model_free(&m);
        gguf_free(&g);
    }
    free(buf);
    return 0;
}
