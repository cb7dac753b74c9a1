/* unicode: categories and llama.cpp's UTF-8 reading. See unicode.h for the contract. */
#include "serving/engine/unicode.h"

enum unicode_cat unicode_category(uint32_t cp)
{
    if (cp >= 0x110000) return UC_Cn;
    int lo = 0, hi = unicode_n_ranges - 1; /* ranges[lo].start <= cp < ranges[hi + 1].start */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (unicode_ranges[mid].start <= cp)
            lo = mid;
        else
            hi = mid - 1;
    }
    return (enum unicode_cat)unicode_ranges[lo].cat;
}

static int is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static unsigned flags_of_cat(enum unicode_cat c)
{
    switch (c) {
    case UC_Lu:
    case UC_Ll:
    case UC_Lt:
    case UC_Lm:
    case UC_Lo:
        return UF_LETTER;
    case UC_Nd:
    case UC_Nl:
    case UC_No:
        return UF_NUMBER;
    case UC_Mn:
    case UC_Mc:
    case UC_Me:
        return UF_MARK;
    case UC_Pc:
    case UC_Pd:
    case UC_Ps:
    case UC_Pe:
    case UC_Pi:
    case UC_Pf:
    case UC_Po:
        return UF_PUNCT;
    case UC_Sm:
    case UC_Sc:
    case UC_Sk:
    case UC_So:
        return UF_SYMBOL;
    default:
        return 0;
    }
}

/* ASCII is most text: its flags without a search. */
static unsigned ascii_flags(uint32_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return UF_LETTER;
    if (c >= '0' && c <= '9') return UF_NUMBER;
    if ((c >= 0x09 && c <= 0x0D) || c == ' ') return UF_SPACE;
    if (c < 0x20 || c == 0x7F) return 0;
    if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '`' ||
        c == '|' || c == '~')
        return UF_SYMBOL;
    return UF_PUNCT;
}

unsigned unicode_flags(uint32_t cp)
{
    if (cp < 0x80) return ascii_flags(cp);
    return flags_of_cat(unicode_category(cp)) | (is_white_space(cp) ? UF_SPACE : 0);
}

uint32_t unicode_decode(const uint8_t *s, size_t n, size_t *i)
{
    size_t k = *i;
    uint8_t b = s[k];
    int need;
    uint32_t cp;
    if (b < 0x80) {
        *i = k + 1;
        return b;
    }
    if ((b & 0xE0) == 0xC0)
        need = 1, cp = b & 0x1F;
    else if ((b & 0xF0) == 0xE0)
        need = 2, cp = b & 0x0F;
    else if ((b & 0xF8) == 0xF0)
        need = 3, cp = b & 0x07;
    else
        goto bad; /* a continuation byte or 0xF8..0xFF */
    if (n - k <= (size_t)need) goto bad;
    for (int j = 1; j <= need; j++) {
        if ((s[k + j] & 0xC0) != 0x80) goto bad;
        cp = cp << 6 | (s[k + j] & 0x3F);
    }
    /* llama.cpp throws (and aborts tokenizing) on values past U+10FFFF: here they are invalid */
    if (cp > 0x10FFFF) goto bad;
    *i = k + 1 + (size_t)need;
    return cp;
bad:
    *i = k + 1;
    return 0xFFFD;
}

int unicode_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18 & 0x07));
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}
