/*
 * TFRecord framing for TensorBoard event files, and a strict reader of such files.
 *
 * A record is: uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes, the data,
 * uint32 masked CRC32C of the data. The reader checks both CRCs and every size before use and
 * decodes Event { wall_time = 1, step = 2, file_version = 3, summary = 5 } and
 * Summary.Value { tag = 1, simple_value = 2, tensor = 8 (string_val = 8), metadata = 9
 * (plugin_data = 1 (plugin_name = 1)) }, which is what our writer emits and what a test needs
 * to compare. Other fields are skipped.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "track_internal.h"

static void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

int accel__tfrecord_write(FILE *f, const void *data, size_t nbytes)
{
    uint8_t head[12], tail[4];
    le_put(head, nbytes, 8);
    le_put(head + 8, accel__crc32c_masked(head, 8), 4);
    le_put(tail, accel__crc32c_masked(data, nbytes), 4);
    if (fwrite(head, 1, 12, f) != 12 || fwrite(data, 1, nbytes, f) != nbytes ||
        fwrite(tail, 1, 4, f) != 4) {
        return -1;
    }
    return 0;
}

/* ---- reader ---- */

/* Copies a LEN field into a NUL-terminated string owned by the caller's buffer. */
static char *dup_field(const accel__pb_field *f)
{
    char *s = accel__malloc(f->nbytes + 1);
    if (s != NULL) {
        memcpy(s, f->data, f->nbytes);
        s[f->nbytes] = '\0';
    }
    return s;
}

/* Decodes one Summary.Value into v (strings allocated into the out-pointers). */
static int decode_value(const uint8_t *p, const uint8_t *end, accel__tf_value *v, char **tag,
                        char **plugin, char **text)
{
    accel__pb_field f;
    int r;
    while ((r = accel__pb_next(&p, end, &f)) == 1) {
        if (f.field == 1 && f.wire == ACCEL__PB_LEN) {
            accel__free(*tag);
            *tag = dup_field(&f);
        } else if (f.field == 2 && f.wire == ACCEL__PB_I32) {
            v->has_simple = 1;
            v->simple_value = accel__pb_as_float(&f);
        } else if (f.field == 8 && f.wire == ACCEL__PB_LEN) {
            const uint8_t *q = f.data, *qe = f.data + f.nbytes;
            accel__pb_field g;
            int rr;
            while ((rr = accel__pb_next(&q, qe, &g)) == 1) {
                if (g.field == 8 && g.wire == ACCEL__PB_LEN && *text == NULL) {
                    *text = dup_field(&g);
                }
            }
            if (rr < 0) {
                return -1;
            }
        } else if (f.field == 9 && f.wire == ACCEL__PB_LEN) {
            const uint8_t *q = f.data, *qe = f.data + f.nbytes;
            accel__pb_field g, h;
            int rr;
            while ((rr = accel__pb_next(&q, qe, &g)) == 1) {
                if (g.field != 1 || g.wire != ACCEL__PB_LEN) {
                    continue;
                }
                const uint8_t *s = g.data, *se = g.data + g.nbytes;
                int r3;
                while ((r3 = accel__pb_next(&s, se, &h)) == 1) {
                    if (h.field == 1 && h.wire == ACCEL__PB_LEN) {
                        accel__free(*plugin);
                        *plugin = dup_field(&h);
                    }
                }
                if (r3 < 0) {
                    return -1;
                }
            }
            if (rr < 0) {
                return -1;
            }
        }
    }
    return r;
}

