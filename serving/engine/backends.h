/* backends: the engine's backends in the order engine_init tries them, and the choice.
 *
 * The list is cuda (cuda/cuda_backend.h), then cpu (engine.c). Every build has both: the CUDA
 * backend loads libcuda.so.1 at run time, and its probe says when the kernels are missing. A
 * backend serves when $STRATA_BACKEND does not name another, its probe says it can and its init
 * succeeds; the last one, cpu, has no probe and serves when nothing before it can (whatever
 * $STRATA_BACKEND says). One line says which serves and why the ones before it do not:
 *   engine: backend cuda (NVIDIA H100 80GB HBM3)
 *   engine: backend cpu: no CUDA device (libcuda.so.1 not found)
 *   engine: backend cpu: STRATA_BACKEND=cpu
 * and an init that fails is a warning before it ("engine: backend cuda: out of memory; the CPU
 * serves"). */
#ifndef STRATA_BACKENDS_H
#define STRATA_BACKENDS_H

#include "serving/engine/engine.h"

extern const struct engine_backend cpu_backend;
/* NULL-terminated, in the order they are tried; the last has no probe. */
extern const struct engine_backend *const backends_all[];

/* The first backend from list on that $STRATA_BACKEND allows and whose probe says yes (else the
 * last). line (ERRMSG_LEN bytes) gets the log line's text after "engine: ", which is logged;
 * passed (may be NULL, else "" or reasons already given) holds why earlier ones were passed over. */
const struct engine_backend *backends_pick(const struct engine_backend *const *list,
                                           const char *passed, char *line);
/* backends_pick, then its init (arena a); when that fails, the next one, with a warning.
 * Sets e->be; 0, or -1 with err when the last one's init failed. */
int backends_start(struct engine *e, struct arena *a, const struct engine_backend *const *list,
                   char *err);
/* Put "NAME: " in front of a backend's message unless it starts with it already (cuda's say
 * "cuda: ..."), so that every backend error names its backend once. Returns -1. */
int backends_name_error(const struct engine_backend *be, char *err);

#endif
