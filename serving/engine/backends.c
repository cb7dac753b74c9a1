/* backends: the list and the choice (see backends.h). The one file that names every backend. */
#include "serving/engine/backends.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct engine_backend *const backends_all[] = {&cuda_backend, &cpu_backend, NULL};

int backends_name_error(const struct engine_backend *be, char *err)
{
    if (!err) return -1;
    size_t n = strlen(be->name);
    if (strncmp(err, be->name, n) || strncmp(err + n, ": ", 2))
        return errmsg_prefix(err, "%s: ", be->name);
    return -1;
}

/* buf (ERRMSG_LEN bytes) += s, cut where it is full. */
static void append(char *buf, const char *s)
{
    size_t n = strnlen(buf, ERRMSG_LEN - 1), k = strnlen(s, ERRMSG_LEN - 1 - n);
    memcpy(buf + n, s, k);
    buf[n + k] = 0;
}

/* why += "; " reason (the first without the separator). */
static void add_reason(char *why, const char *reason)
{
    if (*why) append(why, "; ");
    append(why, reason);
}

static int in_list(const struct engine_backend *const *list, const char *name)
{
    for (; *list; list++)
        if (!strcmp((*list)->name, name)) return 1;
    return 0;
}

const struct engine_backend *backends_pick(const struct engine_backend *const *list,
                                           const char *passed, char *line)
{
    char why[ERRMSG_LEN] = "", reason[ERRMSG_LEN];
    if (passed) append(why, passed);
    const char *want = getenv("STRATA_BACKEND");
    if (want && !*want) want = NULL;
    if (want && !in_list(backends_all, want) && !in_list(list, want)) {
        log_warn("engine", "STRATA_BACKEND=%s names no backend; the first that can serves", want);
        want = NULL;
    }
    const struct engine_backend *be = *list;
    int forced = 0; /* the reason "STRATA_BACKEND=..." is given once */
    for (; list[1]; be = *++list) {
        if (want && strcmp(want, be->name)) {
            snprintf(reason, sizeof reason, "STRATA_BACKEND=%s", want);
            if (!forced++) add_reason(why, reason);
        } else if (be->probe && be->probe(reason)) {
            add_reason(why, reason);
        } else {
            break;
        }
    }
    char dev[128] = "";
    if (be->device_name) be->device_name(dev, sizeof dev);
    snprintf(line, ERRMSG_LEN, "backend %s", be->name);
    if (*dev) append(line, " ("), append(line, dev), append(line, ")");
    if (*why) append(line, ": "), append(line, why);
    log_info("engine", "%s", line);
    return be;
}

int backends_start(struct engine *e, struct arena *a, const struct engine_backend *const *list,
                   char *err)
{
    char passed[ERRMSG_LEN] = "", line[ERRMSG_LEN];
    for (;;) {
        const struct engine_backend *be = backends_pick(list, passed, line);
        while (*list != be) list++;
        if (!be->init || be->init(e, a, err) == 0) {
            e->be = be;
            return 0;
        }
        if (!list[1]) return -1; /* the last: its own message */
        backends_name_error(be, err);
        log_warn("engine", "backend %s; %s serves", err, list[2] ? list[1]->name : "the CPU");
        add_reason(passed, err);
        list++;
    }
}
