/* loader pages: a model loaded from a file holds its weights once, in the arena.
 *
 * The loader copies every tensor into the arena and drops the file mapping's pages of each span
 * once it is copied (loader.h). What is checked here is whether this process has those pages
 * mapped: /proc/self/pagemap's "present" bit, per page. mincore() cannot tell: for a file mapping
 * it reports the page cache, where the dropped pages stay (by design: clean, reclaimable).
 *
 *   probe_sees_pages      the probe itself: a read page is present, a dropped one is not
 *   span_drop_is_exact    loader_drop_span_pages(s) drops span s's pages and no other span's;
 *                         loader_drop_data_pages leaves none of the data section, all of the header
 *   loader_holds_once     loader_open: at every progress call no copied span's pages are mapped,
 *                         after it none of the data section; the tokenizer (it reads the header in
 *                         the mapping) and the engine give the same ids, tokens and logits, bit for
 *                         bit, as an engine over an image filled from a private copy of the file
 *
 * The model: ../shared/models/quant-refs/kq-Q4_K_M.gguf (Q4_K and Q6_K matrices, f32 vectors). */
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/loader.h"
#include "tests/unit/check.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char model_path[512];
static uintptr_t page;

/* Whole pages inside [lo, hi) that this process has mapped in; *total gets how many there are.
 * -1 when pagemap cannot be read. */
static long present_pages(uintptr_t lo, uintptr_t hi, long *total)
{
    uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    *total = a < b ? (long)((b - a) / page) : 0;
    if (!*total) return 0;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0) return -1;
    long n = 0;
    uint64_t e[512];
    for (uintptr_t p = a; p < b;) {
        size_t k = (b - p) / page < 512 ? (b - p) / page : 512;
        if (pread(fd, e, k * 8, (off_t)(p / page * 8)) != (ssize_t)(k * 8)) {
            close(fd);
            return -1;
        }
        for (size_t i = 0; i < k; i++) n += (long)(e[i] >> 63);
        p += k * page;
    }
    close(fd);
    return n;
}

/* The present pages inside each tensor of span s (whole pages only), summed. */
static long span_present(const struct model *m, int s, long *total)
{
    long n = 0, t = 0;
    *total = 0;
    for (int i = 0; i < m->n_slots; i++) {
        if (m->slots[i].span != s) continue;
        uintptr_t p = (uintptr_t)gguf_tensor_data(m->gguf, m->slots[i].src);
        long k = present_pages(p, p + m->slots[i].src->nbytes, &t);
        if (k < 0) return -1;
        n += k;
        *total += t;
    }
    return n;
}

