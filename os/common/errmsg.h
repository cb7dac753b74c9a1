/* errmsg: errors are values.
 *
 * A function that can fail returns 0 on success and -1 on failure, and writes one line that names
 * the thing and the reason into a caller-provided buffer of ERRMSG_LEN bytes (Redis anet style):
 *   "model.gguf: tensor blk.3.attn_q.weight: shape 64x65 does not match dim 64".
 * errmsg_set() formats into that buffer; errmsg_prefix() prepends context ("model.gguf: ") to a
 * message a callee already wrote, so each layer adds what it knows. A NULL buffer is allowed. */
#ifndef STRATA_ERRMSG_H
#define STRATA_ERRMSG_H

#include <stddef.h>

#define ERRMSG_LEN 512

int errmsg_set(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int errmsg_prefix(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
