#include "serving/sched/step_prior.h"

#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "serving/engine/cuda/cuda_backend.h"
#include "serving/engine/kv_cache.h"
#include "serving/engine/matmul.h"

#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#define PROBE_BYTES  (64u << 20) /* the bandwidth probe reads this much of the weights at most */
#define GUESS_CPU_BW 5e9         /* bytes/s when nothing was measured: a slow server's DRAM */
#define GUESS_GPU_BW 1e12        /* a data-centre GPU's HBM, low: H100 has 3.3 TB/s */
#define DEFAULT_ERR  1.0         /* the default may be off by 2x either way before a step ran */

/* ---------------------------------------------------------------- where */

static int is_mount_point(const char *dir)
{
    char parent[4200];
    struct stat a, b;
    snprintf(parent, sizeof parent, "%s/..", dir);
    return !stat(dir, &a) && !stat(parent, &b) && a.st_dev != b.st_dev;
}

int step_state_dir(const char *opt, const char *model_path, int pid1, char *dir, size_t cap,
                   int *remount)
{
    *remount = 0;
    dir[0] = 0;
    if (opt && !strcmp(opt, "off")) return 1;
    if (opt) {
        snprintf(dir, cap, "%s", opt);
        return 0;
    }
    if (pid1) {
        /* the appliance: the model's partition, if it is on one (the initrd's root is gone at
         * the next boot) */
        const char *slash = model_path ? strrchr(model_path, '/') : NULL;
        if (!slash || slash == model_path) return 1;
        snprintf(dir, cap, "%.*s", (int)(slash - model_path), model_path);
        if (!is_mount_point(dir)) return dir[0] = 0, 1;
        *remount = 1;
        return 0;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(dir, cap, "%s/strata", xdg);
    else if (home && home[0] == '/')
        snprintf(dir, cap, "%s/.cache/strata", home);
    else
        return 1;
    return 0;
}

/* ---------------------------------------------------------------- what */

/* A printable copy: the identity is one line of the cache file. */
static void printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

static void cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *v = strchr(line, ':');
        if (!v) break;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        snprintf(out, cap, "%s", v);
        break;
    }
    fclose(f);
}

void step_identity_of(const struct loaded_model *lm, struct step_identity *id)
{
    /* the header (metadata, tensor names, shapes, types): what a step's cost depends on */
    size_t n = lm->gguf.data_offset;
    if (n > lm->map_size) n = lm->map_size;
    unsigned char h[32];
    crypto_generichash(h, sizeof h, lm->map, n, NULL, 0);
    char x[65];
    for (int i = 0; i < 32; i++) sprintf(x + 2 * i, "%02x", h[i]);
    snprintf(id->model, sizeof id->model, "blake2b:%s", x);
    const struct engine *e = &lm->engine;
    char dev[128];
    if (e->be && !strcmp(e->be->name, "cuda"))
        cuda_device_name(dev, sizeof dev);
    else
        cpu_name(dev, sizeof dev);
    snprintf(id->hardware, sizeof id->hardware, "%s %s (%s), %d threads, kv %s%s",
             e->be ? e->be->name : "cpu", dev, matmul_isa_of(&e->mm), e->lim.threads,
             kv_type_name(e->kv.type), e->lim.keep_layout ? ", gguf layout" : "");
    printable(id->hardware);
}

/* ---------------------------------------------------------------- the default */

/* Bytes/s of one thread reading p (the weights themselves: the pages are there, and for a small
 * model the caches that hold it are what its steps read from too). */
static double read_bandwidth(const uint8_t *p, size_t n)
{
    if (n > PROBE_BYTES) n = PROBE_BYTES;
    if (n < 4096) return 0;
    double best = 0;
    for (int pass = 0; pass < 2; pass++) {
        volatile uint64_t sink = 0;
        uint64_t a = 0, b = 0;
        double t0 = clock_now();
        const uint64_t *q = (const uint64_t *)p;
        for (size_t i = 0; i + 2 <= n / 8; i += 8) a ^= q[i], b ^= q[i + 1]; /* a line per load */
        double t = clock_now() - t0;
        sink = a ^ b;
        (void)sink;
        if (t > 0 && n / t > best) best = (double)n / t;
    }
    return best;
}

void step_prior_default(struct step_model *m, double bytes, double bw)
{
    double stream = bytes / (bw > 0 ? bw : GUESS_CPU_BW);
    *m = (struct step_model){.a = stream / 2, .b = 0, .c = stream / 2, .corr = 1};
}

void step_prior_choose(const struct loaded_model *lm, const struct step_identity *id,
                       const char *dir, const struct step_member *member, int weights_here,
                       struct step_prior *p)
{
    memset(p, 0, sizeof *p);
    if (dir) {
        struct step_cached c;
        char err[ERRMSG_LEN];
        step_cache_path(p->path, sizeof p->path, dir, id);
        int rc = step_cache_load(dir, id, &c, err);
        if (rc < 0) log_warn("serve", "step model cache not used: %s", err);
        if (rc > 0) {
            p->source = STEP_FROM_CACHE;
            p->m = c.m;
            p->err = c.err;
            p->steps = c.steps;
            p->calibrated = 1;
            return;
        }
    }
    if (member) {
        p->source = STEP_FROM_MEMBER;
        p->m = member->m;
        p->err = member->err;
        p->node = member->node;
        p->calibrated = member->calibrated;
        return;
    }
    p->source = STEP_FROM_DEFAULT;
    const struct engine *e = &lm->engine;
    double bytes = (double)lm->model.image_size;
    if (e->be && !strcmp(e->be->name, "cuda"))
        p->bw = 0, step_prior_default(&p->m, bytes, GUESS_GPU_BW);
    else {
        p->bw = weights_here && lm->weights ? read_bandwidth(lm->weights, lm->model.image_size) : 0;
        step_prior_default(&p->m, bytes, p->bw);
    }
    p->err = DEFAULT_ERR;
}

/* ---------------------------------------------------------------- saving */

int step_prior_save(const char *dir, int remount, const struct step_identity *id,
                    const struct step_cached *c, char *err)
{
    /* the model partition stays read-only but for this moment: a power cut finds it clean */
    if (remount && mount(NULL, dir, NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL))
        return errmsg_set(err, "%s: remount read-write: %s", dir, strerror(errno));
    int rc = step_cache_save(dir, id, c, err);
    if (remount && mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL)) {
        if (!rc) errmsg_set(err, "%s: remount read-only: %s", dir, strerror(errno));
        return -1;
    }
    return rc;
}
