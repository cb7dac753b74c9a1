#include "cluster/manifest_check.h"

#include "os/common/errmsg.h"

int stream_loader_check_manifest(const struct model *m, const struct wire_manifest *man, char *err)
{
    if ((uint32_t)m->n_spans != man->n_spans || m->image_size != man->image_size)
        return errmsg_set(err,
                          "manifest does not match its GGUF header: header implies %d spans / "
                          "%llu bytes, manifest says %u / %llu",
                          m->n_spans, (unsigned long long)m->image_size, man->n_spans,
                          (unsigned long long)man->image_size);
    for (int i = 0; i < m->n_spans; i++)
        if (m->spans[i].offset != man->span[i].offset || m->spans[i].size != man->span[i].size)
            return errmsg_set(
                err,
                "manifest does not match its GGUF header: span %d is [%llu, +%llu) "
                "in the header, [%llu, +%llu) in the manifest",
                i, (unsigned long long)m->spans[i].offset, (unsigned long long)m->spans[i].size,
                (unsigned long long)man->span[i].offset, (unsigned long long)man->span[i].size);
    return 0;
}
