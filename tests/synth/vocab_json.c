/* vocab_json: tokenizer.json / tekken -> GGUF tokenizer metadata. See vocab_json.h. */
#include "tests/synth/vocab_json.h"

#include "os/common/errmsg.h"
#include "serving/engine/convert.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_NORMAL  1
#define TT_CONTROL 3
#define TT_USER    4
#define TT_UNUSED  5
#define TT_BYTE    6

/* The llama-bpe and qwen2 pre-tokenizer regexes as tokenizer.json spells them. */
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The vocabulary being built. */
struct vb {
    int n;
    char **tok;
    int32_t *type;
    char **merges;
    int n_merges;
    float *scores; /* SentencePiece only */
    int spm;
    /* special ids by kind, -1 unset; add_* -1 unset */
    int ids[7];
    int add_bos, add_eos, add_sep;
    char *chat_template;
};

enum { SP_BOS, SP_EOS, SP_UNK, SP_SEP, SP_PAD, SP_CLS, SP_MASK };
static const char *const sp_name[7] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
static const char *const sp_key[7] = {
    "tokenizer.ggml.bos_token_id",     "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.padding_token_id", NULL, /* gguf-py has no cls key: skipped */
    "tokenizer.ggml.mask_token_id"};

static void vb_free(struct vb *v)
{
    for (int i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    for (int i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
    free(v->scores);
    free(v->chat_template);
}

static cJSON *read_json(const char *path, char *err)
{
    uint8_t *buf;
    size_t n;
    if (convert_read_file(path, &buf, &n, err) < 0) return NULL;
    cJSON *j = cJSON_ParseWithLength((const char *)buf, n);
    free(buf);
    if (!j) errmsg_set(err, "%s: not valid JSON", path);
    return j;
}

static int vb_alloc(struct vb *v, int n, char *err)
{
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->type = calloc((size_t)n, sizeof *v->type);
    for (int k = 0; k < 7; k++) v->ids[k] = -1;
    v->add_bos = v->add_eos = v->add_sep = -1;
    if (!v->tok || !v->type) return errmsg_set(err, "out of memory for %d tokens", n);
    return 0;
}

/* Ids that no token fills become "[PADi]", unused (convert_hf_to_gguf.py). */
static int vb_pad(struct vb *v, char *err)
{
    for (int i = 0; i < v->n; i++)
        if (!v->tok[i]) {
            char b[32];
            snprintf(b, sizeof b, "[PAD%d]", i);
            if (!(v->tok[i] = strdup(b))) return errmsg_set(err, "out of memory");
            v->type[i] = TT_UNUSED;
        }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face tokenizer.json */

/* convert_hf_to_gguf.py's does_token_look_special */
static int looks_special(const char *s)
{
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") ||
        !strcmp(s, "[@BOS@]"))
        return 1;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return 1;
    const char *fl = "<\xef\xbd\x9c", *fr = "\xef\xbd\x9c>"; /* <｜ ... ｜> */
    if (n >= 8 && !strncmp(s, fl, 4) && !strcmp(s + n - 4, fr)) return 1;
    if (n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>') return 1;
    return 0;
}

/* s with every U+2581 replaced by ' ' (user-defined tokens are pre-normalized). */
static char *unescape_spm(const char *s)
{
    char *o = malloc(strlen(s) + 1), *p = o;
    if (!o) return NULL;
    while (*s) {
        if (!strncmp(s, "\xe2\x96\x81", 3))
            *p++ = ' ', s += 3;
        else
            *p++ = *s++;
    }
    *p = 0;
    return o;
}

/* "a b" from the string or pair forms; spaces inside a part become U+0120. */
static char *merge_string(const cJSON *m)
{
    if (cJSON_IsString(m)) return strdup(m->valuestring);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2) return NULL;
    const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsString(a) || !cJSON_IsString(b)) return NULL;
    size_t n = 2 * (strlen(a->valuestring) + strlen(b->valuestring)) + 2;
    char *o = malloc(n), *p = o;
    if (!o) return NULL;
    for (int part = 0; part < 2; part++) {
        for (const char *s = part ? b->valuestring : a->valuestring; *s; s++)
            if (*s == ' ')
                *p++ = (char)0xC4, *p++ = (char)0xA0;
            else
                *p++ = *s;
        if (!part) *p++ = ' ';
    }
    *p = 0;
    return o;
}

/* The Split regex of the pre-tokenizer, or NULL. */
static const char *split_regex(const cJSON *pt)
{
    if (!pt) return NULL;
    const cJSON *type = cJSON_GetObjectItem(pt, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Split")) {
        const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(pt, "pattern"), "Regex");
        return cJSON_IsString(re) ? re->valuestring : NULL;
    }
    const cJSON *seq = cJSON_GetObjectItem(pt, "pretokenizers"), *it;
    cJSON_ArrayForEach(it, seq)
    {
        const char *r = split_regex(it);
        if (r) return r;
    }
    return NULL;
}

