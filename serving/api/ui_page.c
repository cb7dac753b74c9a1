/* ui_page: the page's bytes, embedded at build time (build/gen/ui.html; see ui_page.h). */
#include "serving/api/ui_page.h"

#ifdef STRATA_UI_PAGE
__asm__(".section .rodata.strata_ui_page,\"a\",@progbits\n"
        ".globl strata_ui_page_start\n"
        "strata_ui_page_start:\n"
        ".incbin \"" STRATA_UI_PAGE "\"\n"
        ".globl strata_ui_page_end\n"
        "strata_ui_page_end:\n"
        ".byte 0\n"
        ".previous\n");
extern const char strata_ui_page_start[], strata_ui_page_end[];

const char *ui_page(size_t *len)
{
    *len = (size_t)(strata_ui_page_end - strata_ui_page_start);
    return strata_ui_page_start;
}
#else
const char *ui_page(size_t *len)
{
    static const char page[] = "<!doctype html><title>Strata</title><p>This binary was built "
                               "without the operator's page.</p>\n";
    *len = sizeof page - 1;
    return page;
}
#endif
