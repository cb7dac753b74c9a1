/* step_cache: a fitted step model kept on local storage, for one model on one hardware, so that a
 * restarted node starts from what it measured last time instead of a guess.
 *
 * The file (text, one field a line) names what it was measured on: the model by the BLAKE2b-256
 * of its GGUF header (metadata and tensor shapes and types: all that a step's cost depends on,
 * the same identity the fabric gives a model; the weights' values are never read), the hardware
 * (backend, device, ISA, threads, KV type). A file whose version, fields or checksum are wrong is
 * corrupt; one made for another model or hardware is foreign; either is not used (the caller says
 * so in one line). Files are written whole (a temporary file, fsync, rename): a crash leaves the
 * old one or the new one. */
#ifndef STRATA_STEP_CACHE_H
#define STRATA_STEP_CACHE_H

#include "os/common/errmsg.h"
#include "serving/sched/step_model.h"

#include <stddef.h>
#include <stdint.h>

#define STEP_CACHE_VERSION 1
#define STEP_ID_LEN        192

struct step_identity {
    char model[STEP_ID_LEN];    /* "blake2b:<64 hex> 123456 bytes" */
    char hardware[STEP_ID_LEN]; /* "cpu AMD EPYC 7B13 (avx2), 2 threads, kv f16" */
};

struct step_cached {
    struct step_model m; /* corr 1 */
    double err;          /* its error estimate when saved */
    long steps;          /* steps it was fitted from */
};

/* The file's bytes; 0 when cap is too small. */
size_t step_cache_encode(char *out, size_t cap, const struct step_identity *id,
                         const struct step_cached *c);
/* 0 and *c; or -1 with err saying why the bytes are not a usable model for id ("corrupt: line 4:
 * ...", "foreign: made for hardware ..."). Never reads past len; any bytes are safe to pass. */
int step_cache_parse(const char *buf, size_t len, const struct step_identity *id,
                     struct step_cached *c, char *err);
/* The identity as 64 bits (BLAKE2b-64 of model and hardware, never 0): what a cluster member's
 * load report carries, so a member starting the same model on the same hardware can take its
 * step model (step_prior.h). */
uint64_t step_identity_hash(const struct step_identity *id);
/* DIR/step-model-<16 hex of the identity>.txt: each model and hardware has its own file. */
void step_cache_path(char *out, size_t cap, const char *dir, const struct step_identity *id);
/* 1 and *c: the cache for id; 0: none there; -1: one there but unusable (err names the file). */
int step_cache_load(const char *dir, const struct step_identity *id, struct step_cached *c,
                    char *err);
int step_cache_save(const char *dir, const struct step_identity *id, const struct step_cached *c,
                    char *err);

#endif
