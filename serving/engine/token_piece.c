#include "serving/engine/token_piece.h"

static int is_special(const struct tokenizer *t, int id)
{
    if (id == t->bos_id || id == t->eos_id) return 1;
    for (int i = 0; i < t->n_special; i++)
        if (t->special_ids[i] == id) return 1;
    return 0;
}

const char *token_piece(const struct tokenizer *t, int id, char *scratch, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->vocab_size) return "";
    if (is_special(t, id)) {
        *len = (size_t)t->piece_len[id];
        return t->pieces[id];
    }
    /* prev -1: nothing before it, so no space is dropped */
    return tokenizer_decode(t, -1, id, scratch, len);
}
