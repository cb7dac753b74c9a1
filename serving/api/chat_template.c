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
    if (contains(jinja, len, "[INST]")) return CHAT_LLAMA2;
    if (contains(jinja, len, "<|user|>")) return CHAT_ZEPHYR;
    return CHAT_PLAIN;
}

const char *chat_template_name(enum chat_template t)
{
    switch (t) {
    case CHAT_LLAMA2:
        return "llama2";
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
    int oom;
};

static void put(struct sbuf *b, const char *s)
{
    size_t k = strlen(s);
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
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
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

char *chat_template_render(enum chat_template t, const struct chat_message *m, int n)
{
    struct sbuf b = {0};
    put(&b, "");
    switch (t) {
    case CHAT_PLAIN:
        for (int i = 0; i < n; i++) {
            put(&b, plain_role(m[i].role));
            put(&b, ": ");
            put(&b, m[i].content);
            put(&b, "\n");
        }
        put(&b, "Assistant:");
        break;
    case CHAT_LLAMA2: {
        /* The system prompt goes inside the first [INST]. */
        const char *sys = NULL;
        int open = 0;
        for (int i = 0; i < n; i++) {
            if (is_system(m[i].role)) {
                sys = m[i].content;
                continue;
            }
            if (!strcmp(m[i].role, "assistant")) {
                if (open) put(&b, " [/INST]"), open = 0;
                put(&b, " ");
                put(&b, m[i].content);
                put(&b, " ");
                continue;
            }
            if (open)
                put(&b, "\n");
            else
                put(&b, "[INST] "), open = 1;
            if (sys) {
                put(&b, "<<SYS>>\n");
                put(&b, sys);
                put(&b, "\n<</SYS>>\n\n");
                sys = NULL;
            }
            put(&b, m[i].content);
        }
        if (open) put(&b, " [/INST]");
        break;
    }
    case CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, is_system(m[i].role) ? "system" : m[i].role);
            put(&b, "\n");
            put(&b, m[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_ZEPHYR:
        for (int i = 0; i < n; i++) {
            put(&b, "<|");
            put(&b, is_system(m[i].role) ? "system" : m[i].role);
            put(&b, "|>\n");
            put(&b, m[i].content);
            put(&b, "</s>\n");
        }
        put(&b, "<|assistant|>\n");
        break;
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
