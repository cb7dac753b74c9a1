/* ui_page: the operator's page served at GET / (serving/api/ui/: index.html with ui.css and ui.js
 * put in its place by the Makefile, build/gen/ui.html, embedded with .incbin): one
 * self-contained document that fetches only from the node that served it (docs/operations.md).
 * Built without it (the fuzz targets' archive), a one-line page says so. */
#ifndef STRATA_UI_PAGE_H
#define STRATA_UI_PAGE_H

#include <stddef.h>

const char *ui_page(size_t *len);

#endif
