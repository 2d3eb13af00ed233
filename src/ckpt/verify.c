/*
 * Checkpoint markers and folder verification (see verify.h): the marker's text at commit
 * (sizes and XXH3-64 checksums of every file), its range-checked reading, and the size and
 * checksum checks of a folder before anything is loaded from it.
 *
 * Invariant: a folder passes accel__ckpt_verify only if every file its marker lists is a
 * regular file whose size and (version >= 2) checksum are the recorded ones; the marker itself
 * is covered by its range checks (format, version, names, sizes, checksum syntax) and, from
 * version 2 on, by its own checksum.
 */
#include "ckpt/verify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* XXH3_64bits picks the widest vector unit of the running CPU (AVX2 / AVX-512): loading stays
 * bound by memory, not by the checksum. */
#include <xxh_x86dispatch.h>
#endif

#include "base/fs.h"
#include "base/parallel.h"
#include "core/internal.h"

/* ---- checksums ---- */

/*
 * A file's checksum: the file is cut into blocks of ACCEL__CKPT_BLOCK bytes (the last one
 * shorter, an empty file has one empty block); the checksum is the XXH3-64 of the
 * concatenated little-endian XXH3-64s of its blocks. Blocks hash in parallel on the CPUs this
 * process may run on (accel__parallel_for), so verifying a folder costs a fraction of reading
 * it.
 */
/* The marker's name for it ("checksum"). */
#define ACCEL__CKPT_CHECKSUM "xxh3-64/16MiB"
/* The marker's own checksum: XXH3-64 of the marker's bytes with this field's 16 digits as '0'. */
#define SELF_KEY "\"marker_xxh3\": \""

typedef struct mapped {
    const unsigned char *p; /* NULL for an empty file */
    size_t n;
    unsigned char *block_sums; /* 8 little-endian bytes per block */
} mapped;

/* Maps `path` read-only: a regular file, never through a planted link, never blocking on a
 * FIFO. */
static accel_status map_file(const char *path, mapped *m)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        return accel__seterr(NULL, errno == ENOENT ? ACCEL_ENOTFOUND : ACCEL_EIO,
                             "cannot open %s: %s", path, strerror(errno));
    }
    struct stat sb;
    accel_status st = ACCEL_OK;
    if (fstat(fd, &sb) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "%s is %s, not a regular file", path,
                           accel__file_kind(sb.st_mode));
    }
    m->n = st == ACCEL_OK ? (size_t)sb.st_size : 0;
    m->p = NULL;
    if (st == ACCEL_OK && m->n > 0) {
        /* Private and writable as accel_safetensors_open's, so a loader can take it over. */
        void *p = mmap(NULL, m->n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = accel__seterr(NULL, ACCEL_EIO, "cannot map %s: %s", path, strerror(errno));
        } else {
            (void)madvise(p, m->n, MADV_SEQUENTIAL); /* larger read-ahead when not cached */
            m->p = p;
        }
    }
    close(fd);
    size_t blocks = m->n / ACCEL__CKPT_BLOCK + 1;
    m->block_sums = st == ACCEL_OK ? accel__calloc(blocks, 8) : NULL;
    if (st == ACCEL_OK && m->block_sums == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    if (st != ACCEL_OK && m->p != NULL) {
        munmap((void *)m->p, m->n);
        m->p = NULL;
    }
    return st;
}

/* Block b of the list of mapped files m (ctx): file f, block k of it. */
static void hash_block(void *ctx, size_t b)
{
    mapped *m = ctx;
    size_t f = 0, k = b;
    while (k >= m[f].n / ACCEL__CKPT_BLOCK + 1) {
        k -= m[f].n / ACCEL__CKPT_BLOCK + 1;
        f++;
    }
    size_t off = k * ACCEL__CKPT_BLOCK;
    size_t len = m[f].n - off < ACCEL__CKPT_BLOCK ? m[f].n - off : ACCEL__CKPT_BLOCK;
    if (len > 0) {
        /* A file not in the page cache: ask for the whole block at once, so the threads do not
         * each fault their way through it (offsets are multiples of the block: page-aligned). */
        (void)madvise((void *)(m[f].p + off), len, MADV_WILLNEED);
    }
    uint64_t h = XXH3_64bits(m[f].p ? m[f].p + off : (const void *)"", len);
    for (int byte = 0; byte < 8; byte++) {
        m[f].block_sums[8 * k + (size_t)byte] = (unsigned char)(h >> (8 * byte));
    }
}

static void unmap_file(mapped *m)
{
    if (m->p != NULL) {
        munmap((void *)m->p, m->n);
    }
    accel__free(m->block_sums);
    memset(m, 0, sizeof(*m));
}

