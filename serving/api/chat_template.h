/* chat_template: turns chat messages into the prompt the model continues.
 *
 * A GGUF may carry tokenizer.chat_template, a Jinja program. Strata does not run Jinja: like
 * llama.cpp's built-in template support (src/llama-chat.cpp at 10e97801, its server's default
 * without --jinja), it recognises the known templates by marker strings, in llama.cpp's order
 * (llm_chat_detect_template: the whole string may also be a template's name), and renders each as
 * llama.cpp's llm_chat_apply_template does, byte for byte (tests/fixtures/chat/ holds llama.cpp's
 * own renderings of every template, checked by tests/unit/test_chat_template.c). The models people
 * run land here as:
 *   Llama 3.x          llama3    <|start_header_id|>{role}<|end_header_id|>\n\n{trimmed}<|eot_id|>
 *   Qwen2/2.5/3, QwQ   chatml    <|im_start|>{role}\n{content}<|im_end|>\n
 *   Mistral 7B v0.1    mistral-v1, Mistral v0.3: mistral-v3, Nemo: mistral-v3-tekken,
 *   Small 3.x/Large    mistral-v7 ([SYSTEM_PROMPT] ... [/SYSTEM_PROMPT][INST] ... [/INST])
 *   Llama 2 chat       llama2-sys-strip (and the llama2 variants)
 *   DeepSeek-R1 (Distill), V3: deepseek3; Gemma: gemma; Phi-3: phi3; Phi-4: phi4; ...
 * and every message ends as llama.cpp ends it; add_generation_prompt appends the opening of the
 * assistant's turn (llama.cpp's add_ass; some templates have none).
 * Where Strata differs, on purpose:
 *   - "developer" (OpenAI's newer name for system) is rendered as "system".
 *   - no template, or one llama.cpp does not know: the plain template ("System: ...\nUser: ...\n
 *     Assistant: ...\n" then "Assistant:") where llama.cpp's server would use chatml; stories
 *     models have no control tokens for chatml.
 *   - zephyr-eos: a template with <|user|> and <|assistant|> but no "</s>" that ends turns with
 *     eos_token (TinyLlama-Chat, zephyr-7b-beta) renders as its Jinja does, "<|{role}|>\n{content}
 *     </s>\n" ... "<|assistant|>\n"; llama.cpp picks glmedge there (no turn ends at all).
 * The BOS token is the tokenizer's to add (llama.cpp's templates never write it either; those
 * that write "<s>" inside the history do so here too). chat_template_render_spans also tells
 * which bytes are the template's (markers: the pieces of special tokens in them, such as
 * <|im_start|> or </s>, become those tokens) and which are message content (always plain text,
 * so a user cannot smuggle control tokens in; llama.cpp's server parses specials everywhere). */
#ifndef STRATA_CHAT_TEMPLATE_H
#define STRATA_CHAT_TEMPLATE_H

#include "serving/api/api_request.h"

#include <stddef.h>

/* Every template, with its name (llama.cpp's, except plain, zephyr-eos and dots1, which llama.cpp
 * detects but cannot name). */
#define CHAT_TEMPLATES(X)                                                                          \
    X(PLAIN, "plain")                                                                              \
    X(CHATML, "chatml")                                                                            \
    X(LLAMA2, "llama2")                                                                            \
    X(LLAMA2_SYS, "llama2-sys")                                                                    \
    X(LLAMA2_SYS_BOS, "llama2-sys-bos")                                                            \
    X(LLAMA2_SYS_STRIP, "llama2-sys-strip")                                                        \
    X(MISTRAL_V1, "mistral-v1")                                                                    \
    X(MISTRAL_V3, "mistral-v3")                                                                    \
    X(MISTRAL_V3_TEKKEN, "mistral-v3-tekken")                                                      \
    X(MISTRAL_V7, "mistral-v7")                                                                    \
    X(MISTRAL_V7_TEKKEN, "mistral-v7-tekken")                                                      \
    X(PHI3, "phi3")                                                                                \
    X(PHI4, "phi4")                                                                                \
    X(FALCON3, "falcon3")                                                                          \
    X(ZEPHYR, "zephyr")                                                                            \
    X(ZEPHYR_EOS, "zephyr-eos")                                                                    \
    X(MONARCH, "monarch")                                                                          \
    X(GEMMA, "gemma")                                                                              \
    X(ORION, "orion")                                                                              \
    X(OPENCHAT, "openchat")                                                                        \
    X(VICUNA, "vicuna")                                                                            \
    X(VICUNA_ORCA, "vicuna-orca")                                                                  \
    X(DEEPSEEK, "deepseek")                                                                        \
    X(DEEPSEEK2, "deepseek2")                                                                      \
    X(DEEPSEEK3, "deepseek3")                                                                      \
    X(COMMAND_R, "command-r")                                                                      \
    X(LLAMA3, "llama3")                                                                            \
    X(CHATGLM3, "chatglm3")                                                                        \
    X(CHATGLM4, "chatglm4")                                                                        \
    X(GLMEDGE, "glmedge")                                                                          \
    X(MINICPM, "minicpm")                                                                          \
    X(EXAONE3, "exaone3")                                                                          \
    X(EXAONE4, "exaone4")                                                                          \
    X(RWKV_WORLD, "rwkv-world")                                                                    \
    X(GRANITE, "granite")                                                                          \
    X(GIGACHAT, "gigachat")                                                                        \
    X(MEGREZ, "megrez")                                                                            \
    X(YANDEX, "yandex")                                                                            \
    X(BAILING, "bailing")                                                                          \
    X(BAILING_THINK, "bailing-think")                                                              \
    X(BAILING2, "bailing2")                                                                        \
    X(LLAMA4, "llama4")                                                                            \
    X(SMOLVLM, "smolvlm")                                                                          \
    X(DOTS1, "dots1")                                                                              \
    X(HUNYUAN_MOE, "hunyuan-moe")                                                                  \
    X(GPT_OSS, "gpt-oss")                                                                          \
    X(HUNYUAN_DENSE, "hunyuan-dense")                                                              \
    X(KIMI_K2, "kimi-k2")                                                                          \
    X(SEED_OSS, "seed_oss")                                                                        \
    X(GROK2, "grok-2")                                                                             \
    X(PANGU_EMBED, "pangu-embedded")

#define CHAT_TEMPLATE_ENUM(id, name) CHAT_##id,
enum chat_template { CHAT_TEMPLATES(CHAT_TEMPLATE_ENUM) CHAT_N_TEMPLATES };
#undef CHAT_TEMPLATE_ENUM

/* A run of the rendered text: template markers (marker = 1) or message content. */
struct chat_span {
    size_t off, len;
    int marker;
};

struct chat_rendered {
    char *text; /* NUL-terminated */
    size_t len;
    struct chat_span *spans;
    int n_spans;
};

/* Which template a GGUF tokenizer.chat_template (NULL/len 0: none) selects. */
enum chat_template chat_template_detect(const char *jinja, size_t len);
const char *chat_template_name(enum chat_template t);
/* The template of that name, or -1. */
int chat_template_from_name(const char *name);
/* malloc'd, NUL-terminated prompt text; NULL on out of memory. add_gen: end with the opening of
 * the assistant's turn (what a chat completion wants). */
char *chat_template_render(enum chat_template t, const struct chat_message *m, int n, int add_gen);
/* The same text with its spans; 0, or -1 on out of memory. Free with chat_rendered_free. */
int chat_template_render_spans(enum chat_template t, const struct chat_message *m, int n,
                               int add_gen, struct chat_rendered *out);
void chat_rendered_free(struct chat_rendered *r);

#endif