static const uint8_t *map_model(size_t *size)
{
    int fd = open(model_path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) return NULL;
    *size = (size_t)st.st_size;
    void *p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static unsigned touch(const uint8_t *p, size_t n)
{
    unsigned s = 0;
    for (size_t i = 0; i < n; i += page) s += ((const volatile uint8_t *)p)[i];
    return s;
}

TEST(probe_sees_pages)
{
    size_t size;
    const uint8_t *map = map_model(&size);
    CHECK(map);
    long total, n = present_pages((uintptr_t)map, (uintptr_t)map + size, &total);
    if (n < 0) {
        munmap((void *)map, size);
        SKIP("/proc/self/pagemap cannot be read here");
    }
    touch(map, size);
    n = present_pages((uintptr_t)map, (uintptr_t)map + size, &total);
    CHECKF(total > 16 && n == total, "%ld of %ld pages present after reading them", n, total);
    CHECK(madvise((void *)map, size, MADV_DONTNEED) == 0);
    n = present_pages((uintptr_t)map, (uintptr_t)map + size, &total);
    CHECKF(n == 0, "%ld of %ld pages present after MADV_DONTNEED", n, total);
    CHECK(touch(map, size) == touch(map, size)); /* the bytes come back */
    munmap((void *)map, size);
}

TEST(span_drop_is_exact)
{
    char err[ERRMSG_LEN];
    size_t size;
    const uint8_t *map = map_model(&size);
    CHECK(map);
    struct gguf g;
    struct model m;
    CHECKF(gguf_parse(&g, map, size, err) == 0, "%s", err);
    CHECKF(model_plan(&m, &g, model_path, err) == 0, "%s", err);
    uint8_t *image = malloc(m.image_size);
    CHECK(image);
    touch(map, size);
    long total, n, t2;
    /* block 0 (span 1): its pages go, block 1's (span 2) stay */
    CHECKF(model_fill(&m, image, 1, err) == 0, "%s", err);
    CHECKF(loader_drop_span_pages(&m, 1, err) == 0, "%s", err);
    n = span_present(&m, 1, &total);
    CHECKF(total > 0 && n == 0, "span 1: %ld of %ld pages still present", n, total);
    n = span_present(&m, 2, &t2);
    CHECKF(t2 > 0 && n == t2, "span 2 (not copied): %ld of %ld pages present", n, t2);
    for (int s = 0; s < m.n_spans; s++) {
        CHECKF(model_fill(&m, image, s, err) == 0, "%s", err);
        CHECKF(loader_drop_span_pages(&m, s, err) == 0, "%s", err);
    }
    CHECKF(loader_drop_data_pages(&g, err) == 0, "%s", err);
    const uintptr_t base = (uintptr_t)map;
    n = present_pages(base + g.data_offset, base + (size + page - 1) / page * page, &total);
    CHECKF(total > 0 && n == 0, "data section: %ld of %ld pages present", n, total);
    n = present_pages(base, base + g.data_offset, &total);
    CHECKF(total > 0 && n == total, "header: %ld of %ld pages present", n, total);
    /* the image holds the file's bytes */
    for (int i = 0; i < m.n_slots; i++)
        CHECK(!memcmp(image + m.slots[i].image_offset, gguf_tensor_data(&g, m.slots[i].src),
                      m.slots[i].src->nbytes));
    free(image);
    model_free(&m);
    gguf_free(&g);
    munmap((void *)map, size);
}

/* At each progress call: the present pages of the spans already copied (must be none). */
static struct loaded_model lm, ref;
static long progress_present, progress_calls;
static void on_progress(void *ctx, int done, int total)
{
    (void)total;
    struct loaded_model *l = ctx;
    long t;
    progress_calls++;
    for (int s = 0; s < done; s++) {
        long n = span_present(&l->model, s, &t);
        progress_present += n < 0 ? 1 : n;
    }
}

/* Greedy: the prompt, then n tokens; the ids in out[0..n), the last step's logits in logits. */
static int greedy(struct loaded_model *l, const int *prompt, int n_prompt, int n, int *out,
                  float *logits, char *err)
{
    struct engine *e = &l->engine;
    int tokens[128], pos[128], vocab = l->model.cfg.vocab_size;
    const int *blocks[128];
    int n_blocks = kv_blocks_for(&e->kv, n_prompt + n), table[64];
    if (n_prompt + n > 128 || n_blocks > 64) return errmsg_set(err, "too long");
    for (int i = 0; i < n_blocks; i++) table[i] = kv_block_alloc(&e->kv);
    memcpy(tokens, prompt, sizeof(int) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt + n; i++) pos[i] = i, blocks[i] = table;
    int last = n_prompt - 1, rc = 0;
    struct batch b = {n_prompt, tokens, pos, blocks, 1, &last};
    if (engine_forward(e, &b, logits)) rc = errmsg_set(err, "prefill failed");
    for (int k = 0; !rc && k < n; k++) {
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        out[k] = tokens[n_prompt + k] = best;
        int zero = 0;
        struct batch d = {1, &tokens[n_prompt + k], &pos[n_prompt + k], &blocks[0], 1, &zero};
        if (k + 1 < n && engine_forward(e, &d, logits)) rc = errmsg_set(err, "step %d failed", k);
    }
    for (int i = 0; i < n_blocks; i++) kv_block_free(&e->kv, table[i]);
    return rc;
}

TEST(loader_holds_once)
{
    char err[ERRMSG_LEN];
    struct loader_opts o = {.limits = {.max_seqs = 1, .max_tokens = 64, .ctx = 128, .threads = 1},
                            .progress = on_progress,
                            .progress_ctx = &lm};
    CHECKF(loader_open(&lm, model_path, &o, err) == 0, "%s", err);
    CHECKF(progress_calls == lm.model.n_spans && progress_present == 0,
           "%ld progress calls, %ld pages of copied spans present", progress_calls,
           progress_present);
    const uintptr_t base = (uintptr_t)lm.map;
    long total, n = present_pages(base + lm.gguf.data_offset,
                                  base + (lm.map_size + page - 1) / page * page, &total);
    CHECKF(total > 0 && n == 0, "data section: %ld of %ld pages present", n, total);

    /* The reference: the same file read into private memory (no mapping), its image filled from
     * there into an engine planned from the header. */
    FILE *f = fopen(model_path, "rb");
    uint8_t *copy = malloc(lm.map_size);
    CHECK(f && copy && fread(copy, 1, lm.map_size, f) == lm.map_size);
    fclose(f);
    struct gguf g;
    struct model m;
    struct loader_opts ro = o;
    ro.progress = NULL;
    CHECKF(gguf_parse(&g, copy, lm.map_size, err) == 0, "%s", err);
    CHECKF(model_plan(&m, &g, "copy", err) == 0, "%s", err);
    CHECKF(loader_open_header(&ref, "copy", copy, g.data_offset, &ro, err) == 0, "%s", err);
    CHECK(ref.model.image_size == m.image_size);
    for (int s = 0; s < m.n_spans; s++) CHECKF(model_fill(&m, ref.weights, s, err) == 0, "%s", err);
    CHECKF(loader_start(&ref, err) == 0, "%s", err);

    const char *text = "Lily and Tom found a big red ball.";
    int ids[64], ref_ids[64], n_ids = 0, n_ref = 0, out[16], ref_out[16];
    CHECKF(tokenizer_encode(&lm.tok, text, strlen(text), 1, ids, 64, &n_ids, err) == 0, "%s", err);
    CHECKF(tokenizer_encode(&ref.tok, text, strlen(text), 1, ref_ids, 64, &n_ref, err) == 0, "%s",
           err);
    CHECK(n_ids > 2 && n_ids == n_ref && !memcmp(ids, ref_ids, sizeof(int) * (size_t)n_ids));
    size_t vocab = (size_t)lm.model.cfg.vocab_size;
    float *lg = malloc(vocab * sizeof(float)), *ref_lg = malloc(vocab * sizeof(float));
    CHECK(lg && ref_lg);
    CHECKF(greedy(&lm, ids, n_ids, 16, out, lg, err) == 0, "%s", err);
    CHECKF(greedy(&ref, ids, n_ids, 16, ref_out, ref_lg, err) == 0, "%s", err);
    CHECK(!memcmp(out, ref_out, sizeof out));
    CHECK(!memcmp(lg, ref_lg, vocab * sizeof(float)));
    free(lg), free(ref_lg);
    loader_close(&ref);
    model_free(&m);
    gguf_free(&g);
    free(copy);
    loader_close(&lm);
}

int main(void)
{
    log_set_quiet(1);
    page = (uintptr_t)sysconf(_SC_PAGESIZE);
    snprintf(model_path, sizeof model_path, "%s/models/quant-refs/kq-Q4_K_M.gguf", check_shared());
    if (access(model_path, R_OK) != 0) {
        printf("skip - loader pages: %s not found\n", model_path);
        return 0;
    }
    RUN(probe_sees_pages);
    RUN(span_drop_is_exact);
    RUN(loader_holds_once);
    CHECK_DONE();
}
