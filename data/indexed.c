/* indexed.c - Megatron indexed dataset writer and mmap reader (see indexed.h). */
#include "indexed.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------- */

/* Records a message on `err` (may be NULL) and returns `s`. */
static mgc_data_status fail(mgc_data_error *err, mgc_data_status s, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return s;
}

const char *mgc_data_status_name(mgc_data_status s) {
    switch (s) {
    case MGC_DATA_OK:
        return "ok";
    case MGC_DATA_ERR_IO:
        return "i/o error";
    case MGC_DATA_ERR_FORMAT:
        return "bad format";
    case MGC_DATA_ERR_INVALID:
        return "invalid argument";
    case MGC_DATA_ERR_NOMEM:
        return "out of memory";
    }
    return "unknown status";
}

/* ---- dtypes ------------------------------------------------------------- */

int64_t mgc_data_dtype_bytes(int dtype) {
    switch (dtype) {
    case MGC_DTYPE_UINT8:
    case MGC_DTYPE_INT8:
        return 1;
    case MGC_DTYPE_INT16:
    case MGC_DTYPE_UINT16:
        return 2;
    case MGC_DTYPE_INT32:
    case MGC_DTYPE_FLOAT32:
        return 4;
    case MGC_DTYPE_INT64:
    case MGC_DTYPE_FLOAT64:
        return 8;
    }
    return 0;
}

const char *mgc_data_dtype_name(int dtype) {
    switch (dtype) {
    case MGC_DTYPE_UINT8:
        return "uint8";
    case MGC_DTYPE_INT8:
        return "int8";
    case MGC_DTYPE_INT16:
        return "int16";
    case MGC_DTYPE_INT32:
        return "int32";
    case MGC_DTYPE_INT64:
        return "int64";
    case MGC_DTYPE_FLOAT64:
        return "float64";
    case MGC_DTYPE_FLOAT32:
        return "float32";
    case MGC_DTYPE_UINT16:
        return "uint16";
    }
    return "unknown";
}

mgc_data_dtype mgc_data_dtype_for_vocab(int64_t vocab_size) {
    return vocab_size < 65500 ? MGC_DTYPE_UINT16 : MGC_DTYPE_INT32;
}

static int dtype_is_integer(int dtype) {
    return mgc_data_dtype_bytes(dtype) != 0 && dtype != MGC_DTYPE_FLOAT32 &&
           dtype != MGC_DTYPE_FLOAT64;
}

