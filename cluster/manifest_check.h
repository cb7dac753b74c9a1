/* manifest_check: does a holder's manifest describe the model its GGUF header implies?
 *
 * A joiner plans the model from the received header (model_plan) and compares: the number of
 * spans, the image size, and every span's offset and size must be equal. err names the first
 * difference ("manifest does not match its GGUF header: span 3 is ..."). No transport here, so
 * the fuzz target links it alone. */
#ifndef STRATA_MANIFEST_CHECK_H
#define STRATA_MANIFEST_CHECK_H

#include "serving/engine/model.h"
#include "transport/wire.h"

int stream_loader_check_manifest(const struct model *m, const struct wire_manifest *man, char *err);

#endif
