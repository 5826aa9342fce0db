/* data_cmd.c - `mgc data build | synthetic | info` (see data_cmd.h, docs/data.md).
 *
 * The data/ headers are included by path: the compiler library does not
 * link mgc_data, only the `mgc` binary (and the tests) do. */
#include "data_cmd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "indexed.h"
#include "readfile.h"
#include "synthetic.h"
#include "tokenizer.h"

#define BUILD_USAGE                                                                                \
    "usage: mgc data build OUTPUT_PREFIX TEXT_FILE... [--append-eod] [--split file|blank|line]"
#define SYNTHETIC_USAGE "usage: mgc data synthetic OUTPUT_PREFIX [--documents N] [--seed S]"
#define INFO_USAGE      "usage: mgc data info PREFIX"

static void usage(FILE *out) {
    fputs("usage: mgc data <action> ...\n"
          "  build OUTPUT_PREFIX TEXT_FILE... [--append-eod] [--split file|blank|line]\n"
          "        tokenize text files (byte-level, vocabulary 257) into OUTPUT_PREFIX.idx/.bin;\n"
          "        --split picks the document unit: a whole file, a blank-line-separated\n"
          "        paragraph (default) or a non-empty line; --append-eod ends each with EOD (256)\n"
          "  synthetic OUTPUT_PREFIX [--documents N] [--seed S]\n"
          "        write the built-in synthetic corpus (default 8000 documents, seed 1234)\n"
          "  info PREFIX\n"
          "        counts, dtype, tokens and a preview of the first document\n",
          out);
}

typedef enum split_mode { SPLIT_FILE, SPLIT_BLANK, SPLIT_LINE } split_mode;

/* Reads a whole file; NULL with a message on failure. */
static char *read_file(const char *path, size_t *n_bytes) {
    char *buf = mgc_read_file(path, 0, n_bytes);
    if (!buf) fprintf(stderr, "mgc data: %s: cannot read: %s\n", path, strerror(errno));
    return buf;
}

/* Line [p, end of line excluding '\n') is blank: only spaces, tabs, '\r'. */
static int blank_line(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

/* Tokenizes text[n] as one document (+ EOD) into w. */
static int add_doc(mgc_indexed_writer *w, const char *text, size_t n, int append_eod,
                   int32_t **tokens, size_t *cap, const char *path) {
    if (n + 1 > *cap) {
        size_t c = n + 1 > 2 * *cap ? n + 1 : 2 * *cap;
        int32_t *t = realloc(*tokens, c * sizeof *t);
        if (!t) return fprintf(stderr, "mgc data: %s: out of memory\n", path), 0;
        *tokens = t;
        *cap = c;
    }
    int64_t k = mgc_byte_encode(text, n, *tokens);
    if (append_eod) (*tokens)[k++] = MGC_BYTE_EOD;
    mgc_data_error err;
    if (mgc_indexed_writer_add_document(w, *tokens, k, &err))
        return fprintf(stderr, "mgc data: %s\n", err.message), 0;
    return 1;
}

/* Splits one file's text into documents by `mode`. */
static int add_file(mgc_indexed_writer *w, const char *path, split_mode mode, int append_eod,
                    int64_t *n_docs, int32_t **tokens, size_t *cap) {
    size_t n;
    char *text = read_file(path, &n);
    if (!text) return 0;
    int ok = 1;
    if (mode == SPLIT_FILE) {
        ok = add_doc(w, text, n, append_eod, tokens, cap, path);
        *n_docs += ok;
    } else {
        size_t doc_start = 0, doc_end = 0; /* current paragraph [doc_start, doc_end) */
        int in_doc = 0;
        for (size_t i = 0; ok && i < n;) {
            size_t j = i;
            while (j < n && text[j] != '\n')
                j++;
            size_t next = j < n ? j + 1 : n;
            int blank = blank_line(text + i, j - i);
            if (mode == SPLIT_LINE) {
                if (!blank) {
                    size_t len = j - i;
                    if (len && text[i + len - 1] == '\r') len--;
                    ok = add_doc(w, text + i, len, append_eod, tokens, cap, path);
                    *n_docs += ok;
                }
            } else if (blank) {
                if (in_doc) {
                    ok = add_doc(w, text + doc_start, doc_end - doc_start, append_eod, tokens, cap,
                                 path);
                    *n_docs += ok;
                }
                in_doc = 0;
            } else {
                if (!in_doc) doc_start = i;
                in_doc = 1;
                doc_end = next; /* the paragraph keeps its lines' newlines */
            }
            i = next;
        }
        if (ok && mode == SPLIT_BLANK && in_doc) {
            ok = add_doc(w, text + doc_start, doc_end - doc_start, append_eod, tokens, cap, path);
            *n_docs += ok;
        }
    }
    free(text);
    return ok;
}

static int cmd_build(int argc, char **argv) {
    const char *prefix = NULL;
    int append_eod = 0, n_files = 0;
    split_mode mode = SPLIT_BLANK;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    if (!files) return fputs("mgc data build: out of memory\n", stderr), 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--append-eod")) {
            append_eod = 1;
        } else if (!strcmp(a, "--split")) {
            const char *m = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(m, "file"))
                mode = SPLIT_FILE;
            else if (!strcmp(m, "blank"))
                mode = SPLIT_BLANK;
            else if (!strcmp(m, "line"))
                mode = SPLIT_LINE;
            else {
                fprintf(
                    stderr,
                    "mgc data build: --split takes file, blank or line, not \"%s\"\n" BUILD_USAGE
                    "\n",
                    m);
                free(files);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc data build: unknown option %s\n" BUILD_USAGE "\n", a);
            free(files);
            return 2;
        } else if (!prefix) {
            prefix = a;
        } else {
            files[n_files++] = a;
        }
    }
    if (!prefix || n_files == 0) {
        fputs("mgc data build: give an output prefix and at least one text file\n" BUILD_USAGE "\n",
              stderr);
        free(files);
        return 2;
    }
    mgc_data_error err;
    mgc_indexed_writer *w;
    if (mgc_indexed_writer_open(&w, prefix, mgc_data_dtype_for_vocab(MGC_BYTE_VOCAB), &err)) {
        fprintf(stderr, "mgc data build: %s\n", err.message);
        free(files);
        return 1;
    }
    int32_t *tokens = NULL;
    size_t cap = 0;
    int64_t n_docs = 0;
    int ok = 1;
    for (int f = 0; ok && f < n_files; f++)
        ok = add_file(w, files[f], mode, append_eod, &n_docs, &tokens, &cap);
    free(tokens);
    free(files);
    if (!ok) {
        mgc_indexed_writer_free(w);
        return 1;
    }
    if (mgc_indexed_writer_finish(w, &err)) {
        fprintf(stderr, "mgc data build: %s\n", err.message);
        return 1;
    }
    printf("wrote %s.idx and %s.bin: %" PRId64 " documents\n", prefix, prefix, n_docs);
    return 0;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) return 0;
    *out = v;
    return 1;
}