/* A special token entry of tokenizer_config.json: a string or {"content": ...}. */
static const char *entry_content(const cJSON *e)
{
    if (cJSON_IsString(e)) return e->valuestring;
    const cJSON *c = cJSON_GetObjectItem(e, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int added_id(const cJSON *added, const char *content)
{
    const cJSON *a;
    if (!content) return -1;
    cJSON_ArrayForEach(a, added)
    {
        const cJSON *c = cJSON_GetObjectItem(a, "content"), *id = cJSON_GetObjectItem(a, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, content))
            return id->valueint;
    }
    return -1;
}

static void set_id(struct vb *v, int kind, int id)
{
    if (id >= 0 && id < v->n && v->ids[kind] < 0) v->ids[kind] = id;
}

/* SpecialVocab: TemplateProcessing, then tokenizer_config.json, then config.json. */
static int special_vocab(struct vb *v, const cJSON *root, const struct vocab_json_opts *o,
                         char *err)
{
    const cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    cJSON *cfg = NULL, *mc = NULL;
    if (o->tokenizer_config && !(cfg = read_json(o->tokenizer_config, err))) return -1;
    const char *bos = entry_content(cJSON_GetObjectItem(cfg, "bos_token"));
    const char *eos = entry_content(cJSON_GetObjectItem(cfg, "eos_token"));
    const char *cls = entry_content(cJSON_GetObjectItem(cfg, "cls_token"));
    const cJSON *pp = cJSON_GetObjectItem(root, "post_processor"), *proc;
    const cJSON *procs = cJSON_GetObjectItem(pp, "processors");
    cJSON *one = NULL;
    if (pp && !procs) {
        one = cJSON_CreateArray();
        cJSON_AddItemReferenceToArray(one, (cJSON *)pp);
        procs = one;
    }
    cJSON_ArrayForEach(proc, procs)
    {
        const cJSON *type = cJSON_GetObjectItem(proc, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "TemplateProcessing")) continue;
        const cJSON *single = cJSON_GetObjectItem(proc, "single");
        int ns = cJSON_GetArraySize(single);
        if (ns <= 1) continue;
        const cJSON *f = cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(single, 0), "SpecialToken"), "id");
        const cJSON *l = cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(single, ns - 1), "SpecialToken"), "id");
        if (cJSON_IsString(f)) {
            if (!cfg) bos = f->valuestring;
            v->add_bos =
                (bos && !strcmp(f->valuestring, bos)) || (cls && !strcmp(f->valuestring, cls));
        }
        if (cJSON_IsString(l)) {
            if (!cfg) eos = l->valuestring;
            v->add_eos = eos && !strcmp(l->valuestring, eos);
        }
    }
    cJSON_Delete(one);
    if (cfg) {
        const cJSON *ct = cJSON_GetObjectItem(cfg, "chat_template");
        if (cJSON_IsString(ct) && !(v->chat_template = strdup(ct->valuestring))) goto oom;
        for (int k = 0; k < 7; k++) {
            char key[32];
            snprintf(key, sizeof key, "add_%s_token", sp_name[k]);
            const cJSON *a = cJSON_GetObjectItem(cfg, key);
            if (cJSON_IsBool(a)) {
                if (k == SP_BOS) v->add_bos = cJSON_IsTrue(a);
                if (k == SP_EOS) v->add_eos = cJSON_IsTrue(a);
                if (k == SP_SEP) v->add_sep = cJSON_IsTrue(a);
            }
            snprintf(key, sizeof key, "%s_token", sp_name[k]);
            const char *c = k == SP_BOS   ? bos
                            : k == SP_EOS ? eos
                                          : entry_content(cJSON_GetObjectItem(cfg, key));
            set_id(v, k, added_id(added, c));
        }
    }
    if (o->model_config) {
        if (!(mc = read_json(o->model_config, err))) goto fail;
        for (int k = 0; k < 7; k++) {
            char key[32];
            snprintf(key, sizeof key, "%s_token_id", sp_name[k]);
            const cJSON *id = cJSON_GetObjectItem(mc, key);
            if (cJSON_IsNumber(id)) set_id(v, k, id->valueint);
        }
    }
    cJSON_Delete(cfg);
    cJSON_Delete(mc);
    return 0;