/* Checksums of n files (sums[i]; sizes[i] their sizes), all blocks in parallel. With `keep`,
 * keep[i] receives file i's mapping (owned; NULL for an empty file) instead of its unmapping. */
static accel_status checksum_files(char *const *paths, size_t n, uint64_t *sums, int64_t *sizes,
                                   void **keep)
{
    mapped *m = accel__calloc(n + 1, sizeof(*m));
    if (m == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    accel_status st = ACCEL_OK;
    size_t n_blocks = 0, nbytes = 0, mapped_n = 0;
    for (; st == ACCEL_OK && mapped_n < n; mapped_n++) {
        st = map_file(paths[mapped_n], &m[mapped_n]);
        n_blocks += m[mapped_n].n / ACCEL__CKPT_BLOCK + 1;
        nbytes += m[mapped_n].n;
    }
    if (st == ACCEL_OK) {
        accel__parallel_for(n_blocks, nbytes, hash_block, m);
        for (size_t f = 0; f < n; f++) {
            sums[f] = XXH3_64bits(m[f].block_sums, 8 * (m[f].n / ACCEL__CKPT_BLOCK + 1));
            sizes[f] = (int64_t)m[f].n;
            if (keep != NULL) {
                keep[f] = (void *)m[f].p;
                m[f].p = NULL;
            }
        }
    }
    for (size_t f = 0; f < mapped_n; f++) {
        unmap_file(&m[f]);
    }
    accel__free(m);
    return st;
}

static void hex64(char out[17], uint64_t v)
{
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* 16 lower-case hex digits at s (more may follow). */
static int parse_hex64_prefix(const char *s, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) {
            return 0;
        }
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

/* Exactly 16 lower-case hex digits. */
static int parse_hex64(const char *s, uint64_t *v)
{
    return s != NULL && strlen(s) == 16 && parse_hex64_prefix(s, v);
}

/* ---- writing ---- */

/* Files that belong to the folder: not the marker, not hidden, not an atomic write's leftover. */
static int listed_name(const char *name)
{
    return name[0] != '.' && strcmp(name, ACCEL__CKPT_MARKER) != 0 && strstr(name, ".tmp-") == NULL;
}

accel_status accel__ckpt_marker_build(const char *dir, const char *extra, char **text)
{
    json_t *root = json_object(), *files = json_object();
    accel_status st = (root && files) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    char **paths = NULL, **names = NULL;
    size_t n = 0, cap = 0;
    DIR *d = st == ACCEL_OK ? opendir(dir) : NULL;
    if (st == ACCEL_OK && d == NULL) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
        char *p = listed_name(e->d_name) ? accel__path_join(dir, e->d_name) : NULL;
        struct stat sb;
        if (p == NULL || lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            accel__free(p); /* not a file of the checkpoint */
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **np = accel__realloc(paths, cap * sizeof(char *));
            char **nn = np ? accel__realloc(names, cap * sizeof(char *)) : NULL;
            paths = np ? np : paths;
            names = nn ? nn : names;
            if (np == NULL || nn == NULL) {
                accel__free(p);
                st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building the marker");
                break;
            }
        }
        paths[n] = p;
        names[n] = accel__strdup(e->d_name);
        if (names[n++] == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building the marker");
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    uint64_t *sums = accel__calloc(n + 1, sizeof(uint64_t));
    int64_t *sizes = accel__calloc(n + 1, sizeof(int64_t));
    if (st == ACCEL_OK && (sums == NULL || sizes == NULL)) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building the marker");
    }
    if (st == ACCEL_OK) {
        st = checksum_files(paths, n, sums, sizes, NULL);
    }
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        char hex[17];
        hex64(hex, sums[i]);
        json_t *entry = json_pack("{s:I,s:s}", "nbytes", (json_int_t)sizes[i], "xxh3", hex);
        if (entry == NULL || json_object_set_new(files, names[i], entry) != 0) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building the marker");
        }
    }
    for (size_t i = 0; i < n; i++) {
        accel__free(paths[i]);
        accel__free(names[i]);
    }
    accel__free(paths);
    accel__free(names);
    accel__free(sums);
    accel__free(sizes);
    if (st == ACCEL_OK) {
        json_object_set_new(root, "format", json_string("accel-checkpoint"));
        json_object_set_new(root, "version", json_integer(ACCEL__CKPT_VERSION));
        json_object_set_new(root, "checksum", json_string(ACCEL__CKPT_CHECKSUM));
        json_object_set_new(root, "marker_xxh3", json_string("0000000000000000"));
        if (extra != NULL) {
            json_error_t jerr;
            json_t *x = json_loads(extra, 0, &jerr);
            if (x == NULL || !json_is_object(x)) {
                st = accel__seterr(NULL, ACCEL_EINTERNAL,
                                   "checkpoint marker extra is not a JSON object");
            } else {
                json_object_update(root, x);
            }
            json_decref(x);
        }
        json_object_set(root, "files", files);
    }
    json_decref(files);
    char *out = st == ACCEL_OK ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (st == ACCEL_OK && out == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory building the marker");
    }
    char *self = out != NULL ? strstr(out, SELF_KEY) : NULL;
    if (st == ACCEL_OK && self != NULL) {
        /* The marker covers itself: its fields (counts, iteration) are not in any file. */
        char hex[17];
        hex64(hex, XXH3_64bits(out, strlen(out)));
        memcpy(self + strlen(SELF_KEY), hex, 16);
        *text = out;
    }
    return st;
}

