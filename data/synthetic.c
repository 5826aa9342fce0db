/* synthetic.c - the deterministic synthetic corpus (see synthetic.h). */
#include "synthetic.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gpt_dataset.h"
#include "tokenizer.h"

/* A bounded text buffer: appends past the end are dropped (never overflow). */
typedef struct text {
    char buf[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES]; /* NUL-terminated */
    size_t n;                                   /* bytes used */
} text;

static void put(text *t, const char *fmt, ...) {
    size_t room = sizeof t->buf - t->n;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->buf + t->n, room, fmt, ap);
    va_end(ap);
    if (k > 0) t->n += (size_t)k < room ? (size_t)k : room - 1;
}

static int64_t uniform(mgc_data_rng *r, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)mgc_data_rng_below(r, (uint64_t)(hi - lo + 1));
}

static void task_count(text *t, mgc_data_rng *r, int lines) {
    for (int l = 0; l < lines; l++) {
        int64_t step = uniform(r, 1, 3), from = uniform(r, 0, 60), k = uniform(r, 4, 9);
        int64_t to = from + step * (k - 1);
        if (step == 1)
            put(t, "count %lld to %lld:", (long long)from, (long long)to);
        else
            put(t, "count by %lld from %lld to %lld:", (long long)step, (long long)from,
                (long long)to);
        for (int64_t x = from; x <= to; x += step)
            put(t, " %lld", (long long)x);
        put(t, "\n");
    }
}

static void task_arith(text *t, mgc_data_rng *r, int lines) {
    for (int l = 0; l < lines; l++) {
        int64_t a = uniform(r, 0, 99), b = uniform(r, 0, 99);
        if (mgc_data_rng_below(r, 2))
            put(t, "%lld+%lld=%lld\n", (long long)a, (long long)b, (long long)(a + b));
        else if (a >= b)
            put(t, "%lld-%lld=%lld\n", (long long)a, (long long)b, (long long)(a - b));
        else
            put(t, "%lld-%lld=%lld\n", (long long)b, (long long)a, (long long)(b - a));
    }
}

static void task_lookup(text *t, mgc_data_rng *r, int lines) {
    char keys[6];
    int values[6];
    int n = (int)uniform(r, 3, 6);
    for (int i = 0; i < n; i++) {
        char k;
        int dup;
        do { /* distinct keys */
            k = (char)('a' + mgc_data_rng_below(r, 26));
            dup = 0;
            for (int j = 0; j < i; j++)
                dup |= keys[j] == k;
        } while (dup);
        keys[i] = k;
        values[i] = (int)mgc_data_rng_below(r, 10);
    }
    put(t, "let");
    for (int i = 0; i < n; i++)
        put(t, " %c=%d", keys[i], values[i]);
    put(t, "\n");
    for (int l = 0; l < lines; l++) {
        int i = (int)mgc_data_rng_below(r, (uint64_t)n);
        put(t, "%c? %d\n", keys[i], values[i]);
    }
}

static void task_bracket(text *t, mgc_data_rng *r, int lines) {
    static const char open[] = "([{<", close[] = ")]}>";
    for (int l = 0; l < lines; l++) {
        char stack[4];
        int depth = 0, emitted = 0, len = (int)uniform(r, 2, 8); /* pairs */
        while (emitted < len || depth > 0) {
            int can_open = emitted < len && depth < 4;
            if (can_open && (depth == 0 || mgc_data_rng_below(r, 2))) {
                int k = (int)mgc_data_rng_below(r, 4);
                stack[depth++] = close[k];
                put(t, "%c", open[k]);
                emitted++;
            } else {
                put(t, "%c", stack[--depth]);
            }
        }
        put(t, "\n");
    }
}

static void task_copy(text *t, mgc_data_rng *r, int lines) {
    for (int l = 0; l < lines; l++) {
        char w[9];
        int n = (int)uniform(r, 2, 8);
        for (int i = 0; i < n; i++)
            w[i] = (char)('a' + mgc_data_rng_below(r, 26));
        w[n] = '\0';
        if (mgc_data_rng_below(r, 2)) {
            put(t, "copy %s|%s\n", w, w);
        } else {
            put(t, "rev %s|", w);
            for (int i = n - 1; i >= 0; i--)
                put(t, "%c", w[i]);
            put(t, "\n");
        }
    }
}

size_t mgc_synthetic_document(uint64_t seed, int64_t i, char *buf, size_t cap) {
    /* each document has its own stream: splitmix64 over (seed, i) */
    uint64_t sm = seed ^ 0x6d67632d64617461ull; /* "mgc-data" */
    uint64_t a = mgc_splitmix64(&sm);
    sm = a ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
    mgc_data_rng r;
    mgc_data_rng_seed(&r, mgc_splitmix64(&sm));
    text t;
    t.n = 0;
    t.buf[0] = '\0';
    int lines = (int)uniform(&r, 6, 12);
    switch (mgc_data_rng_below(&r, 5)) {
    case 0:
        task_count(&t, &r, lines);
        break;
    case 1:
        task_arith(&t, &r, lines);
        break;
    case 2:
        task_lookup(&t, &r, lines);
        break;
    case 3:
        task_bracket(&t, &r, lines);
        break;
    default:
        task_copy(&t, &r, lines);
        break;
    }
    if (cap > 0) {
        size_t k = t.n < cap ? t.n : cap - 1;
        memcpy(buf, t.buf, k);
        buf[k] = '\0';
    }
    return t.n;
}

mgc_data_status mgc_synthetic_write(const char *prefix, int64_t n_documents, uint64_t seed,
                                    mgc_data_error *err) {
    if (n_documents < 1) {
        if (err)
            snprintf(err->message, sizeof err->message,
                     "%s: the synthetic corpus needs at least 1 document", prefix);
        return MGC_DATA_ERR_INVALID;
    }
    mgc_indexed_writer *w;
    mgc_data_status s =
        mgc_indexed_writer_open(&w, prefix, mgc_data_dtype_for_vocab(MGC_BYTE_VOCAB), err);
    if (s) return s;
    char doc[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES];
    int32_t tokens[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES + 1];
    for (int64_t i = 0; i < n_documents; i++) {
        size_t n = mgc_synthetic_document(seed, i, doc, sizeof doc);
        int64_t k = mgc_byte_encode(doc, n, tokens);
        tokens[k++] = MGC_BYTE_EOD;
        s = mgc_indexed_writer_add_document(w, tokens, k, err);
        if (s) {
            mgc_indexed_writer_free(w);
            return s;
        }
    }
    return mgc_indexed_writer_finish(w, err);
}