static accel_status decode_event(const char *path, long off, const uint8_t *p, const uint8_t *end,
                                 accel__tf_visit visit, void *ctx)
{
    double wall = 0;
    long long step = 0;
    const uint8_t *summary = NULL;
    size_t summary_nbytes = 0;
    char *version = NULL;
    int session_start = 0;
    accel__pb_field f;
    int r;
    while ((r = accel__pb_next(&p, end, &f)) == 1) {
        if (f.field == 1 && f.wire == ACCEL__PB_I64) {
            wall = accel__pb_as_double(&f);
        } else if (f.field == 2 && f.wire == ACCEL__PB_VARINT) {
            step = (long long)f.u;
        } else if (f.field == 3 && f.wire == ACCEL__PB_LEN) {
            accel__free(version);
            version = dup_field(&f);
        } else if (f.field == 5 && f.wire == ACCEL__PB_LEN) {
            summary = f.data;
            summary_nbytes = f.nbytes;
        } else if (f.field == 7 && f.wire == ACCEL__PB_LEN) { /* SessionLog */
            const uint8_t *q = f.data;
            accel__pb_field g;
            while ((r = accel__pb_next(&q, f.data + f.nbytes, &g)) == 1) {
                session_start |= g.field == 1 && g.wire == ACCEL__PB_VARINT && g.u == 1;
            }
            if (r < 0) {
                break;
            }
        }
    }
    if (r < 0) {
        accel__free(version);
        return accel__seterr(NULL, ACCEL_ECORRUPT, "%s: malformed Event protobuf at offset %ld",
                             path, off);
    }
    if (version != NULL) {
        int stop = visit(ctx, version, NULL);
        accel__free(version);
        if (stop) {
            return accel__seterr(NULL, ACCEL_EINTERNAL, "%s: reader callback stopped", path);
        }
    }
    if (session_start) {
        accel__tf_value v = {
            .wall_time = wall, .step = step, .tag = "", .plugin = "", .session_start = 1};
        if (visit(ctx, NULL, &v)) {
            return accel__seterr(NULL, ACCEL_EINTERNAL, "%s: reader callback stopped", path);
        }
    }
    if (summary == NULL) {
        return ACCEL_OK;
    }
    const uint8_t *s = summary, *se = summary + summary_nbytes;
    while ((r = accel__pb_next(&s, se, &f)) == 1) {
        if (f.field != 1 || f.wire != ACCEL__PB_LEN) {
            continue;
        }
        accel__tf_value v;
        memset(&v, 0, sizeof(v));
        v.wall_time = wall;
        v.step = step;
        char *tag = NULL, *plugin = NULL, *text = NULL;
        int rv = decode_value(f.data, f.data + f.nbytes, &v, &tag, &plugin, &text);
        int stop = 0;
        if (rv == 0) {
            v.tag = tag ? tag : "";
            v.plugin = plugin ? plugin : "";
            v.text = text;
            stop = visit(ctx, NULL, &v);
        }
        accel__free(tag);
        accel__free(plugin);
        accel__free(text);
        if (rv < 0) {
            return accel__seterr(NULL, ACCEL_ECORRUPT, "%s: malformed Summary.Value at offset %ld",
                                 path, off);
        }
        if (stop) {
            return accel__seterr(NULL, ACCEL_EINTERNAL, "%s: reader callback stopped", path);
        }
    }
    if (r < 0) {
        return accel__seterr(NULL, ACCEL_ECORRUPT, "%s: malformed Summary at offset %ld", path,
                             off);
    }
    return ACCEL_OK;
}

accel_status accel__tfevents_read(const char *path, accel__tf_visit visit, void *ctx)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot open event file %s: %s", path,
                             strerror(errno));
    }
    accel_status st = ACCEL_OK;
    uint8_t *data = NULL;
    size_t cap = 0;
    for (;;) {
        long off = ftell(f);
        uint8_t head[12], tail[4];
        size_t got = fread(head, 1, 12, f);
        if (got == 0) {
            break; /* clean end of file */
        }
        if (got != 12) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT, "%s: truncated record header at offset %ld",
                               path, off);
            break;
        }
        uint64_t n = le_get(head, 8);
        if ((uint32_t)le_get(head + 8, 4) != accel__crc32c_masked(head, 8)) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT, "%s: bad length CRC at offset %ld", path, off);
            break;
        }
        if (n > (64u << 20)) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "%s: record of %llu bytes at offset %ld is implausibly large", path,
                               (unsigned long long)n, off);
            break;
        }
        if (n > cap) {
            uint8_t *d = accel__realloc(data, (size_t)n);
            if (d == NULL) {
                st = accel__seterr(NULL, ACCEL_ENOMEM, "%s: out of memory", path);
                break;
            }
            data = d;
            cap = (size_t)n;
        }
        if (fread(data, 1, (size_t)n, f) != n || fread(tail, 1, 4, f) != 4) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT, "%s: truncated record at offset %ld", path,
                               off);
            break;
        }
        if ((uint32_t)le_get(tail, 4) != accel__crc32c_masked(data, (size_t)n)) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT, "%s: bad data CRC at offset %ld", path, off);
            break;
        }
        st = decode_event(path, off, data, data + n, visit, ctx);
        if (st != ACCEL_OK) {
            break;
        }
    }
    accel__free(data);
    fclose(f);
    return st;
}