/* ---- reading ---- */

void accel__ckpt_marker_release(accel__ckpt_marker *m)
{
    for (size_t i = 0; m->files != NULL && i < m->n_files; i++) {
        accel__free(m->files[i].name);
        if (m->files[i].map != NULL) {
            munmap(m->files[i].map, m->files[i].map_nbytes);
        }
    }
    accel__free(m->files);
    memset(m, 0, sizeof(*m));
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const accel__ckpt_file *)a)->name, ((const accel__ckpt_file *)b)->name);
}

const accel__ckpt_file *accel__ckpt_marker_find(const accel__ckpt_marker *m, const char *name)
{
    accel__ckpt_file key = {.name = (char *)name};
    return m->n_files ? bsearch(&key, m->files, m->n_files, sizeof key, cmp_file) : NULL;
}

int accel__ckpt_marker_take_map(const accel__ckpt_marker *m, const char *name, void **map,
                                size_t *nbytes)
{
    /* The entries are the marker's own (non-const) array: handing over changes only the map. */
    accel__ckpt_file *f = m ? (accel__ckpt_file *)accel__ckpt_marker_find(m, name) : NULL;
    if (f == NULL || f->map == NULL) {
        return 0;
    }
    *map = f->map;
    *nbytes = f->map_nbytes;
    f->lent = f->map;
    f->lent_nbytes = f->map_nbytes;
    f->map = NULL;
    return 1;
}

/* A marker error: ACCEL_ECORRUPT naming the folder, the marker and the problem. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static accel_status
bad_marker(const char *dir, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: marker %s: %s", dir,
                         ACCEL__CKPT_MARKER, why);
}

/* One entry of "files": version 1 {name: nbytes}, version 2 {name: {"nbytes", "xxh3"}}. */
static accel_status read_entry(const char *dir, int version, const char *name, const json_t *v,
                               accel__ckpt_file *f)
{
    if (name[0] == '\0' || strchr(name, '/') != NULL || !listed_name(name) || strlen(name) > 255) {
        return bad_marker(dir, "\"%s\" is not a file name of a checkpoint folder", name);
    }
    const json_t *size = version == 1 ? v : json_object_get(v, "nbytes");
    if (version >= 2 && !json_is_object(v)) {
        return bad_marker(dir, "the entry of %s is not an object", name);
    }
    if (!json_is_integer(size) || json_integer_value(size) < 0) {
        return bad_marker(dir, "the size of %s is not a non-negative integer", name);
    }
    f->nbytes = (int64_t)json_integer_value(size);
    if (version >= 2 && !parse_hex64(json_string_value(json_object_get(v, "xxh3")), &f->xxh3)) {
        return bad_marker(dir, "the checksum of %s is not 16 hexadecimal digits", name);
    }
    f->name = accel__strdup(name);
    return f->name ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
}