/* Little-endian codecs: byte by byte, so neither host order nor alignment matters. */
static uint64_t get_le(const unsigned char *p, int n_bytes) {
    uint64_t v = 0;
    for (int i = n_bytes - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static void put_le(unsigned char *p, uint64_t v, int n_bytes) {
    for (int i = 0; i < n_bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Token value -> stored bytes; 0 when it does not fit. */
static int encode_token(int dtype, int32_t t, unsigned char *p) {
    switch (dtype) {
    case MGC_DTYPE_UINT8:
        if (t < 0 || t > 255) return 0;
        break;
    case MGC_DTYPE_INT8:
        if (t < -128 || t > 127) return 0;
        break;
    case MGC_DTYPE_INT16:
        if (t < -32768 || t > 32767) return 0;
        break;
    case MGC_DTYPE_UINT16:
        if (t < 0 || t > 65535) return 0;
        break;
    default:
        break;
    }
    put_le(p, (uint64_t)(int64_t)t, (int)mgc_data_dtype_bytes(dtype));
    return 1;
}

/* Stored bytes -> int64 token value (sign-extended for signed dtypes). */
static int64_t decode_token(int dtype, const unsigned char *p) {
    switch (dtype) {
    case MGC_DTYPE_UINT8:
        return p[0];
    case MGC_DTYPE_INT8:
        return (int8_t)p[0];
    case MGC_DTYPE_UINT16:
        return (int64_t)get_le(p, 2);
    case MGC_DTYPE_INT16:
        return (int16_t)(uint16_t)get_le(p, 2);
    case MGC_DTYPE_INT32:
        return (int32_t)(uint32_t)get_le(p, 4);
    case MGC_DTYPE_INT64:
        return (int64_t)get_le(p, 8);
    }
    return 0;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct i64_vec {
    int64_t *v; /* (cap) */
    int64_t n;  /* used */
    int64_t cap;
} i64_vec;

static int vec_push(i64_vec *a, int64_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 1024;
        int64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return 0;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 1;
}

struct mgc_indexed_writer {
    char *prefix;              /* output prefix */
    char *bin_tmp, *idx_tmp;   /* PREFIX.bin.tmp, PREFIX.idx.tmp */
    char *bin_path, *idx_path; /* final names */
    FILE *bin;                 /* open on bin_tmp */
    mgc_data_dtype dtype;      /* token dtype */
    int64_t item_bytes;        /* bytes per token */
    int64_t bin_bytes;         /* bytes written to .bin so far */
    i64_vec lengths;           /* (N) tokens per sequence */
    i64_vec pointers;          /* (N) byte offset of each sequence */
    i64_vec doc_indices;       /* (documents + 1) starts with 0 */
    unsigned char *buf;        /* staging buffer for encoding */
    size_t buf_bytes;          /* its size */
};

static char *cat(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) {
        memcpy(s, a, na);
        memcpy(s + na, b, nb + 1);
    }
    return s;
}

void mgc_indexed_writer_free(mgc_indexed_writer *w) {
    if (!w) return;
    if (w->bin) fclose(w->bin);
    if (w->bin_tmp) remove(w->bin_tmp);
    if (w->idx_tmp) remove(w->idx_tmp);
    free(w->prefix);
    free(w->bin_tmp);
    free(w->idx_tmp);
    free(w->bin_path);
    free(w->idx_path);
    free(w->lengths.v);
    free(w->pointers.v);
    free(w->doc_indices.v);
    free(w->buf);
    free(w);
}

mgc_data_status mgc_indexed_writer_open(mgc_indexed_writer **out, const char *prefix,
                                        mgc_data_dtype dtype, mgc_data_error *err) {
    *out = NULL;
    if (!dtype_is_integer(dtype))
        return fail(err, MGC_DATA_ERR_INVALID,
                    "%s: dtype code %d is not an integer token dtype (hint: use uint16 or int32)",
                    prefix, (int)dtype);
    mgc_indexed_writer *w = calloc(1, sizeof *w);
    if (!w) return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", prefix);
    w->dtype = dtype;
    w->item_bytes = mgc_data_dtype_bytes(dtype);
    w->prefix = cat(prefix, "");
    w->bin_tmp = cat(prefix, ".bin.tmp");
    w->idx_tmp = cat(prefix, ".idx.tmp");
    w->bin_path = cat(prefix, ".bin");
    w->idx_path = cat(prefix, ".idx");
    if (!w->prefix || !w->bin_tmp || !w->idx_tmp || !w->bin_path || !w->idx_path ||
        !vec_push(&w->doc_indices, 0)) {
        mgc_indexed_writer_free(w);
        return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", prefix);
    }
    w->bin = fopen(w->bin_tmp, "wb");
    if (!w->bin) {
        mgc_data_status s = fail(err, MGC_DATA_ERR_IO,
                                 "%s: cannot create: %s (hint: does the directory exist and is it "
                                 "writable?)",
                                 w->bin_tmp, strerror(errno));
        free(w->bin_tmp); /* not ours to remove */
        w->bin_tmp = NULL;
        mgc_indexed_writer_free(w);
        return s;
    }
    *out = w;
    return MGC_DATA_OK;
}

mgc_data_status mgc_indexed_writer_add_sequence(mgc_indexed_writer *w, const int32_t *tokens,
                                                int64_t n_tokens, mgc_data_error *err) {
    if (n_tokens < 0 || n_tokens > INT32_MAX)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "%s: sequence of %lld tokens does not fit the int32 length field", w->bin_tmp,
                    (long long)n_tokens);
    const size_t chunk = 1 << 16;
    if (!w->buf) {
        w->buf_bytes = chunk * (size_t)w->item_bytes;
        w->buf = malloc(w->buf_bytes);
        if (!w->buf) return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", w->bin_tmp);
    }
    for (int64_t i = 0; i < n_tokens;) {
        size_t k = 0;
        for (; k < chunk && i < n_tokens; k++, i++)
            if (!encode_token(w->dtype, tokens[i], w->buf + k * (size_t)w->item_bytes))
                return fail(err, MGC_DATA_ERR_INVALID,
                            "%s: token %ld at position %lld does not fit %s (hint: a larger "
                            "dtype, e.g. int32 for vocabularies of 65500 or more)",
                            w->bin_tmp, (long)tokens[i], (long long)i,
                            mgc_data_dtype_name(w->dtype));
        if (fwrite(w->buf, (size_t)w->item_bytes, k, w->bin) != k)
            return fail(err, MGC_DATA_ERR_IO, "%s: write failed: %s (hint: disk full?)", w->bin_tmp,
                        strerror(errno));
    }
    if (!vec_push(&w->lengths, n_tokens) || !vec_push(&w->pointers, w->bin_bytes))
        return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", w->bin_tmp);
    w->bin_bytes += n_tokens * w->item_bytes;
    return MGC_DATA_OK;
}

mgc_data_status mgc_indexed_writer_end_document(mgc_indexed_writer *w, mgc_data_error *err) {
    if (!vec_push(&w->doc_indices, w->lengths.n))
        return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", w->bin_tmp);
    return MGC_DATA_OK;
}

mgc_data_status mgc_indexed_writer_add_document(mgc_indexed_writer *w, const int32_t *tokens,
                                                int64_t n_tokens, mgc_data_error *err) {
    mgc_data_status s = mgc_indexed_writer_add_sequence(w, tokens, n_tokens, err);
    return s ? s : mgc_indexed_writer_end_document(w, err);
}

/* Writes the .idx to w->idx_tmp. */
static mgc_data_status write_idx(mgc_indexed_writer *w, mgc_data_error *err) {
    FILE *f = fopen(w->idx_tmp, "wb");
    if (!f) return fail(err, MGC_DATA_ERR_IO, "%s: cannot create: %s", w->idx_tmp, strerror(errno));
    unsigned char h[MGC_INDEXED_HEADER_BYTES];
    memcpy(h, MGC_INDEXED_MAGIC, MGC_INDEXED_MAGIC_BYTES);
    put_le(h + 9, MGC_INDEXED_VERSION, 8);
    h[17] = (unsigned char)w->dtype;
    put_le(h + 18, (uint64_t)w->lengths.n, 8);
    put_le(h + 26, (uint64_t)w->doc_indices.n, 8);
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    unsigned char b[8];
    for (int64_t i = 0; ok && i < w->lengths.n; i++) {
        put_le(b, (uint64_t)w->lengths.v[i], 4);
        ok = fwrite(b, 1, 4, f) == 4;
    }
    for (int64_t i = 0; ok && i < w->pointers.n; i++) {
        put_le(b, (uint64_t)w->pointers.v[i], 8);
        ok = fwrite(b, 1, 8, f) == 8;
    }
    for (int64_t i = 0; ok && i < w->doc_indices.n; i++) {
        put_le(b, (uint64_t)w->doc_indices.v[i], 8);
        ok = fwrite(b, 1, 8, f) == 8;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok)
        return fail(err, MGC_DATA_ERR_IO, "%s: write failed: %s (hint: disk full?)", w->idx_tmp,
                    strerror(errno));
    return MGC_DATA_OK;
}

mgc_data_status mgc_indexed_writer_finish(mgc_indexed_writer *w, mgc_data_error *err) {
    mgc_data_status s = MGC_DATA_OK;
    /* sequences after the last end_document close one more document */
    if (w->doc_indices.v[w->doc_indices.n - 1] != w->lengths.n)
        s = mgc_indexed_writer_end_document(w, err);
    if (!s) {
        int ok = fflush(w->bin) == 0 && fsync(fileno(w->bin)) == 0;
        if (fclose(w->bin) != 0) ok = 0;
        w->bin = NULL;
        if (!ok)
            s = fail(err, MGC_DATA_ERR_IO, "%s: write failed: %s (hint: disk full?)", w->bin_tmp,
                     strerror(errno));
    }
    if (!s) s = write_idx(w, err);
    if (!s && rename(w->bin_tmp, w->bin_path) != 0)
        s = fail(err, MGC_DATA_ERR_IO, "%s: cannot rename to %s: %s", w->bin_tmp, w->bin_path,
                 strerror(errno));
    if (!s && rename(w->idx_tmp, w->idx_path) != 0)
        s = fail(err, MGC_DATA_ERR_IO, "%s: cannot rename to %s: %s", w->idx_tmp, w->idx_path,
                 strerror(errno));
    if (!s) { /* both renamed: nothing left to clean up */
        free(w->bin_tmp);
        free(w->idx_tmp);
        w->bin_tmp = w->idx_tmp = NULL;
    }
    mgc_indexed_writer_free(w);
    return s;
}

/* ---- reader ------------------------------------------------------------- */

struct mgc_indexed {
    char *idx_path, *bin_path;      /* PREFIX.idx, PREFIX.bin */
    const unsigned char *idx;       /* mapped .idx */
    size_t idx_bytes;               /* its size */
    const unsigned char *bin;       /* mapped .bin; NULL when it is empty */
    size_t bin_bytes;               /* its size */
    mgc_data_dtype dtype;           /* token dtype */
    int64_t item_bytes;             /* bytes per token */
    int64_t n_sequences;            /* N */
    int64_t n_doc_indices;          /* D = documents + 1 */
    int64_t n_tokens;               /* sum of lengths */
    const unsigned char *lengths;   /* int32[N] at offset 34 (unaligned) */
    const unsigned char *pointers;  /* int64[N] at 34 + 4N */
    const unsigned char *doc_index; /* int64[D] at 34 + 12N */
};

void mgc_indexed_free(mgc_indexed *ds) {
    if (!ds) return;
    if (ds->idx) munmap((void *)ds->idx, ds->idx_bytes);
    if (ds->bin) munmap((void *)ds->bin, ds->bin_bytes);
    free(ds->idx_path);
    free(ds->bin_path);
    free(ds);
}

/* Maps `path` read-only; *p stays NULL for an empty file. */
static mgc_data_status map_file(const char *path, const unsigned char **p, size_t *n_bytes,
                                mgc_data_error *err) {
    *p = NULL;
    *n_bytes = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return fail(err, MGC_DATA_ERR_IO,
                    "%s: cannot open: %s (hint: give the prefix without .idx/.bin; build one "
                    "with `mgc data build` or `mgc data synthetic`)",
                    path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fail(err, MGC_DATA_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, MGC_DATA_ERR_IO, "%s: not a regular file", path);
    }
    *n_bytes = (size_t)st.st_size;
    if (st.st_size > 0) {
        void *m = mmap(NULL, *n_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, MGC_DATA_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        *p = m;
    }
    close(fd);
    return MGC_DATA_OK;
}

#define IDX_BAD(...) fail(err, MGC_DATA_ERR_FORMAT, __VA_ARGS__)
#define HINT_REBUILD " (hint: the file is corrupt or truncated; rebuild it with `mgc data build`)"

/* Validates everything in the mapped .idx against itself and the .bin size. */
static mgc_data_status validate(mgc_indexed *ds, mgc_data_error *err) {
    const char *path = ds->idx_path;
    const unsigned char *p = ds->idx;
    uint64_t size = ds->idx_bytes;
    if (size < MGC_INDEXED_HEADER_BYTES)
        return IDX_BAD("%s: %llu bytes, shorter than the 34-byte header" HINT_REBUILD, path,
                       (unsigned long long)size);
    if (memcmp(p, MGC_INDEXED_MAGIC, MGC_INDEXED_MAGIC_BYTES) != 0)
        return IDX_BAD("%s: bad magic, not a Megatron indexed dataset (hint: expected "
                       "\"MMIDIDX\\0\\0\"; was the .bin given instead of the .idx?)",
                       path);
    uint64_t version = get_le(p + 9, 8);
    if (version != MGC_INDEXED_VERSION)
        return IDX_BAD("%s: version %llu, only version 1 is supported" HINT_REBUILD, path,
                       (unsigned long long)version);
    int dtype = p[17];
    if (mgc_data_dtype_bytes(dtype) == 0)
        return IDX_BAD("%s: unknown dtype code %d (hint: Megatron's codes are 1..8)" HINT_REBUILD,
                       path, dtype);
    if (!dtype_is_integer(dtype))
        return IDX_BAD("%s: dtype %s is not a token dtype (hint: token data must be an integer "
                       "dtype such as uint16 or int32)",
                       path, mgc_data_dtype_name(dtype));
    ds->dtype = (mgc_data_dtype)dtype;
    ds->item_bytes = mgc_data_dtype_bytes(dtype);
    uint64_t n = get_le(p + 18, 8), d = get_le(p + 26, 8);
    uint64_t body = size - MGC_INDEXED_HEADER_BYTES;
    /* never trust a count before checking it against the file size */
    if (n > body / 12)
        return IDX_BAD(
            "%s: header claims %llu sequences but the file holds at most %llu" HINT_REBUILD, path,
            (unsigned long long)n, (unsigned long long)(body / 12));
    uint64_t rest = body - 12 * n;
    if (d > rest / 8)
        return IDX_BAD("%s: header claims %llu document indices but only %llu fit after the "
                       "sequence arrays" HINT_REBUILD,
                       path, (unsigned long long)d, (unsigned long long)(rest / 8));
    uint64_t tail = rest - 8 * d; /* 0, or N sequence_modes bytes (multimodal) */
    if (tail != 0 && tail != n)
        return IDX_BAD("%s: %llu bytes but N=%llu, D=%llu need %llu (or %llu with sequence "
                       "modes)" HINT_REBUILD,
                       path, (unsigned long long)size, (unsigned long long)n, (unsigned long long)d,
                       (unsigned long long)(size - tail), (unsigned long long)(size - tail + n));
    if (d < 1)
        return IDX_BAD(
            "%s: document_count is 0; it must be at least 1 (the leading 0)" HINT_REBUILD, path);
    ds->n_sequences = (int64_t)n;
    ds->n_doc_indices = (int64_t)d;
    ds->lengths = p + MGC_INDEXED_HEADER_BYTES;
    ds->pointers = ds->lengths + 4 * n;
    ds->doc_index = ds->pointers + 8 * n;

    uint64_t end = 0; /* end of the previous sequence in .bin */
    int64_t tokens = 0;
    for (uint64_t i = 0; i < n; i++) {
        int32_t len = (int32_t)(uint32_t)get_le(ds->lengths + 4 * i, 4);
        uint64_t ptr = get_le(ds->pointers + 8 * i, 8);
        if (len < 0)
            return IDX_BAD("%s: sequence %llu has negative length %ld" HINT_REBUILD, path,
                           (unsigned long long)i, (long)len);
        if (ptr < end || ptr > ds->bin_bytes)
            return IDX_BAD("%s: sequence %llu pointer %llu is %s" HINT_REBUILD, path,
                           (unsigned long long)i, (unsigned long long)ptr,
                           ptr < end ? "before the end of the previous sequence"
                                     : "past the end of the .bin");
        uint64_t len_bytes = (uint64_t)len * (uint64_t)ds->item_bytes;
        if (len_bytes > ds->bin_bytes - ptr)
            return IDX_BAD("%s: sequence %llu (%ld tokens at byte %llu) runs past the end of %s "
                           "(%llu bytes) (hint: the .bin is truncated or belongs to another "
                           ".idx)",
                           path, (unsigned long long)i, (long)len, (unsigned long long)ptr,
                           ds->bin_path, (unsigned long long)ds->bin_bytes);
        end = ptr + len_bytes;
        tokens += len;
    }
    ds->n_tokens = tokens;
    uint64_t prev = 0;
    for (uint64_t j = 0; j < d; j++) {
        uint64_t x = get_le(ds->doc_index + 8 * j, 8);
        if (j == 0 && x != 0)
            return IDX_BAD("%s: document_indices[0] is %llu, must be 0" HINT_REBUILD, path,
                           (unsigned long long)x);
        if (x < prev || x > n)
            return IDX_BAD("%s: document_indices[%llu] = %llu is %s" HINT_REBUILD, path,
                           (unsigned long long)j, (unsigned long long)x,
                           x < prev ? "smaller than the one before" : "past N");
        prev = x;
    }
    if (prev != n)
        return IDX_BAD("%s: document_indices ends at %llu, must end at N = %llu" HINT_REBUILD, path,
                       (unsigned long long)prev, (unsigned long long)n);
    return MGC_DATA_OK;
}

mgc_data_status mgc_indexed_open(mgc_indexed **out, const char *prefix, mgc_data_error *err) {
    *out = NULL;
    mgc_indexed *ds = calloc(1, sizeof *ds);
    if (!ds) return fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", prefix);
    ds->idx_path = cat(prefix, ".idx");
    ds->bin_path = cat(prefix, ".bin");
    mgc_data_status s = MGC_DATA_OK;
    if (!ds->idx_path || !ds->bin_path)
        s = fail(err, MGC_DATA_ERR_NOMEM, "%s: out of memory", prefix);
    if (!s) s = map_file(ds->idx_path, &ds->idx, &ds->idx_bytes, err);
    if (!s) s = map_file(ds->bin_path, &ds->bin, &ds->bin_bytes, err);
    if (!s) s = validate(ds, err);
    if (s) {
        mgc_indexed_free(ds);
        return s;
    }
    if (err) err->message[0] = '\0';
    *out = ds;
    return MGC_DATA_OK;
}

mgc_data_dtype mgc_indexed_dtype(const mgc_indexed *ds) {
    return ds->dtype;
}
int64_t mgc_indexed_sequence_count(const mgc_indexed *ds) {
    return ds->n_sequences;
}
int64_t mgc_indexed_document_count(const mgc_indexed *ds) {
    return ds->n_doc_indices - 1;
}
int64_t mgc_indexed_token_count(const mgc_indexed *ds) {
    return ds->n_tokens;
}
int64_t mgc_indexed_bin_bytes(const mgc_indexed *ds) {
    return (int64_t)ds->bin_bytes;
}

int64_t mgc_indexed_sequence_length(const mgc_indexed *ds, int64_t seq) {
    assert(seq >= 0 && seq < ds->n_sequences);
    return (int32_t)(uint32_t)get_le(ds->lengths + 4 * seq, 4);
}
int64_t mgc_indexed_sequence_pointer(const mgc_indexed *ds, int64_t seq) {
    assert(seq >= 0 && seq < ds->n_sequences);
    return (int64_t)get_le(ds->pointers + 8 * seq, 8);
}
int64_t mgc_indexed_document_index(const mgc_indexed *ds, int64_t j) {
    assert(j >= 0 && j < ds->n_doc_indices);
    return (int64_t)get_le(ds->doc_index + 8 * j, 8);
}

mgc_data_status mgc_indexed_read(const mgc_indexed *ds, int64_t seq, int64_t offset, int64_t count,
                                 int32_t *out, mgc_data_error *err) {
    if (seq < 0 || seq >= ds->n_sequences)
        return fail(err, MGC_DATA_ERR_INVALID, "%s: sequence %lld out of range [0, %lld)",
                    ds->bin_path, (long long)seq, (long long)ds->n_sequences);
    int64_t len = mgc_indexed_sequence_length(ds, seq);
    if (offset < 0 || count < 0 || offset > len || count > len - offset)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "%s: tokens [%lld, %lld) outside sequence %lld of %lld tokens", ds->bin_path,
                    (long long)offset, (long long)(offset + count), (long long)seq, (long long)len);
    if (count == 0) return MGC_DATA_OK; /* ds->bin is NULL for an empty .bin */
    const unsigned char *p =
        ds->bin + mgc_indexed_sequence_pointer(ds, seq) + offset * ds->item_bytes;
    for (int64_t i = 0; i < count; i++, p += ds->item_bytes) {
        int64_t t = decode_token(ds->dtype, p);
        if (t < INT32_MIN || t > INT32_MAX)
            return fail(err, MGC_DATA_ERR_FORMAT,
                        "%s: token %lld of sequence %lld does not fit int32", ds->bin_path,
                        (long long)(offset + i), (long long)seq);
        out[i] = (int32_t)t;
    }
    return MGC_DATA_OK;
}
