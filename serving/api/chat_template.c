#include "serving/api/chat_template.h"

#include <stdlib.h>
#include <string.h>

static int contains(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) return 1;
    return 0;
}

enum chat_template chat_template_detect(const char *jinja, size_t len)
{
    if (!jinja || !len) return CHAT_PLAIN;
    if (contains(jinja, len, "<|im_start|>")) return CHAT_CHATML;
    if (contains(jinja, len, "[INST]")) {
        /* llama.cpp's variant order */
        if (contains(jinja, len, "content.strip()")) return CHAT_LLAMA2_SYS_STRIP;
        if (contains(jinja, len, "bos_token + '[INST]")) return CHAT_LLAMA2_SYS_BOS;
        if (contains(jinja, len, "<<SYS>>")) return CHAT_LLAMA2_SYS;
        return CHAT_LLAMA2;
    }
    if (contains(jinja, len, "<|user|>")) return CHAT_ZEPHYR;
    return CHAT_PLAIN;
}

const char *chat_template_name(enum chat_template t)
{
    switch (t) {
    case CHAT_LLAMA2:
        return "llama2";
    case CHAT_LLAMA2_SYS:
        return "llama2-sys";
    case CHAT_LLAMA2_SYS_BOS:
        return "llama2-sys-bos";
    case CHAT_LLAMA2_SYS_STRIP:
        return "llama2-sys-strip";
    case CHAT_CHATML:
        return "chatml";
    case CHAT_ZEPHYR:
        return "zephyr";
    default:
        return "plain";
    }
}

struct sbuf {
    char *p;
    size_t n, cap;
    struct chat_span *sp;
    int nsp, spcap;
    int oom;
};

static void put_n(struct sbuf *b, const char *s, size_t k, int marker)
{
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = (b->n + k + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->p[b->n + k] = 0;
    if (k) {
        struct chat_span *last = b->nsp ? &b->sp[b->nsp - 1] : NULL;
        if (last && last->marker == marker) {
            last->len += k;
        } else {
            if (b->nsp == b->spcap) {
                int cap = b->spcap ? 2 * b->spcap : 16;
                struct chat_span *p = realloc(b->sp, (size_t)cap * sizeof *p);
                if (!p) {
                    b->oom = 1;
                    return;
                }
                b->sp = p;
                b->spcap = cap;
            }
            b->sp[b->nsp++] = (struct chat_span){b->n, k, marker};
        }
    }
    b->n += k;
}

static void mark(struct sbuf *b, const char *s)
{
    put_n(b, s, strlen(s), 1);
}

static void content(struct sbuf *b, const char *s, int strip)
{
    size_t k = strlen(s);
    if (strip) { /* llama.cpp's trim(): isspace in the C locale */
        while (k && strchr(" \t\n\v\f\r", *s)) s++, k--;
        while (k && strchr(" \t\n\v\f\r", s[k - 1])) k--;
    }
    put_n(b, s, k, 0);
}

static const char *plain_role(const char *role)
{
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return "System";
    if (!strcmp(role, "assistant")) return "Assistant";
    return "User";
}

static int is_system(const char *role)
{
    return !strcmp(role, "system") || !strcmp(role, "developer");
}

/* llama.cpp's llama2 family: the prompt opens with "[INST] " (BOS comes from the tokenizer); a
 * system message goes where it stands (normally first, inside the first [INST]); an answer ends
 * with </s> and the next turn opens a new [INST]. There is no generation prompt. */
static void render_llama2(struct sbuf *b, enum chat_template t, const struct chat_message *m, int n)
{
    int sys = t != CHAT_LLAMA2, bos = t == CHAT_LLAMA2_SYS_BOS, strip = t == CHAT_LLAMA2_SYS_STRIP;
    int inside = 1;
    mark(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!inside) {
            inside = 1;
            mark(b, bos ? "<s>[INST] " : "[INST] ");
        }
        if (is_system(m[i].role)) {
            if (sys) mark(b, "<<SYS>>\n");
            content(b, m[i].content, strip);
            mark(b, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (!strcmp(m[i].role, "assistant")) {
            content(b, m[i].content, strip);
            mark(b, "</s>");
            inside = 0;
        } else {
            content(b, m[i].content, strip);
            mark(b, " [/INST]");
        }
    }
}

int chat_template_render_spans(enum chat_template t, const struct chat_message *m, int n,
                               struct chat_rendered *out)
{
    struct sbuf b = {0};
    put_n(&b, "", 0, 1);
    switch (t) {
    case CHAT_LLAMA2:
    case CHAT_LLAMA2_SYS:
    case CHAT_LLAMA2_SYS_BOS:
    case CHAT_LLAMA2_SYS_STRIP:
        render_llama2(&b, t, m, n);
        break;
    case CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            mark(&b, "<|im_start|>");
            mark(&b, is_system(m[i].role) ? "system" : m[i].role);
            mark(&b, "\n");
            content(&b, m[i].content, 0);
            mark(&b, "<|im_end|>\n");
        }
        mark(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_ZEPHYR:
        for (int i = 0; i < n; i++) {
            mark(&b, "<|");
            mark(&b, is_system(m[i].role) ? "system" : m[i].role);
            mark(&b, "|>\n");
            content(&b, m[i].content, 0);
            mark(&b, "</s>\n");
        }
        mark(&b, "<|assistant|>\n");
        break;
    default:
        for (int i = 0; i < n; i++) {
            mark(&b, plain_role(m[i].role));
            mark(&b, ": ");
            content(&b, m[i].content, 0);
            mark(&b, "\n");
        }
        mark(&b, "Assistant:");
        break;
    }
    if (b.oom) {
        free(b.p);
        free(b.sp);
        memset(out, 0, sizeof *out);
        return -1;
    }
    *out = (struct chat_rendered){b.p, b.n, b.sp, b.nsp};
    return 0;
}

void chat_rendered_free(struct chat_rendered *r)
{
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

char *chat_template_render(enum chat_template t, const struct chat_message *m, int n)
{
    struct chat_rendered r;
    if (chat_template_render_spans(t, m, n, &r)) return NULL;
    free(r.spans);
    return r.text;
}