static accel_status read_marker_json(const char *dir, json_t *root, accel__ckpt_marker *m)
{
    if (!json_is_object(root)) {
        return bad_marker(dir, "not a JSON object");
    }
    const char *format = json_string_value(json_object_get(root, "format"));
    if (format == NULL || strcmp(format, "accel-checkpoint") != 0) {
        return bad_marker(dir, "format is %s%s%s, expected \"accel-checkpoint\"",
                          format ? "\"" : "", format ? format : "missing", format ? "\"" : "");
    }
    const json_t *version = json_object_get(root, "version");
    if (!json_is_integer(version) || json_integer_value(version) < 1 ||
        json_integer_value(version) > ACCEL__CKPT_VERSION) {
        return bad_marker(dir, "version %s%lld is not one this accel reads (1 to %d)",
                          json_is_integer(version) ? "" : "(missing or not an integer) ",
                          json_is_integer(version) ? (long long)json_integer_value(version) : 0LL,
                          ACCEL__CKPT_VERSION);
    }
    m->version = (int)json_integer_value(version);
    m->has_checksums = m->version >= 2;
    const char *algo = json_string_value(json_object_get(root, "checksum"));
    if (m->has_checksums && (algo == NULL || strcmp(algo, ACCEL__CKPT_CHECKSUM) != 0)) {
        return bad_marker(dir, "checksum algorithm %s%s%s is not \"%s\"", algo ? "\"" : "",
                          algo ? algo : "missing", algo ? "\"" : "", ACCEL__CKPT_CHECKSUM);
    }
    const json_t *files = json_object_get(root, "files");
    if (!json_is_object(files) || json_object_size(files) == 0) {
        return bad_marker(dir, "the file list is %s", json_is_object(files) ? "empty" : "missing");
    }
    m->files = accel__calloc(json_object_size(files), sizeof(*m->files));
    if (m->files == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)files, name, v)
    {
        ACCEL_TRY(read_entry(dir, m->version, name, v, &m->files[m->n_files]));
        m->n_files++;
    }
    qsort(m->files, m->n_files, sizeof(*m->files), cmp_file);
    return ACCEL_OK;
}

/* The marker's own checksum (text: its bytes, writable). */
static accel_status check_self(const char *dir, char *text, size_t n)
{
    char *self = strstr(text, SELF_KEY);
    uint64_t want = 0;
    if (self == NULL || !parse_hex64_prefix(self + strlen(SELF_KEY), &want)) {
        return bad_marker(dir, "its own checksum (marker_xxh3) is missing or malformed");
    }
    memset(self + strlen(SELF_KEY), '0', 16);
    uint64_t got = XXH3_64bits(text, n);
    if (got != want) {
        return bad_marker(dir,
                          "the marker is damaged: its checksum is %016llx, marker_xxh3 says "
                          "%016llx",
                          (unsigned long long)got, (unsigned long long)want);
    }
    return ACCEL_OK;
}

accel_status accel__ckpt_marker_read(const char *dir, accel__ckpt_marker *m)
{
    memset(m, 0, sizeof(*m));
    if (!accel__is_dir(dir)) {
        return accel__seterr(NULL, ACCEL_ENOTFOUND, "checkpoint folder %s does not exist", dir);
    }
    char *mpath = accel__path_join(dir, ACCEL__CKPT_MARKER);
    if (mpath == NULL) {
        return ACCEL_ENOMEM;
    }
    char *text = NULL;
    size_t n = 0;
    accel_status st = accel__read_file(mpath, &text, &n);
    accel__free(mpath);
    if (st == ACCEL_ENOTFOUND) {
        return accel__seterr(NULL, ACCEL_ECORRUPT,
                             "%s is not a complete checkpoint: marker file %s is missing", dir,
                             ACCEL__CKPT_MARKER);
    }
    ACCEL_TRY(st);
    json_error_t jerr;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        accel__free(text);
        return bad_marker(dir, "not valid JSON (%s)", jerr.text);
    }
    st = read_marker_json(dir, root, m);
    json_decref(root);
    if (st == ACCEL_OK && m->has_checksums) {
        st = check_self(dir, text, n);
    }
    accel__free(text);
    if (st != ACCEL_OK) {
        accel__ckpt_marker_release(m);
    }
    return st;
}

/* ---- folders ---- */

/* One listed file is a regular file of the recorded size. */
static accel_status check_size(const char *dir, const accel__ckpt_file *f)
{
    char *p = accel__path_join(dir, f->name);
    if (p == NULL) {
        return ACCEL_ENOMEM;
    }
    struct stat sb;
    accel_status st = ACCEL_OK;
    int found = lstat(p, &sb) == 0;
    if (!found || !S_ISREG(sb.st_mode)) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT, "checkpoint %s: file %s is %s", dir, f->name,
                           found ? accel__file_kind(sb.st_mode) : "missing");
    } else if ((int64_t)sb.st_size != f->nbytes) {
        st = accel__seterr(NULL, ACCEL_ECORRUPT,
                           "checkpoint %s: file %s has %lld bytes, the marker says %lld", dir,
                           f->name, (long long)sb.st_size, (long long)f->nbytes);
    }
    accel__free(p);
    return st;
}

static int is_tensor_file(const char *name)
{
    size_t n = strlen(name), e = strlen(".safetensors");
    return n > e && strcmp(name + n - e, ".safetensors") == 0;
}

