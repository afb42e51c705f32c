/* cpack.c - compact event records written from an array (scan.h: ct_cevent_pack), with the
 * shim's own encoder (cevent.h): what tests and tools/ use to write version-2 traces without a
 * second copy of the encoding. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cevent.h"
#include "scan.h"

uint64_t ct_cevent_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                        uint8_t *out, uint64_t cap)
{
    struct ct_ce_ctx *cx = NULL;
    uint64_t ncx = 0, len = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t th = threads ? threads[i] & 0x7fffffffu : 0;
        if (th >= ncx) {
            uint64_t m = (uint64_t)th + 16;
            struct ct_ce_ctx *c = realloc(cx, m * sizeof *c);
            if (!c) {
                free(cx);
                return UINT64_MAX;
            }
            memset(c + ncx, 0, (m - ncx) * sizeof *c);
            cx = c;
            ncx = m;
        }
        if (threads && threads[i] >> 31) /* a new thread takes this number */
            memset(&cx[th], 0, sizeof cx[th]);
        uint8_t body[CT_CE_MAX_BODY];
        uint32_t ref;
        uint32_t b = ct_ce_encode(&cx[th], th, &events[i], body, &ref);
        uint32_t size = (uint32_t)((sizeof(struct ct_rec_hdr) + b + 7) & ~(uint64_t)7);
        if (out && len + size <= cap) {
            struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_CEVENT, size};
            memcpy(out + len, &h, sizeof h);
            memcpy(out + len + sizeof h, body, b);
            memset(out + len + sizeof h + b, 0, size - sizeof h - b);
        }
        len += size;
        ct_ce_commit(&cx[th], &events[i], ref);
    }
    free(cx);
    return len;
}
