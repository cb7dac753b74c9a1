/* chat_template: turns chat messages into the prompt the model continues.
 *
 * A GGUF may carry tokenizer.chat_template, a Jinja program. Strata does not run Jinja: it
 * recognises the well-known templates by their markers, as llama.cpp's llm_chat_detect_template
 * does, and renders them as llama.cpp's llm_chat_apply_template does:
 *   "<|im_start|>"  chatml: <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   "[INST]"        llama2 and its variants, chosen by more markers ("content.strip()" ->
 *                   llama2-sys-strip, "bos_token + '[INST]" -> llama2-sys-bos, "<<SYS>>" ->
 *                   llama2-sys, else llama2):
 *                   [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]{assistant}</s>[INST] ...
 *                   (llama2 without -sys: "{system}\n" instead of the <<SYS>> block; -sys-bos:
 *                   "<s>[INST] " after an answer; -sys-strip: contents trimmed)
 *   "<|user|>"      zephyr: <|{role}|>\n{content}</s>\n ... <|assistant|>\n (as TinyLlama-Chat's
 *                   Jinja renders with eos_token </s>; llama.cpp would use <|endoftext|> here)
 * Mistral's [INST] templates are not told apart: they render as llama2 (llama.cpp has own
 * variants for them).
 * Anything else, and models without a template (stories260K), use the documented default:
 *   plain:          "System: {content}\n" "User: {content}\n" "Assistant: {content}\n" ...
 *                   then "Assistant:"
 * The BOS token is added by the tokenizer. chat_template_render_spans also tells which bytes are
 * the template's (markers: special-token pieces such as <|im_start|> or </s> in them become those
 * tokens when the vocabulary has them as special tokens) and which are message content (always
 * plain text, so a user cannot smuggle control tokens in). */
#ifndef STRATA_CHAT_TEMPLATE_H
#define STRATA_CHAT_TEMPLATE_H

#include "serving/api/api_request.h"

#include <stddef.h>

enum chat_template {
    CHAT_PLAIN,
    CHAT_LLAMA2,
    CHAT_CHATML,
    CHAT_ZEPHYR,
    CHAT_LLAMA2_SYS,
    CHAT_LLAMA2_SYS_BOS,
    CHAT_LLAMA2_SYS_STRIP,
    CHAT_N_TEMPLATES
};

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
/* malloc'd, NUL-terminated prompt text; NULL on out of memory. */
char *chat_template_render(enum chat_template t, const struct chat_message *m, int n);
/* The same text with its spans; 0, or -1 on out of memory. Free with chat_rendered_free. */
int chat_template_render_spans(enum chat_template t, const struct chat_message *m, int n,
                               struct chat_rendered *out);
void chat_rendered_free(struct chat_rendered *r);

#endif
