/* errmsg: errors are values.
 *
 * A function that can fail returns 0 on success and -1 on failure, and writes one line that names
 * the thing and the reason into a caller-provided buffer of ERRMSG_LEN bytes (Redis anet style):
 *   "model.gguf: tensor blk.3.attn_q.weight: shape 64x65 does not match dim 64".
 * errmsg_set() formats into that buffer; errmsg_prefix() prepends context ("model.gguf: ") to a
 * message a callee already wrote, so each layer adds what it knows. A NULL buffer is allowed.
 *
 * That is the form. The others allowed, each where its header says so once:
 *   - a constructor returns the object, or NULL with err written (coop_new, control_start);
 *   - an object that runs many calls keeps its last error and answers -1; X_error(obj) reads it
 *     (engine_error: the forward pass is called from everywhere with nowhere to put a buffer);
 *   - more than one outcome: -1 is still the error with err, the other values are named in the
 *     header (1 "refused", -2 "cancelled"; an HTTP status with the message in msg);
 *   - an encoder returns the bytes it wrote, 0 when they do not fit: its only failure;
 *   - a "why not" check answers NULL (yes) or the reason (a static or thread-local line);
 *   - where nobody is left to hand the error to (a thread's loop, a callback of the fabric or of
 *     libuv, a proposal whose answer changes nothing), it is logged once, in the same form, with
 *     the subsystem (log_warn("coop", "peer %d (%s): %s", ...)), and the function returns.
 * Nothing else: no errno left for the caller to read, no message printed and then returned too,
 * no exit() in a library function (the PID-1 policy of os/runtime/pid1.c, a forked child and a
 * test hook's deliberate death aside); a command (cmd/) prints "strata CMD: <err>" once. */
#ifndef STRATA_ERRMSG_H
#define STRATA_ERRMSG_H

#include <stddef.h>

#define ERRMSG_LEN 512

int errmsg_set(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int errmsg_prefix(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
