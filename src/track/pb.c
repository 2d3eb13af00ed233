/*
 * Protobuf wire format (just what TensorBoard's Event / Summary records need) and CRC32C.
 *
 * The encoder writes fields in the order the caller appends them; nested messages are encoded
 * into their own buffer first and appended as length-delimited bytes, so no size has to be
 * predicted. The decoder walks fields and never reads past `end`: every length and varint is
 * checked before use, because event files may be truncated by a crash.
 */
#include <string.h>

#include "core/internal.h"
#include "track_internal.h"

/* ---- CRC32C: reflected Castagnoli polynomial, byte-at-a-time table ---- */

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[i] = c;
    }
    /* Publishing a fully built table is idempotent: two threads racing here write the same
     * values, so a plain flag after the loop is enough on the architectures we build for. */
    __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

uint32_t accel__crc32c(const void *data, size_t nbytes)
{
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) {
        crc_init();
    }
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < nbytes; i++) {
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}

uint32_t accel__crc32c_masked(const void *data, size_t nbytes)
{
    uint32_t c = accel__crc32c(data, nbytes);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- encoder ---- */

static void put(accel__pb *b, const void *src, size_t n)
{
    if (b->failed) {
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) {
            cap *= 2;
        }
        uint8_t *d = accel__realloc(b->data, cap);
        if (d == NULL) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
}

void accel__pb_reset(accel__pb *b)
{
    b->len = 0;
    b->failed = 0;
}

void accel__pb_free(accel__pb *b)
{
    accel__free(b->data);
    memset(b, 0, sizeof(*b));
}

void accel__pb_raw_varint(accel__pb *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        uint8_t byte = v & 0x7F;
        v >>= 7;
        tmp[n++] = byte | (v ? 0x80 : 0);
    } while (v);
    put(b, tmp, n);
}

static void key(accel__pb *b, uint32_t field, int wire)
{
    accel__pb_raw_varint(b, ((uint64_t)field << 3) | (uint64_t)wire);
}

void accel__pb_varint(accel__pb *b, uint32_t field, uint64_t v)
{
    key(b, field, ACCEL__PB_VARINT);
    accel__pb_raw_varint(b, v);
}

static void put_le(accel__pb *b, uint64_t bits, int n)
{
    uint8_t tmp[8];
    for (int i = 0; i < n; i++) {
        tmp[i] = (uint8_t)(bits >> (8 * i));
    }
    put(b, tmp, (size_t)n);
}

void accel__pb_double(accel__pb *b, uint32_t field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    key(b, field, ACCEL__PB_I64);
    put_le(b, bits, 8);
}

void accel__pb_float(accel__pb *b, uint32_t field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    key(b, field, ACCEL__PB_I32);
    put_le(b, bits, 4);
}

void accel__pb_bytes(accel__pb *b, uint32_t field, const void *data, size_t nbytes)
{
    key(b, field, ACCEL__PB_LEN);
    accel__pb_raw_varint(b, nbytes);
    put(b, data, nbytes);
}

void accel__pb_string(accel__pb *b, uint32_t field, const char *s)
{
    /* Protobuf readers reject a string field that is not UTF-8, and TensorBoard's reader then
     * stops at that event and reads nothing more of the file. A byte outside well-formed UTF-8
     * becomes the character of the same number (as the JSON files write it), two bytes long. */
    size_t n = 0, extra = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        extra += *p >= 0x80 && accel__utf8_len(p) == 0;
    }
    if (extra == 0) {
        accel__pb_bytes(b, field, s, n);
        return;
    }
    key(b, field, ACCEL__PB_LEN);
    accel__pb_raw_varint(b, n + extra);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80 && accel__utf8_len(p) == 0) {
            uint8_t two[2] = {(uint8_t)(0xc0 | (*p >> 6)), (uint8_t)(0x80 | (*p & 0x3f))};
            put(b, two, 2);
        } else {
            put(b, p, 1);
        }
    }
}

void accel__pb_message(accel__pb *b, uint32_t field, const accel__pb *msg)
{
    if (msg->failed) {
        b->failed = 1;
        return;
    }
    accel__pb_bytes(b, field, msg->data, msg->len);
}

/* ---- decoder ---- */

static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end) {
            return -1;
        }
        uint8_t byte = *(*p)++;
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1; /* more than 10 bytes */
}

int accel__pb_next(const uint8_t **p, const uint8_t *end, accel__pb_field *f)
{
    if (*p >= end) {
        return 0;
    }
    uint64_t k;
    if (get_varint(p, end, &k) != 0 || (k >> 3) == 0 || (k >> 3) > 0x1FFFFFFFu) {
        return -1;
    }
    memset(f, 0, sizeof(*f));
    f->field = (uint32_t)(k >> 3);
    f->wire = (int)(k & 7);
    switch (f->wire) {
    case ACCEL__PB_VARINT:
        return get_varint(p, end, &f->u) == 0 ? 1 : -1;
    case ACCEL__PB_I64:
    case ACCEL__PB_I32: {
        size_t n = f->wire == ACCEL__PB_I64 ? 8 : 4;
        if ((size_t)(end - *p) < n) {
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            f->u |= (uint64_t)(*p)[i] << (8 * i);
        }
        *p += n;
        return 1;
    }
    case ACCEL__PB_LEN: {
        uint64_t n;
        if (get_varint(p, end, &n) != 0 || n > (uint64_t)(end - *p)) {
            return -1;
        }
        f->data = *p;
        f->nbytes = (size_t)n;
        *p += n;
        return 1;
    }
    default:
        return -1; /* groups and unknown wire types do not occur in event files */
    }
}

double accel__pb_as_double(const accel__pb_field *f)
{
    double d;
    memcpy(&d, &f->u, 8);
    return d;
}

float accel__pb_as_float(const accel__pb_field *f)
{
    uint32_t bits = (uint32_t)f->u;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}