static int cmd_synthetic(int argc, char **argv) {
    const char *prefix = NULL;
    int64_t n_docs = MGC_SYNTHETIC_DEFAULT_DOCUMENTS, seed = MGC_SYNTHETIC_DEFAULT_SEED;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--documents") || !strcmp(a, "--seed")) {
            int64_t *dst = a[2] == 'd' ? &n_docs : &seed;
            if (i + 1 >= argc || !parse_i64(argv[i + 1], dst) || *dst < (a[2] == 'd' ? 1 : 0)) {
                fprintf(stderr, "mgc data synthetic: %s needs a %s integer\n" SYNTHETIC_USAGE "\n",
                        a, a[2] == 'd' ? "positive" : "non-negative");
                return 2;
            }
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc data synthetic: unknown option %s\n" SYNTHETIC_USAGE "\n", a);
            return 2;
        } else if (!prefix) {
            prefix = a;
        } else {
            fprintf(stderr, "mgc data synthetic: one output prefix only\n" SYNTHETIC_USAGE "\n");
            return 2;
        }
    }
    if (!prefix) {
        fputs("mgc data synthetic: give an output prefix\n" SYNTHETIC_USAGE "\n", stderr);
        return 2;
    }
    mgc_data_error err;
    if (mgc_synthetic_write(prefix, n_docs, (uint64_t)seed, &err)) {
        fprintf(stderr, "mgc data synthetic: %s\n", err.message);
        return 1;
    }
    printf("wrote %s.idx and %s.bin: %" PRId64 " synthetic documents, seed %" PRId64 "\n", prefix,
           prefix, n_docs, seed);
    return 0;
}

/* Prints text as a C-style quoted string, at most max_bytes of it. */
static void print_quoted(const char *s, size_t n, size_t max_bytes) {
    putchar('"');
    for (size_t i = 0; i < n && i < max_bytes; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 32 || c >= 127)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
    if (n > max_bytes) fputs("...", stdout);
}

