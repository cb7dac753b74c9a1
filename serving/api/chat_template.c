#include "serving/api/chat_template.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- names */

#define CHAT_TEMPLATE_NAME(id, name) [CHAT_##id] = name,
static const char *const NAMES[CHAT_N_TEMPLATES] = {CHAT_TEMPLATES(CHAT_TEMPLATE_NAME)};
#undef CHAT_TEMPLATE_NAME

const char *chat_template_name(enum chat_template t)
{
    return (unsigned)t < CHAT_N_TEMPLATES ? NAMES[t] : NAMES[CHAT_PLAIN];
}

int chat_template_from_name(const char *name)
{
    for (int t = 0; t < CHAT_N_TEMPLATES; t++)
        if (!strcmp(NAMES[t], name)) return t;
    return -1;
}

/* ---------------------------------------------------------------- detection */

struct jinja {
    const char *s;
    size_t n;
};

static int has(struct jinja j, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= j.n; i++)
        if (!memcmp(j.s + i, needle, k)) return 1;
    return 0;
}

/* Mistral's [INST] templates and the llama2 family they grew from. */
static enum chat_template detect_inst(struct jinja j)
{
    if (has(j, "[SYSTEM_PROMPT]")) return CHAT_MISTRAL_V7;
    /* Mistral's official v1 template joins "' [INST] ' + system_message"; v3 and v3-tekken list
     * [AVAILABLE_TOOLS]; v3-tekken writes "[INST]" without spaces around it. */
    if (has(j, "' [INST] ' + system_message") || has(j, "[AVAILABLE_TOOLS]")) {
        if (has(j, " [INST]")) return CHAT_MISTRAL_V1;
        if (has(j, "\"[INST]\"")) return CHAT_MISTRAL_V3_TEKKEN;
        return CHAT_MISTRAL_V3;
    }
    if (has(j, "content.strip()")) return CHAT_LLAMA2_SYS_STRIP;
    if (has(j, "bos_token + '[INST]")) return CHAT_LLAMA2_SYS_BOS;
    if (has(j, "<<SYS>>")) return CHAT_LLAMA2_SYS;
    return CHAT_LLAMA2;
}

/* llama.cpp's llm_chat_detect_template, test for test in its order (the first match wins, so a
 * template holding the markers of two families gets the earlier one there and here). */