/* Maps a .safetensors file of the folder for the loader, its checksum deferred. */
static accel_status map_deferred(const char *dir, accel__ckpt_file *f)
{
    char *path = accel__path_join(dir, f->name);
    mapped mf;
    accel_status st = path ? map_file(path, &mf) : ACCEL_ENOMEM;
    accel__free(path);
    if (st == ACCEL_OK) {
        accel__free(mf.block_sums);
        if (mf.p != NULL) {
            /* Faulted in by the copies, as an unverified load's mapping (no read-ahead
             * advice: the pass is not this one's single sequential reader). */
            (void)madvise((void *)mf.p, mf.n, MADV_NORMAL);
        }
        f->map = (void *)mf.p; /* NULL for an empty file */
        f->map_nbytes = mf.n;
        f->deferred = 1;
    }
    return st;
}

/* The checksums of the listed files i with i % n_shares == share; with `keep`, their verified
 * mappings stay in the marker's entries. With `defer`, the .safetensors files (all of them,
 * whatever the share) are mapped and kept instead, their checksums deferred. */
static accel_status check_sums(const char *dir, accel__ckpt_marker *m, int share, int n_shares,
                               int keep, int defer)
{
    size_t n = 0;
    char **paths = accel__calloc(m->n_files, sizeof(char *));
    accel__ckpt_file **files = accel__calloc(m->n_files, sizeof(*files));
    uint64_t *sums = accel__calloc(m->n_files, sizeof(uint64_t));
    int64_t *sizes = accel__calloc(m->n_files, sizeof(int64_t));
    void **maps = keep ? accel__calloc(m->n_files, sizeof(void *)) : NULL;
    accel_status st = (paths && files && sums && sizes && (maps || !keep))
                          ? ACCEL_OK
                          : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    for (size_t i = 0; st == ACCEL_OK && i < m->n_files; i++) {
        if (defer && is_tensor_file(m->files[i].name)) {
            st = map_deferred(dir, &m->files[i]);
        } else if ((int)(i % (size_t)n_shares) == share) {
            files[n] = &m->files[i];
            paths[n] = accel__path_join(dir, m->files[i].name);
            st = paths[n++] ? ACCEL_OK : ACCEL_ENOMEM;
        }
    }
    if (st == ACCEL_OK) {
        st = checksum_files(paths, n, sums, sizes, maps);
    }
    for (size_t i = 0; st == ACCEL_OK && maps != NULL && i < n; i++) {
        files[i]->map = maps[i]; /* released with the marker, whatever follows */
        files[i]->map_nbytes = (size_t)sizes[i];
    }
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        if (sums[i] != files[i]->xxh3 || sizes[i] != files[i]->nbytes) {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "checkpoint %s: file %s is damaged: its checksum is %016llx, the "
                               "marker says %016llx",
                               dir, files[i]->name, (unsigned long long)sums[i],
                               (unsigned long long)files[i]->xxh3);
        }
    }
    for (size_t i = 0; paths != NULL && i < n; i++) {
        accel__free(paths[i]);
    }
    accel__free(paths);
    accel__free(files);
    accel__free(sums);
    accel__free(sizes);
    accel__free(maps);
    return st;
}

static accel_status verify(const char *dir, int share, int n_shares, accel__ckpt_marker *out,
                           int defer)
{
    accel__ckpt_marker m;
    ACCEL_TRY(accel__ckpt_marker_read(dir, &m));
    accel_status st = ACCEL_OK;
    for (size_t i = 0; st == ACCEL_OK && i < m.n_files; i++) {
        st = check_size(dir, &m.files[i]);
    }
    if (st == ACCEL_OK && m.has_checksums && n_shares > 0) {
        st = check_sums(dir, &m, share, n_shares, out != NULL, defer);
    }
    if (st == ACCEL_OK && !m.has_checksums && n_shares > 0 && share == 0) {
        accel__log(NULL, ACCEL__LOG_INFO,
                   "checkpoint %s has marker version 1 (written before checksums): its files "
                   "are checked for size only",
                   dir);
    }
    if (st != ACCEL_OK || out == NULL) {
        accel__ckpt_marker_release(&m);
    } else {
        *out = m;
    }
    return st;
}

accel_status accel__ckpt_verify(const char *dir, int share, int n_shares, accel__ckpt_marker *out)
{
    return verify(dir, share, n_shares, out, 0);
}

accel_status accel__ckpt_verify_deferred(const char *dir, int share, int n_shares,
                                         accel__ckpt_marker *m)
{
    return verify(dir, share, n_shares, m, 1);
}

accel_status accel__ckpt_check_complete(const char *dir)
{
    return accel__ckpt_verify(dir, 0, 0, NULL);
}