static int cmd_info(int argc, char **argv) {
    if (argc != 1 || argv[0][0] == '-') {
        fputs("mgc data info: give exactly one dataset prefix\n" INFO_USAGE "\n", stderr);
        return 2;
    }
    /* accept PREFIX.idx / PREFIX.bin as well */
    size_t n = strlen(argv[0]);
    char *prefix = malloc(n + 1);
    if (!prefix) return fputs("mgc data info: out of memory\n", stderr), 1;
    memcpy(prefix, argv[0], n + 1);
    if (n > 4 && (!strcmp(prefix + n - 4, ".idx") || !strcmp(prefix + n - 4, ".bin")))
        prefix[n - 4] = '\0';
    mgc_data_error err;
    mgc_indexed *ds;
    if (mgc_indexed_open(&ds, prefix, &err)) {
        fprintf(stderr, "mgc data info: %s\n", err.message);
        free(prefix);
        return 1;
    }
    int64_t n_seq = mgc_indexed_sequence_count(ds), min_len = 0, max_len = 0;
    for (int64_t i = 0; i < n_seq; i++) {
        int64_t l = mgc_indexed_sequence_length(ds, i);
        if (i == 0 || l < min_len) min_len = l;
        if (l > max_len) max_len = l;
    }
    printf("%s.idx: Megatron indexed dataset, version 1\n", prefix);
    printf("  dtype           %s (%" PRId64 " bytes/token)\n",
           mgc_data_dtype_name(mgc_indexed_dtype(ds)), mgc_data_dtype_bytes(mgc_indexed_dtype(ds)));
    printf("  documents       %" PRId64 "\n", mgc_indexed_document_count(ds));
    printf("  sequences       %" PRId64 "\n", n_seq);
    printf("  tokens          %" PRId64 "\n", mgc_indexed_token_count(ds));
    printf("  bin bytes       %" PRId64 "\n", mgc_indexed_bin_bytes(ds));
    if (n_seq > 0)
        printf("  sequence tokens min %" PRId64 ", mean %.1f, max %" PRId64 "\n", min_len,
               (double)mgc_indexed_token_count(ds) / (double)n_seq, max_len);
    int rc = 0;
    if (mgc_indexed_document_count(ds) > 0 && n_seq > 0) {
        /* the first document's tokens, up to 4096 */
        int64_t s0 = mgc_indexed_document_index(ds, 0), s1 = mgc_indexed_document_index(ds, 1);
        enum { PREVIEW_TOKENS = 4096 };
        int32_t *tok = malloc(PREVIEW_TOKENS * sizeof *tok);
        int64_t got = 0, total = 0;
        for (int64_t s = s0; s < s1; s++)
            total += mgc_indexed_sequence_length(ds, s);
        for (int64_t s = s0; tok && s < s1 && got < PREVIEW_TOKENS; s++) {
            int64_t k = mgc_indexed_sequence_length(ds, s);
            if (k > PREVIEW_TOKENS - got) k = PREVIEW_TOKENS - got;
            if (mgc_indexed_read(ds, s, 0, k, tok + got, &err)) {
                fprintf(stderr, "mgc data info: %s\n", err.message);
                rc = 1;
                break;
            }
            got += k;
        }
        if (tok && !rc) {
            int bytes = 1;
            for (int64_t i = 0; i < got; i++)
                bytes &= tok[i] >= 0 && tok[i] <= MGC_BYTE_EOD;
            printf("  first document  %" PRId64 " tokens: ", total);
            if (bytes) { /* byte-level tokens: show the text */
                char *text = malloc((size_t)got + 1);
                if (text) {
                    size_t len = mgc_byte_decode(tok, got, text, (size_t)got + 1, 0);
                    print_quoted(text, len, 160);
                    int64_t eod = 0;
                    for (int64_t i = 0; i < got; i++)
                        eod += tok[i] == MGC_BYTE_EOD;
                    if (eod) printf(" + %" PRId64 " EOD", eod);
                    free(text);
                }
            } else {
                for (int64_t i = 0; i < got && i < 16; i++)
                    printf("%s%ld", i ? " " : "", (long)tok[i]);
                if (got > 16) fputs(" ...", stdout);
            }
            putchar('\n');
        }
        free(tok);
    }
    mgc_indexed_free(ds);
    free(prefix);
    return rc;
}

int mgc_cmd_data(int argc, char **argv) {
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    const char *action = argv[0];
    if (!strcmp(action, "build")) return cmd_build(argc - 1, argv + 1);
    if (!strcmp(action, "synthetic")) return cmd_synthetic(argc - 1, argv + 1);
    if (!strcmp(action, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(action, "help") || !strcmp(action, "--help") || !strcmp(action, "-h"))
        return usage(stdout), 0;
    fprintf(stderr, "mgc data: unknown action \"%s\"\n", action);
    usage(stderr);
    return 2;
}
