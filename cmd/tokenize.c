/* strata tokenize: a model's tokenizer on a text, printed as llama.cpp's llama-tokenize prints it
 * ("%6d -> '%s'" per token, the piece's raw bytes; with --ids one line "[1, 2, 3]"), so the two
 * can be compared line for line. Only the GGUF's header and tokenizer are read: the file is
 * mapped and the weights' pages are never touched, so a 5 GB model answers as fast as a small one,
 * and the weights need not be of a type or architecture Strata runs.
 * Unlike llama-tokenize, the text is taken as it is (no \n escapes) and special-token pieces
 * stay text unless --parse-special is given (llama-tokenize: --no-escape, --no-parse-special). */
#include "cmd/commands.h"
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/token_piece.h"
#include "serving/engine/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int usage(void)
{
    fprintf(stderr, "usage: strata tokenize -m MODEL.gguf [--no-bos] [--parse-special] [--ids] "
                    "TEXT   (TEXT \"-\": standard input)\n");
    return 2;
}

/* All of standard input; NULL on failure. */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, stdin);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    if (buf && ferror(stdin)) {
        free(buf);
        buf = NULL;
    }
    *len = n;
    return buf;
}

static int run_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text = NULL;
    int add_bos = 1, parse_special = 0, ids_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--no-bos"))
            add_bos = 0;
        else if (!strcmp(argv[i], "--parse-special"))
            parse_special = 1;
        else if (!strcmp(argv[i], "--ids"))
            ids_only = 1;
        else if (!text && (argv[i][0] != '-' || !strcmp(argv[i], "-")))
            text = argv[i];
        else
            return usage();
    }
    if (!path || !text) return usage();
    char err[ERRMSG_LEN];
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "strata tokenize: %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    /* Mapped, not read: parsing touches the header's pages only. */
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "strata tokenize: %s: mmap: %s\n", path, strerror(errno));
        return 1;
    }
    struct gguf g;
    struct tokenizer t;
    if (gguf_parse(&g, map, size, err) < 0) {
        fprintf(stderr, "strata tokenize: %s: %s\n", path, err);
        if (map) munmap(map, size);
        return 1;
    }
    if (tokenizer_from_gguf(&t, &g, err) < 0) {
        fprintf(stderr, "strata tokenize: %s: %s\n", path, err);
        gguf_free(&g);
        munmap(map, size);
        return 1;
    }
    size_t len = strlen(text);
    char *in = NULL;
    if (!strcmp(text, "-") && !(text = in = read_stdin(&len))) {
        fprintf(stderr, "strata tokenize: standard input: %s\n", strerror(errno));
        tokenizer_free(&t);
        gguf_free(&g);
        munmap(map, size);
        return 1;
    }
    int rc = 0, n = 0;
    int cap = len < (1u << 29) ? (int)(2 * len + 3) : 0;
    int *ids = cap ? malloc((size_t)cap * sizeof *ids) : NULL;
    struct tok_span sp = {text, len, parse_special};
    if (!ids) {
        fprintf(stderr, "strata tokenize: the text is too long (%zu bytes)\n", len);
        rc = 1;
    } else if (tokenizer_encode_spans(&t, &sp, 1, add_bos, ids, cap, &n, err) < 0) {
        fprintf(stderr, "strata tokenize: %s\n", err);
        rc = 1;
    } else if (ids_only) {
        putchar('[');
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    } else {
        for (int i = 0; i < n; i++) {
            char scratch[8];
            size_t k;
            const char *piece = token_piece(&t, ids[i], scratch, &k);
            printf("%6d -> '", ids[i]);
            fwrite(piece, 1, k, stdout);
            printf("'\n");
        }
    }
    if (fflush(stdout) || ferror(stdout)) rc = 1;
    free(ids);
    free(in);
    tokenizer_free(&t);
    gguf_free(&g);
    munmap(map, size);
    return rc;
}

const struct command cmd_tokenize = {
    "tokenize", run_tokenize,
    "tokenize -m MODEL.gguf [--no-bos] [--parse-special] [--ids] TEXT  (ids and pieces, as "
    "llama-tokenize prints them)"};