oom:
    errmsg_set(err, "out of memory");
fail:
    cJSON_Delete(cfg);
    cJSON_Delete(mc);
    return -1;
}

static int from_hf(struct vb *v, const cJSON *root, const struct vocab_json_opts *o, char *pre,
                   char *err)
{
    const char *path = o->tokenizer;
    const cJSON *model = cJSON_GetObjectItem(root, "model");
    const cJSON *type = cJSON_GetObjectItem(model, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE"))
        return errmsg_set(err, "%s: model type is not BPE (only byte-level BPE is converted)",
                          path);
    int spm = cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback"));
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab"), *added;
    const cJSON *merges = cJSON_GetObjectItem(model, "merges"), *it;
    added = cJSON_GetObjectItem(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return errmsg_set(err, "%s: model.vocab or model.merges missing", path);
    int n = o->vocab_size;
    cJSON_ArrayForEach(it, vocab) if (cJSON_IsNumber(it) && it->valueint >= n) n = it->valueint + 1;
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = cJSON_GetObjectItem(it, "id");
        if (cJSON_IsNumber(id) && id->valueint >= n) n = id->valueint + 1;
    }
    int base = 0; /* the model's own vocabulary, before added tokens */
    cJSON_ArrayForEach(it, vocab) if (cJSON_IsNumber(it) && it->valueint >= base) base =
        it->valueint + 1;
    if (n <= 0 || n > (1 << 24)) return errmsg_set(err, "%s: %d tokens", path, n);
    if (vb_alloc(v, n, err) < 0) return -1;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valueint < 0) continue;
        free(v->tok[it->valueint]);
        if (!(v->tok[it->valueint] = strdup(it->string))) return errmsg_set(err, "out of memory");
        const char *t = it->string;
        v->type[it->valueint] =
            spm && strlen(t) == 6 && !strncmp(t, "<0x", 3) && t[5] == '>' ? TT_BYTE : TT_NORMAL;
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = cJSON_GetObjectItem(it, "id"), *c = cJSON_GetObjectItem(it, "content");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || !cJSON_IsString(c)) continue;
        int i = id->valueint;
        free(v->tok[i]);
        if (spm && i < base && cJSON_IsTrue(cJSON_GetObjectItem(it, "special"))) {
            v->tok[i] = strdup(c->valuestring); /* LlamaHfVocab: a special of the base vocabulary */
            v->type[i] = TT_CONTROL;
        } else if (cJSON_IsTrue(cJSON_GetObjectItem(it, "special")) ||
                   looks_special(c->valuestring)) {
            v->tok[i] = strdup(c->valuestring);
            v->type[i] = TT_CONTROL;
        } else {
            v->tok[i] = unescape_spm(c->valuestring);
            v->type[i] = TT_USER;
        }
        if (!v->tok[i]) return errmsg_set(err, "out of memory");
    }
    if (vb_pad(v, err) < 0) return -1;
    v->n_merges = cJSON_GetArraySize(merges);
    v->merges = calloc((size_t)v->n_merges + 1, sizeof *v->merges);
    if (!v->merges) return errmsg_set(err, "out of memory");
    int k = 0;
    cJSON_ArrayForEach(it, merges)
    {
        if (!(v->merges[k] = merge_string(it)))
            return errmsg_set(err, "%s: merge %d is neither \"a b\" nor [a, b]", path, k);
        k++;
    }
    if (spm) {
        /* SentencePiece numbers its pieces in the order it learned them and scores them the
         * same way (a Llama 2 tokenizer.model: piece i scores 259 - i), except runs of spaces,
         * which score -1e9 (merged last): a normal token scores so, as tokenizer.model would */
        v->scores = malloc((size_t)n * sizeof *v->scores);
        if (!v->scores) return errmsg_set(err, "out of memory");
        for (int i = 0; i < n; i++) {
            const char *t = v->tok[i];
            size_t l = strlen(t), k = 0;
            while (k + 3 <= l && !strncmp(t + k, "\xe2\x96\x81", 3)) k += 3;
            v->scores[i] = v->type[i] != TT_NORMAL ? 0 : k == l && l >= 6 ? -1e9f : -(float)i;
        }
        snprintf(pre, 32, "%s", o->pre ? o->pre : "default");
        v->spm = 1;
    } else if (o->pre)
        snprintf(pre, 32, "%s", o->pre);
    else {
        const char *re = split_regex(cJSON_GetObjectItem(root, "pre_tokenizer"));
        if (re && !strcmp(re, RE_LLAMA3))
            snprintf(pre, 32, "llama-bpe");
        else if (re && !strcmp(re, RE_QWEN2))
            snprintf(pre, 32, "qwen2");
        else
            return errmsg_set(err,
                              "%s: pre-tokenizer regex not recognised (llama-bpe, qwen2): "
                              "name one",
                              path);
    }
    return special_vocab(v, root, o, err);
}

