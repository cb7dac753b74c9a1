/* repack: ggml rows -> 16-row groups (see repack.h for the layout and why). */
#include "serving/engine/repack.h"

#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/quant.h"

#include <stdlib.h>
#include <string.h>

uint32_t repack_type_of(uint32_t ggml_type)
{
    return ggml_type == GGML_Q4_0 ? TENSOR_Q4_0_X16 : ggml_type == GGML_Q8_0 ? TENSOR_Q8_0_X16 : 0;
}

uint32_t repack_base_type(uint32_t type)
{
    return type == TENSOR_Q4_0_X16 ? GGML_Q4_0 : type == TENSOR_Q8_0_X16 ? GGML_Q8_0 : type;
}

const char *tensor_type_name(uint32_t type)
{
    return type == TENSOR_Q4_0_X16   ? "q4_0x16"
           : type == TENSOR_Q8_0_X16 ? "q8_0x16"
                                     : ggml_type_name(type);
}

int repack_eligible(const struct tensor *t)
{
    return repack_type_of(t->type) && t->rows > 0 && t->rows % REPACK_ROWS == 0 &&
           t->cols % 32 == 0;
}

/* 4 quant bytes at a time: byte group k of row r goes to repack_quant_at(r, 4k). */
static void pack_group_q4_0(const uint8_t *src, uint8_t *dst, int nb)
{
    const struct block_q4_0 *s = (const struct block_q4_0 *)src;
    struct block_q4_0x16 *d = (struct block_q4_0x16 *)dst;
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < REPACK_ROWS; r++) {
            const struct block_q4_0 *in = &s[(size_t)r * nb + b];
            d[b].d[r] = in->d;
            for (int k = 0; k < 4; k++)
                memcpy(d[b].qs + repack_quant_at(r, 4 * k), in->qs + 4 * k, 4);
        }
}

static void pack_group_q8_0(const uint8_t *src, uint8_t *dst, int nb)
{
    const struct block_q8_0 *s = (const struct block_q8_0 *)src;
    struct block_q8_0x16 *d = (struct block_q8_0x16 *)dst;
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < REPACK_ROWS; r++) {
            const struct block_q8_0 *in = &s[(size_t)r * nb + b];
            d[b].d[r] = in->d;
            for (int k = 0; k < 8; k++) {
                uint32_t v;
                memcpy(&v, in->qs + 4 * k, 4);
                v ^= 0x80808080u; /* +128 on each byte */
                memcpy(d[b].qs + repack_quant_at(r, 4 * k), &v, 4);
            }
        }
}

int repack_tensor(struct tensor *t, char *err)
{
    if (!repack_eligible(t)) return 0;
    int nb = t->cols / 32;
    size_t group = ggml_row_bytes(t->type, (uint64_t)t->cols) * REPACK_ROWS;
    uint8_t *tmp = malloc(group);
    if (!tmp)
        return errmsg_set(err, "repack: no memory for a %zu-byte group of %d x %d %s", group,
                          t->rows, t->cols, ggml_type_name(t->type));
    /* The engine owns the weight image: this is the one place that writes to it. */
    uint8_t *w = (uint8_t *)(uintptr_t)t->data;
    for (int g = 0; g < t->rows / REPACK_ROWS; g++) {
        uint8_t *p = w + (size_t)g * group;
        memcpy(tmp, p, group);
        if (t->type == GGML_Q4_0)
            pack_group_q4_0(tmp, p, nb);
        else
            pack_group_q8_0(tmp, p, nb);
    }
    free(tmp);
    t->type = repack_type_of(t->type);
    return 0;
}

void repack_dequantize_row(const struct tensor *t, int row, float *out)
{
    int nb = t->cols / 32, r = row % REPACK_ROWS;
    size_t group = ggml_row_bytes(repack_base_type(t->type), (uint64_t)t->cols) * REPACK_ROWS;
    const uint8_t *g = (const uint8_t *)t->data + (size_t)(row / REPACK_ROWS) * group;
    for (int b = 0; b < nb; b++, out += 32) {
        if (t->type == TENSOR_Q4_0_X16) {
            const struct block_q4_0x16 *blk = (const struct block_q4_0x16 *)g + b;
            float d = fp16_to_f32(blk->d[r]);
            for (int i = 0; i < 16; i++) {
                uint8_t q = blk->qs[repack_quant_at(r, i)];
                out[i] = d * (float)((q & 0xf) - 8);
                out[i + 16] = d * (float)((q >> 4) - 8);
            }
        } else {
            const struct block_q8_0x16 *blk = (const struct block_q8_0x16 *)g + b;
            float d = fp16_to_f32(blk->d[r]);
            for (int i = 0; i < 32; i++)
                out[i] = d * (float)((int)blk->qs[repack_quant_at(r, i)] - 128);
        }
    }
}