enum chat_template chat_template_detect(const char *jinja, size_t len)
{
    if (!jinja || !len) return CHAT_PLAIN;
    struct jinja j = {jinja, len};
    for (int t = 0; t < CHAT_N_TEMPLATES; t++)
        if (t != CHAT_PLAIN && t != CHAT_ZEPHYR_EOS && strlen(NAMES[t]) == len &&
            !memcmp(NAMES[t], jinja, len) && t != CHAT_DOTS1)
            return (enum chat_template)t;
    if (has(j, "<|im_start|>")) {
        if (has(j, "<|im_sep|>")) return CHAT_PHI4;
        /* SmolVLM opens with <|im_start|> as its BOS but is not chatml */
        if (has(j, "<end_of_utterance>")) return CHAT_SMOLVLM;
        return CHAT_CHATML;
    }
    if ((len >= 7 && !memcmp(jinja, "mistral", 7)) || has(j, "[INST]")) return detect_inst(j);
    if (has(j, "<|assistant|>") && has(j, "<|end|>")) return CHAT_PHI3;
    if (has(j, "[gMASK]<sop>")) return CHAT_CHATGLM4;
    if (has(j, "<|assistant|>") && has(j, "<|user|>")) {
        if (has(j, "</s>")) return CHAT_FALCON3;
        /* Strata's own: TinyLlama-Chat and zephyr-7b-beta end every turn with eos_token */
        if (has(j, "eos_token")) return CHAT_ZEPHYR_EOS;
        return CHAT_GLMEDGE;
    }
    if (has(j, "<|{{ item['role'] }}|>") && has(j, "<|begin_of_image|>")) return CHAT_GLMEDGE;
    if (has(j, "<|user|>") && has(j, "<|endoftext|>")) return CHAT_ZEPHYR;
    if (has(j, "bos_token + message['role']")) return CHAT_MONARCH;
    if (has(j, "<start_of_turn>")) return CHAT_GEMMA;
    if (has(j, "'\\n\\nAssistant: ' + eos_token")) return CHAT_ORION;
    if (has(j, "GPT4 Correct ")) return CHAT_OPENCHAT;
    if (has(j, "USER: ") && has(j, "ASSISTANT: "))
        return has(j, "SYSTEM: ") ? CHAT_VICUNA_ORCA : CHAT_VICUNA;
    if (has(j, "### Instruction:") && has(j, "<|EOT|>")) return CHAT_DEEPSEEK;
    if (has(j, "<|START_OF_TURN_TOKEN|>") && has(j, "<|USER_TOKEN|>")) return CHAT_COMMAND_R;
    if (has(j, "<|start_header_id|>") && has(j, "<|end_header_id|>")) return CHAT_LLAMA3;
    if (has(j, "[gMASK]sop")) return CHAT_CHATGLM3;
    if (has(j, "<用户>")) return CHAT_MINICPM;
    if (has(j, "'Assistant: ' + message['content'] + eos_token")) return CHAT_DEEPSEEK2;
    /* full-width bars (U+FF5C) and U+2581 as DeepSeek spells them */
    if (has(j, "<｜Assistant｜>") && has(j, "<｜User｜>") && has(j, "<｜end▁of▁sentence｜>"))
        return CHAT_DEEPSEEK3;
    if (has(j, "[|system|]") && has(j, "[|assistant|]") && has(j, "[|endofturn|]"))
        return has(j, "[|tool|]") ? CHAT_EXAONE4 : CHAT_EXAONE3;
    if (has(j, "rwkv-world") || has(j, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
        return CHAT_RWKV_WORLD;
    if (has(j, "<|start_of_role|>")) return CHAT_GRANITE;
    if (has(j, "message['role'] + additional_special_tokens[0] + message['content'] + "
               "additional_special_tokens[1]"))
        return CHAT_GIGACHAT;
    if (has(j, "<|role_start|>")) return CHAT_MEGREZ;
    if (has(j, " Ассистент:")) return CHAT_YANDEX;
    if (has(j, "<role>ASSISTANT</role>") && has(j, "'HUMAN'")) return CHAT_BAILING;
    if (has(j, "<role>ASSISTANT</role>") && has(j, "\"HUMAN\"") && has(j, "<think>"))
        return CHAT_BAILING_THINK;
    if (has(j, "<role>ASSISTANT</role>") && has(j, "<role>HUMAN</role>") && has(j, "<|role_end|>"))
        return CHAT_BAILING2;
    if (has(j, "<|header_start|>") && has(j, "<|header_end|>")) return CHAT_LLAMA4;
    if (has(j, "<|endofuserprompt|>")) return CHAT_DOTS1;
    if (has(j, "<|extra_0|>") && has(j, "<|extra_4|>")) return CHAT_HUNYUAN_MOE;
    if (has(j, "<|start|>") && has(j, "<|channel|>")) return CHAT_GPT_OSS;
    if (has(j, "<｜hy_Assistant｜>") && has(j, "<｜hy_place▁holder▁no▁3｜>"))
        return CHAT_HUNYUAN_DENSE;
    if (has(j, "<|im_assistant|>assistant<|im_middle|>")) return CHAT_KIMI_K2;
    if (has(j, "<seed:bos>")) return CHAT_SEED_OSS;
    if (has(j, "'Assistant: '  + message['content'] + '<|separator|>")) return CHAT_GROK2;
    if (has(j, "[unused9]系统：[unused10]")) return CHAT_PANGU_EMBED;
    return CHAT_PLAIN;
}

/* ---------------------------------------------------------------- the output */

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

/* llama.cpp's trim(): isspace in the C locale, both ends */
static void trimmed(const char **s, size_t *k)
{
    while (*k && strchr(" \t\n\v\f\r", **s)) ++*s, --*k;
    while (*k && strchr(" \t\n\v\f\r", (*s)[*k - 1])) --*k;
}

static void content(struct sbuf *b, const char *s, int trim)
{
    size_t k = strlen(s);
    if (trim) trimmed(&s, &k);
    put_n(b, s, k, 0);
}

/* The role as the template writes it: "developer" is OpenAI's newer name for "system". */
static const char *role_of(const struct chat_message *m)
{
    return strcmp(m->role, "developer") ? m->role : "system";
}

static int is_role(const struct chat_message *m, const char *role)
{
    return !strcmp(role_of(m), role);
}

/* ---------------------------------------------------------------- templates as tables */

/* Most templates write each message as pre + content + post, chosen by its role; ROLE in pre
 * stands for the role's name as sent. pre NULL: llama.cpp writes nothing for that role. */
#define ROLE "\x01"

enum role_class { R_SYSTEM, R_USER, R_ASSISTANT, R_OTHER }; /* R_OTHER: tool */

struct turn {
    const char *pre, *post;
    int trim;
};

struct layout {
    const char *start;        /* before the first message */
    const char *start_no_sys; /* before the first message when it is not a system message */
    struct turn role[4];      /* by enum role_class */
    const char *gen;          /* the generation prompt, or NULL */
};

/* clang-format off */
#define EVERY(pre, post, trim) \
    {{pre, post, trim}, {pre, post, trim}, {pre, post, trim}, {pre, post, trim}}
/* clang-format on */

static const struct layout LAYOUTS[CHAT_N_TEMPLATES] = {
    [CHAT_CHATML] = {.role = EVERY("<|im_start|>" ROLE "\n", "<|im_end|>\n", 0),
                     .gen = "<|im_start|>assistant\n"},
    [CHAT_MISTRAL_V7] = {.role = {{"[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]", 0},
                                  {"[INST] ", "[/INST]", 0},
                                  {" ", "</s>", 0},
                                  {" ", "</s>", 0}}},
    [CHAT_MISTRAL_V7_TEKKEN] = {.role = {{"[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", 0},
                                         {"[INST]", "[/INST]", 0},
                                         {"", "</s>", 0},
                                         {"", "</s>", 0}}},
    [CHAT_PHI3] = {.role = EVERY("<|" ROLE "|>\n", "<|end|>\n", 0), .gen = "<|assistant|>\n"},
    [CHAT_PHI4] = {.role = EVERY("<|im_start|>" ROLE "<|im_sep|>", "<|im_end|>", 0),
                   .gen = "<|im_start|>assistant<|im_sep|>"},
    [CHAT_FALCON3] = {.role = EVERY("<|" ROLE "|>\n", "\n", 0), .gen = "<|assistant|>\n"},
    [CHAT_ZEPHYR] = {.role = EVERY("<|" ROLE "|>\n", "<|endoftext|>\n", 0),
                     .gen = "<|assistant|>\n"},
    [CHAT_ZEPHYR_EOS] = {.role = EVERY("<|" ROLE "|>\n", "</s>\n", 0), .gen = "<|assistant|>\n"},
    [CHAT_OPENCHAT] = {.role = {{"", "<|end_of_turn|>", 0},
                                {"GPT4 Correct User: ", "<|end_of_turn|>", 0},
                                {"GPT4 Correct Assistant: ", "<|end_of_turn|>", 0},
                                {"GPT4 Correct Tool: ", "<|end_of_turn|>", 0}},
                       .gen = "GPT4 Correct Assistant:"},
    [CHAT_VICUNA] = {.role = {{"", "\n\n", 0},
                              {"USER: ", "\n", 0},
                              {"ASSISTANT: ", "</s>\n", 0},
                              {NULL, NULL, 0}},
                     .gen = "ASSISTANT:"},
    [CHAT_VICUNA_ORCA] = {.role = {{"SYSTEM: ", "\n", 0},
                                   {"USER: ", "\n", 0},
                                   {"ASSISTANT: ", "</s>\n", 0},
                                   {NULL, NULL, 0}},
                          .gen = "ASSISTANT:"},
    [CHAT_DEEPSEEK] = {.role = {{"", "", 0},
                                {"### Instruction:\n", "\n", 0},
                                {"### Response:\n", "\n<|EOT|>\n", 0},
                                {NULL, NULL, 0}},
                       .gen = "### Response:\n"},
    [CHAT_DEEPSEEK2] = {.role = {{"", "\n\n", 0},
                                 {"User: ", "\n\n", 0},
                                 {"Assistant: ", "<｜end▁of▁sentence｜>", 0},
                                 {NULL, NULL, 0}},
                        .gen = "Assistant:"},
    [CHAT_DEEPSEEK3] = {.role = {{"", "\n\n", 0},
                                 {"<｜User｜>", "", 0},
                                 {"<｜Assistant｜>", "<｜end▁of▁sentence｜>", 0},
                                 {NULL, NULL, 0}},
                        .gen = "<｜Assistant｜>"},
    [CHAT_COMMAND_R] =
        {.role = {{"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1},
                  {"<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1},
                  {"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>", 1},
                  {NULL, NULL, 0}},
         .gen = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    [CHAT_LLAMA3] = {.role =
                         EVERY("<|start_header_id|>" ROLE "<|end_header_id|>\n\n", "<|eot_id|>", 1),
                     .gen = "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    [CHAT_CHATGLM3] = {.start = "[gMASK]sop",
                       .role = EVERY("<|" ROLE "|>\n ", "", 0),
                       .gen = "<|assistant|>"},
    [CHAT_CHATGLM4] = {.start = "[gMASK]<sop>",
                       .role = EVERY("<|" ROLE "|>\n", "", 0),
                       .gen = "<|assistant|>\n"},
    [CHAT_GLMEDGE] = {.role = EVERY("<|" ROLE "|>\n", "", 0), .gen = "<|assistant|>"},
    [CHAT_MINICPM] = {.role = {{"", "", 1}, {"<用户>", "<AI>", 1}, {"", "", 1}, {"", "", 1}}},
    [CHAT_EXAONE3] = {.role = {{"[|system|]", "[|endofturn|]\n", 1},
                               {"[|user|]", "\n", 1},
                               {"[|assistant|]", "[|endofturn|]\n", 1},
                               {NULL, NULL, 0}},
                      .gen = "[|assistant|]"},
    [CHAT_EXAONE4] = {.role = {{"[|system|]", "[|endofturn|]\n", 1},
                               {"[|user|]", "\n", 1},
                               {"[|assistant|]", "[|endofturn|]\n", 1},
                               {"[|tool|]", "[|endofturn|]\n", 1}},
                      .gen = "[|assistant|]"},
    [CHAT_GRANITE] = {.role =
                          EVERY("<|start_of_role|>" ROLE "<|end_of_role|>", "<|end_of_text|>\n", 0),
                      .gen = "<|start_of_role|>assistant<|end_of_role|>"},
    [CHAT_MEGREZ] = {.role = EVERY("<|role_start|>" ROLE "<|role_end|>", "<|turn_end|>", 0),
                     .gen = "<|role_start|>assistant<|role_end|>"},
    [CHAT_YANDEX] = {.role = {{NULL, NULL, 0},
                              {" Пользователь: ", "\n\n", 0},
                              {" Ассистент: ", "\n\n", 0},
                              {NULL, NULL, 0}},
                     .gen = " Ассистент:[SEP]"},
    [CHAT_BAILING] = {.role = {{"<role>SYSTEM</role>", "", 0},
                               {"<role>HUMAN</role>", "", 0},
                               {"<role>ASSISTANT</role>", "", 0},
                               {"<role>TOOL</role>", "", 0}},
                      .gen = "<role>ASSISTANT</role>"},
    [CHAT_BAILING_THINK] = {.role = {{"<role>SYSTEM</role>", "", 0},
                                     {"<role>HUMAN</role>", "", 0},
                                     {"<role>ASSISTANT</role>", "", 0},
                                     {"<role>TOOL</role>", "", 0}},
                            .gen = "<role>ASSISTANT</role><think>"},
    [CHAT_BAILING2] = {.start_no_sys = "<role>SYSTEM</role>detailed thinking off<|role_end|>",
                       .role = {{"<role>SYSTEM</role>", "<|role_end|>", 0},
                                {"<role>HUMAN</role>", "<|role_end|>", 0},
                                {"<role>ASSISTANT</role>", "<|role_end|>", 0},
                                {"<role>TOOL</role>", "<|role_end|>", 0}},
                       .gen = "<role>ASSISTANT</role>"},
    [CHAT_LLAMA4] = {.role = EVERY("<|header_start|>" ROLE "<|header_end|>\n\n", "<|eot|>", 1),
                     .gen = "<|header_start|>assistant<|header_end|>\n\n"},
    [CHAT_SMOLVLM] = {.start = "<|im_start|>",
                      .role = {{"", "\n\n", 0},
                               {"User: ", "<end_of_utterance>\n", 0},
                               {"Assistant: ", "<end_of_utterance>\n", 0},
                               {"Assistant: ", "<end_of_utterance>\n", 0}},
                      .gen = "Assistant:"},
    [CHAT_DOTS1] = {.role = {{"<|system|>", "<|endofsystem|>", 0},
                             {"<|userprompt|>", "<|endofuserprompt|>", 0},
                             {"<|response|>", "<|endofresponse|>", 0},
                             {"<|response|>", "<|endofresponse|>", 0}},
                    .gen = "<|response|>"},
    [CHAT_HUNYUAN_MOE] = {.role = {{"<|startoftext|>", "<|extra_4|>", 0},
                                   {"<|startoftext|>", "<|extra_0|>", 0},
                                   {"", "<|eos|>", 0},
                                   {"<|startoftext|>", "<|extra_0|>", 0}}},
    [CHAT_GPT_OSS] = {.role = {{"<|start|>" ROLE "<|message|>", "<|end|>", 0},
                               {"<|start|>" ROLE "<|message|>", "<|end|>", 0},
                               {"<|start|>" ROLE "<|message|>", "<|return|>", 0},
                               {"<|start|>" ROLE "<|message|>", "<|end|>", 0}},
                      .gen = "<|start|>assistant"},
    [CHAT_KIMI_K2] = {.role = {{"<|im_system|>system<|im_middle|>", "<|im_end|>", 0},
                               {"<|im_user|>user<|im_middle|>", "<|im_end|>", 0},
                               {"<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", 0},
                               {"<|im_system|>tool<|im_middle|>", "<|im_end|>", 0}},
                      .gen = "<|im_assistant|>assistant<|im_middle|>"},
    [CHAT_SEED_OSS] = {.role = {{"<seed:bos>" ROLE "\n", "<seed:eos>", 0},
                                {"<seed:bos>" ROLE "\n", "<seed:eos>", 0},
                                {"<seed:bos>" ROLE "\n", "<seed:eos>", 1},
                                {"<seed:bos>" ROLE "\n", "<seed:eos>", 0}},
                       .gen = "<seed:bos>assistant\n"},
    [CHAT_GROK2] = {.role = {{"System: ", "<|separator|>\n\n", 1},
                             {"Human: ", "<|separator|>\n\n", 1},
                             {"Assistant: ", "<|separator|>\n\n", 0},
                             {NULL, NULL, 0}},
                    .gen = "Assistant:"},
    [CHAT_PANGU_EMBED] = {.start_no_sys = "[unused9]系统：[unused10]",
                          .role = {{"[unused9]系统：", "[unused10]", 0},
                                   {"[unused9]用户：", "[unused10]", 0},
                                   {"[unused9]助手：", "[unused10]", 0},
                                   {"[unused9]工具：", "[unused10]", 0}},
                          .gen = "[unused9]助手："},
};

static enum role_class role_class(const struct chat_message *m)
{
    if (is_role(m, "system")) return R_SYSTEM;
    if (is_role(m, "user")) return R_USER;
    if (is_role(m, "assistant")) return R_ASSISTANT;
    return R_OTHER;
}

/* pre with each ROLE replaced by the message's role */
static void pre_with_role(struct sbuf *b, const char *pre, const char *role)
{
    for (const char *r; (r = strchr(pre, ROLE[0])); pre = r + 1) {
        put_n(b, pre, (size_t)(r - pre), 1);
        mark(b, role);
    }
    mark(b, pre);
}

static void render_layout(struct sbuf *b, const struct layout *l, const struct chat_message *m,
                          int n, int add_gen)
{
    if (l->start) mark(b, l->start);
    if (l->start_no_sys && n && !is_role(&m[0], "system")) mark(b, l->start_no_sys);
    for (int i = 0; i < n; i++) {
        const struct turn *t = &l->role[role_class(&m[i])];
        if (!t->pre) continue;
        pre_with_role(b, t->pre, role_of(&m[i]));
        content(b, m[i].content, t->trim);
        mark(b, t->post);
    }
    if (add_gen && l->gen) mark(b, l->gen);
}

/* ---------------------------------------------------------------- templates as code */

/* Strata's default: no control tokens needed. */
static void render_plain(struct sbuf *b, const struct chat_message *m, int n, int add_gen)
{
    for (int i = 0; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        mark(b, r == R_SYSTEM ? "System: " : r == R_ASSISTANT ? "Assistant: " : "User: ");
        content(b, m[i].content, 0);
        mark(b, "\n");
    }
    if (add_gen) mark(b, "Assistant:");
}

/* The llama2 family: the prompt opens with "[INST] " (BOS comes from the tokenizer); a system
 * message goes where it stands (normally first, inside the first [INST]); an answer ends with
 * </s> and the next message opens a new [INST]. There is no generation prompt. */
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
        enum role_class r = role_class(&m[i]);
        if (r == R_SYSTEM) {
            if (sys) mark(b, "<<SYS>>\n");
            content(b, m[i].content, strip);
            mark(b, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (r == R_USER) {
            content(b, m[i].content, strip);
            mark(b, " [/INST]");
        } else {
            content(b, m[i].content, strip);
            mark(b, "</s>");
            inside = 0;
        }
    }
}

/* Mistral v1/v3/v3-tekken: like llama2 without <<SYS>> (a system message is "{system}\n\n" in
 * the open turn); v1 puts spaces around [INST] and [/INST], v3 trims answers, tekken has no
 * space after [INST] nor before an answer. */
static void render_mistral(struct sbuf *b, enum chat_template t, const struct chat_message *m,
                           int n)
{
    int v1 = t == CHAT_MISTRAL_V1, tekken = t == CHAT_MISTRAL_V3_TEKKEN;
    int inside = 0;
    for (int i = 0; i < n; i++) {
        if (!inside) {
            mark(b, v1 ? " [INST] " : tekken ? "[INST]" : "[INST] ");
            inside = 1;
        }
        enum role_class r = role_class(&m[i]);
        if (r == R_SYSTEM) {
            content(b, m[i].content, 0);
            mark(b, "\n\n");
        } else if (r == R_USER) {
            content(b, m[i].content, 0);
            mark(b, v1 ? " [/INST]" : "[/INST]");
        } else {
            if (!tekken) mark(b, " ");
            content(b, m[i].content, t == CHAT_MISTRAL_V3);
            mark(b, "</s>");
            inside = 0;
        }
    }
}

/* Gemma has no system role: system texts (trimmed, joined) open the next user turn's content;
 * "assistant" is "model". */
static void render_gemma(struct sbuf *b, const struct chat_message *m, int n, int add_gen)
{
    int pending = -1, n_pending = 0; /* the system messages not yet written: from index pending */
    for (int i = 0; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        if (r == R_SYSTEM) {
            if (!n_pending++) pending = i;
            continue;
        }
        mark(b, "<start_of_turn>");
        mark(b, r == R_ASSISTANT ? "model" : role_of(&m[i]));
        mark(b, "\n");
        if (r != R_ASSISTANT && n_pending) {
            size_t before = b->n;
            for (int k = pending; k < i; k++)
                if (role_class(&m[k]) == R_SYSTEM) content(b, m[k].content, 1);
            if (b->n > before) mark(b, "\n\n");
            n_pending = 0;
            /* an empty system text is no system text: llama.cpp tests the joined string */
        }
        content(b, m[i].content, 1);
        mark(b, "<end_of_turn>\n");
    }
    if (add_gen) mark(b, "<start_of_turn>model\n");
}

/* Orion: system texts (joined) open the next user turn; no generation prompt (each user turn
 * ends with the assistant's opening). */
static void render_orion(struct sbuf *b, const struct chat_message *m, int n)
{
    int pending = -1, n_pending = 0;
    for (int i = 0; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        if (r == R_SYSTEM) {
            if (!n_pending++) pending = i;
        } else if (r == R_USER) {
            mark(b, "Human: ");
            if (n_pending) {
                size_t before = b->n;
                for (int k = pending; k < i; k++)
                    if (role_class(&m[k]) == R_SYSTEM) content(b, m[k].content, 0);
                if (b->n > before) mark(b, "\n\n");
                n_pending = 0;
            }
            content(b, m[i].content, 0);
            mark(b, "\n\nAssistant: </s>");
        } else {
            content(b, m[i].content, 0);
            mark(b, "</s>");
        }
    }
}

/* AlphaMonarch: BOS inside the history, before every message but the first. */
static void render_monarch(struct sbuf *b, const struct chat_message *m, int n, int add_gen)
{
    for (int i = 0; i < n; i++) {
        if (i) mark(b, "<s>");
        mark(b, role_of(&m[i]));
        mark(b, "\n");
        content(b, m[i].content, 0);
        mark(b, "</s>\n");
    }
    if (add_gen) mark(b, "<s>assistant\n");
}

/* RWKV World: the assistant's opening follows a user message that is the last one, whatever
 * add_gen says. */
static void render_rwkv(struct sbuf *b, const struct chat_message *m, int n)
{
    for (int i = 0; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        if (r == R_OTHER) continue;
        mark(b, r == R_SYSTEM ? "System: " : r == R_USER ? "User: " : "Assistant: ");
        content(b, m[i].content, 1);
        mark(b, "\n\n");
        if (r == R_USER && i == n - 1) mark(b, "Assistant:");
    }
}

/* GigaChat: a first system message goes right after <s>; later ones are dropped. */
static void render_gigachat(struct sbuf *b, const struct chat_message *m, int n, int add_gen)
{
    int i = 0;
    mark(b, "<s>");
    if (n && is_role(&m[0], "system")) {
        content(b, m[0].content, 0);
        mark(b, "<|message_sep|>");
        i = 1;
    }
    for (; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        if (r == R_USER) {
            mark(b, "user<|role_sep|>");
            content(b, m[i].content, 0);
            mark(b, "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>");
        } else if (r == R_ASSISTANT) {
            mark(b, "assistant<|role_sep|>");
            content(b, m[i].content, 0);
            mark(b, "<|message_sep|>");
        }
    }
    if (add_gen) mark(b, "assistant<|role_sep|>");
}

/* Hunyuan dense: a first system message is written bare; later ones are dropped; no
 * generation prompt (a user turn ends with the assistant's opening). */
static void render_hunyuan_dense(struct sbuf *b, const struct chat_message *m, int n)
{
    for (int i = 0; i < n; i++) {
        enum role_class r = role_class(&m[i]);
        if (i == 0 && r == R_SYSTEM) {
            content(b, m[i].content, 0);
            mark(b, "<｜hy_place▁holder▁no▁3｜>");
        }
        if (r == R_ASSISTANT) {
            mark(b, "<｜hy_Assistant｜>");
            content(b, m[i].content, 0);
            mark(b, "<｜hy_place▁holder▁no▁2｜>");
        } else if (r == R_USER) {
            mark(b, "<｜hy_User｜>");
            content(b, m[i].content, 0);
            mark(b, "<｜hy_Assistant｜>");
        }
    }
}

/* ---------------------------------------------------------------- rendering */

int chat_template_render_spans(enum chat_template t, const struct chat_message *m, int n,
                               int add_gen, struct chat_rendered *out)
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
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
        render_mistral(&b, t, m, n);
        break;
    case CHAT_GEMMA:
        render_gemma(&b, m, n, add_gen);
        break;
    case CHAT_ORION:
        render_orion(&b, m, n);
        break;
    case CHAT_MONARCH:
        render_monarch(&b, m, n, add_gen);
        break;
    case CHAT_RWKV_WORLD:
        render_rwkv(&b, m, n);
        break;
    case CHAT_GIGACHAT:
        render_gigachat(&b, m, n, add_gen);
        break;
    case CHAT_HUNYUAN_DENSE:
        render_hunyuan_dense(&b, m, n);
        break;
    default:
        if ((unsigned)t < CHAT_N_TEMPLATES && LAYOUTS[t].role[R_USER].pre)
            render_layout(&b, &LAYOUTS[t], m, n, add_gen);
        else
            render_plain(&b, m, n, add_gen);
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

char *chat_template_render(enum chat_template t, const struct chat_message *m, int n, int add_gen)
{
    struct chat_rendered r;
    if (chat_template_render_spans(t, m, n, add_gen, &r)) return NULL;
    free(r.spans);
    return r.text;
}