/* ---------------------------------------------------------------------------------------------
 * Mistral tekken (js-tiktoken ranks) */

static int b64val(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decode base64 s[0..n) into out; returns the length or -1. */
static int b64dec(const char *s, size_t n, uint8_t *out)
{
    int o = 0, bits = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        int d = b64val((unsigned char)s[i]);
        if (d < 0) return -1;
        acc = acc << 6 | (uint32_t)d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return o;
}

struct rtok {
    uint8_t *b;
    int len;
};

/* bytes -> rank: open addressing over FNV-1a */
struct rmap {
    const struct rtok *t;
    int *slot;
    uint32_t mask;
};

static uint32_t fnv(const uint8_t *p, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static int rmap_find(const struct rmap *m, const uint8_t *p, int n)
{
    for (uint32_t i = fnv(p, n) & m->mask;; i = (i + 1) & m->mask) {
        int r = m->slot[i];
        if (r < 0) return -1;
        if (m->t[r].len == n && !memcmp(m->t[r].b, p, (size_t)n)) return r;
    }
}

/* The GPT-2 characters of bytes p[0..n) (NUL-terminated, malloc'd): printable Latin-1 bytes are
 * themselves, the other 68 U+0100.. in byte order. */
static char *gpt2_chars(const uint8_t *p, int n)
{
    static int cp_of[256];
    if (!cp_of['A'])
        for (int b = 0, next = 256; b < 256; b++)
            cp_of[b] =
                (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? b : next++;
    char *o = malloc(2 * (size_t)n + 1), *q = o;
    if (!o) return NULL;
    for (int i = 0; i < n; i++) {
        int cp = cp_of[p[i]];
        if (cp < 0x80)
            *q++ = (char)cp;
        else
            *q++ = (char)(0xC0 | cp >> 6), *q++ = (char)(0x80 | (cp & 0x3F));
    }
    *q = 0;
    return o;
}

struct split {
    int l, r;
};

static int by_parts(const void *a, const void *b)
{
    const struct split *x = a, *y = b;
    return x->l != y->l ? x->l - y->l : x->r - y->r;
}

static int from_tekken(struct vb *v, const cJSON *root, const struct vocab_json_opts *o, char *pre,
                       char *err)
{
    static const char *const specials[] = {"<unk>",
                                           "<s>",
                                           "</s>",
                                           "[INST]",
                                           "[/INST]",
                                           "[AVAILABLE_TOOLS]",
                                           "[/AVAILABLE_TOOLS]",
                                           "[TOOL_RESULTS]",
                                           "[/TOOL_RESULTS]",
                                           "[TOOL_CALLS]",
                                           "<pad>",
                                           "[PREFIX]",
                                           "[MIDDLE]",
                                           "[SUFFIX]"};
    const char *path = o->tokenizer;
    const cJSON *cfg = cJSON_GetObjectItem(root, "config");
    const cJSON *vs = cJSON_GetObjectItem(cfg, "default_vocab_size");
    const cJSON *ns = cJSON_GetObjectItem(cfg, "default_num_special_tokens");
    const cJSON *ranks = cJSON_GetObjectItem(root, "bpe_ranks");
    if (!cJSON_IsNumber(vs) || !cJSON_IsNumber(ns) || !cJSON_IsString(ranks) || ns->valueint < 14 ||
        vs->valueint <= ns->valueint || vs->valueint > (1 << 22))
        return errmsg_set(err, "%s: not a tekken file (config, bpe_ranks)", path);
    int nv = vs->valueint > o->vocab_size ? vs->valueint : o->vocab_size, nsp = ns->valueint;
    const char *s = ranks->valuestring;
    /* "! 0 tok0 tok1 ...": a key, the first rank, then base64 tokens */
    const char *p = strchr(s, ' ');
    p = p ? strchr(p + 1, ' ') : NULL;
    if (!p) return errmsg_set(err, "%s: bpe_ranks is not \"! 0 <tokens>\"", path);
    int cap = vs->valueint - nsp, nr = 0;
    struct rtok *t = calloc((size_t)cap, sizeof *t);
    struct rmap m = {t, NULL, 0};
    struct split *sp = NULL;
    int rc = -1;
    if (!t) return errmsg_set(err, "out of memory");
    for (p++; *p && nr < cap;) {
        const char *e = strchr(p, ' ');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        t[nr].b = malloc(n + 1);
        if (!t[nr].b || (t[nr].len = b64dec(p, n, t[nr].b)) <= 0) {
            errmsg_set(err, "%s: bpe_ranks token %d is not base64", path, nr);
            goto out;
        }
        nr++;
        p += n + (e ? 1 : 0);
    }
    uint32_t hc = 16;
    while (hc < 2u * (uint32_t)nr) hc <<= 1;
    m.slot = malloc(hc * sizeof *m.slot);
    if (!m.slot || vb_alloc(v, nv, err) < 0) goto oom;
    memset(m.slot, 0xff, hc * sizeof *m.slot);
    m.mask = hc - 1;
    for (int r = 0; r < nr; r++) {
        if (rmap_find(&m, t[r].b, t[r].len) >= 0) continue;
        uint32_t i = fnv(t[r].b, t[r].len) & m.mask;
        while (m.slot[i] >= 0) i = (i + 1) & m.mask;
        m.slot[i] = r;
    }
    for (int i = 0; i < nsp; i++) {
        char b[32];
        if (i < (int)(sizeof specials / sizeof specials[0]))
            snprintf(b, sizeof b, "%s", specials[i]);
        else
            snprintf(b, sizeof b, "<SPECIAL_%d>", i);
        if (!(v->tok[i] = strdup(b))) goto oom;
        v->type[i] = TT_CONTROL;
    }
    for (int r = 0; r < nr && nsp + r < nv; r++) {
        if (!(v->tok[nsp + r] = gpt2_chars(t[r].b, t[r].len))) goto oom;
        v->type[nsp + r] = TT_NORMAL;
    }
    if (vb_pad(v, err) < 0) goto out;
    /* merges: every split of a token into two tokens, by the token's rank, then the parts' */
    size_t mcap = 1024;
    v->merges = malloc(mcap * sizeof *v->merges);
    sp = malloc(256 * sizeof *sp);
    if (!v->merges || !sp) goto oom;
    for (int r = 0; r < nr; r++) {
        int k = 0;
        for (int i = 1; i < t[r].len && k < 256; i++) {
            int a = rmap_find(&m, t[r].b, i), b = rmap_find(&m, t[r].b + i, t[r].len - i);
            if (a >= 0 && b >= 0) sp[k++] = (struct split){a, b};
        }
        qsort(sp, (size_t)k, sizeof *sp, by_parts);
        for (int j = 0; j < k; j++) {
            if ((size_t)v->n_merges == mcap) {
                char **nm = realloc(v->merges, 2 * mcap * sizeof *nm);
                if (!nm) goto oom;
                v->merges = nm, mcap *= 2;
            }
            char *l = gpt2_chars(t[sp[j].l].b, t[sp[j].l].len);
            char *rr = gpt2_chars(t[sp[j].r].b, t[sp[j].r].len);
            char *mm = l && rr ? malloc(strlen(l) + strlen(rr) + 2) : NULL;
            if (mm) sprintf(mm, "%s %s", l, rr);
            free(l);
            free(rr);
            if (!mm) goto oom;
            v->merges[v->n_merges++] = mm;
        }
    }
    snprintf(pre, 32, "%s", o->pre ? o->pre : "tekken");
    v->ids[SP_UNK] = 0, v->ids[SP_BOS] = 1, v->ids[SP_EOS] = 2;
    v->add_bos = 1, v->add_eos = 0;
    rc = 0;
    goto out;
oom:
    errmsg_set(err, "out of memory");
out:
    for (int r = 0; r < nr; r++) free(t[r].b);
    free(t);
    free(m.slot);
    free(sp);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

int vocab_json_put(struct gguf_writer *w, const struct vocab_json_opts *o,
                   struct vocab_json_info *info, char *err)
{
    struct vb v = {0};
    char pre[32] = "";
    cJSON *root = read_json(o->tokenizer, err);
    if (!root) return -1;
    int rc = cJSON_GetObjectItem(root, "bpe_ranks") ? from_tekken(&v, root, o, pre, err)
                                                    : from_hf(&v, root, o, pre, err);
    cJSON_Delete(root);
    if (rc < 0) {
        vb_free(&v);
        return -1;
    }
    int e = 0;
    e |= gguf_w_str(w, "tokenizer.ggml.model", v.spm ? "llama" : "gpt2");
    e |= gguf_w_str(w, "tokenizer.ggml.pre", pre);
    e |= gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, (uint64_t)v.n);
    e |= gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, (uint64_t)v.n);
    if (v.spm)
        e |= gguf_w_arr_f32(w, "tokenizer.ggml.scores", v.scores, (uint64_t)v.n);
    else
        e |= gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges,
                            (uint64_t)v.n_merges);
    for (int k = 0; k < 7; k++)
        if (v.ids[k] >= 0 && sp_key[k]) e |= gguf_w_u32(w, sp_key[k], (uint32_t)v.ids[k]);
    uint8_t b;
    if (v.add_bos >= 0)
        b = (uint8_t)v.add_bos, e |= gguf_w_val(w, "tokenizer.ggml.add_bos_token", GGUF_BOOL, &b);
    if (v.add_eos >= 0)
        b = (uint8_t)v.add_eos, e |= gguf_w_val(w, "tokenizer.ggml.add_eos_token", GGUF_BOOL, &b);
    if (v.add_sep >= 0)
        b = (uint8_t)v.add_sep, e |= gguf_w_val(w, "tokenizer.ggml.add_sep_token", GGUF_BOOL, &b);
    if (v.chat_template) e |= gguf_w_str(w, "tokenizer.chat_template", v.chat_template);
    if (info) {
        info->n_vocab = v.n;
        snprintf(info->pre, sizeof info->pre, "%s", pre);
        info->bos = v.ids[SP_BOS];
        info->eos = v.ids[SP_EOS];
    }
    vb_free(&v);
    if (e) return errmsg_set(err, "out of memory writing the tokenizer keys");
    return 0;
}
