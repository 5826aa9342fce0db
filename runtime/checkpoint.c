/* checkpoint.c - see checkpoint.h; the file format is docs/checkpoints.md. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints are little-endian, and this file writes integers and floats as the host stores them"
#endif

static const char MAGIC[8] = {'M', 'G', 'C', 'C', 'K', 'P', 'T', 0};
enum { ENTRY_FIXED = 72, MAX_NAME = 4096, MSG = 1024 };
static const size_t IO_BLOCK = (size_t)16 << 20;

__attribute__((format(printf, 3, 4))) static int bad(char *err, size_t errsz, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
    return -1;
}
#define BAD(...) bad(err, errsz, __VA_ARGS__)

/* ---- the model's tensors ------------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
    return strcmp(((const mgc_ckpt_tensor *)a)->name, ((const mgc_ckpt_tensor *)b)->name);
}

static const mgc_ckpt_tensor *find(const mgc_ckpt_model *m, const char *name) {
    mgc_ckpt_tensor key;
    key.name = (char *)name;
    return bsearch(&key, m->t, (size_t)m->n, sizeof *m->t, by_name);
}

void mgc_ckpt_model_free(mgc_ckpt_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n; i++)
        free(m->t[i].name);
    free(m->t);
    m->t = NULL, m->n = 0;
}

static const char *shape(const mgc_ckpt_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->rank && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", t->dim[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* data offsets, in table order */
static void lay_out(mgc_ckpt_model *m) {
    uint64_t off = 0;
    for (int64_t i = 0; i < m->n; i++)
        m->t[i].offset = off, off += 12 * m->t[i].numel;
}

int mgc_ckpt_model_of(const mgc_plan *plan, mgc_ckpt_model *out, char *err, size_t errsz) {
    memset(out, 0, sizeof *out);
    int64_t total = 0, padded = 0, heads = 0, groups = 0;
    mgc_plan_config_int(plan, "derived.padded_vocab_size", &padded);
    mgc_plan_config_int(plan, "model.num_attention_heads", &heads);
    mgc_plan_config_int(plan, "model.num_query_groups", &groups);
    /* key/value heads replicated over tensor ranks: a QKV shard is [q | k | v] of one group */
    int kv_rep = groups > 0 && heads > 0 && plan->grid.tp > groups;
    for (int64_t s = 0; s < plan->n_stages; s++)
        for (int64_t c = 0; c < plan->stages[s].n_chunks; c++)
            total += plan->stages[s].chunks[c].n_tensors;
    out->t = calloc((size_t)(total ? total : 1), sizeof *out->t);
    if (!out->t) goto oom;
    for (int64_t s = 0; s < plan->n_stages; s++)
        for (int64_t c = 0; c < plan->stages[s].n_chunks; c++) {
            const mgc_plan_chunk *ch = &plan->stages[s].chunks[c];
            for (int64_t i = 0; i < ch->n_tensors; i++) {
                const mgc_plan_tensor *T = &ch->tensors[i];
                const char *nm = mgc_plan_strat(plan, T->name);
                /* the parameters, and the routers' expert biases (inputs the runtime keeps:
                 * the parameter array holds them, the moments zeros) */
                int bias = T->role == MGC_TR_INPUT && !T->view && T->rank == 1 &&
                           mgc_plan_expert_bias_layer(nm) >= 0;
                if ((T->role != MGC_TR_PARAM || T->buffer < 0) && !bias) continue;
                mgc_ckpt_tensor *t = &out->t[out->n];
                t->name = strdup(nm ? nm : "");
                if (!t->name) goto oom;
                out->n++;
                t->rank = T->rank;
                t->numel = 1;
                for (int d = 0; d < T->rank && d < 4; d++) {
                    t->dim[d] = T->dim[d];
                    /* the whole tensor: each sharded dim times its group's size */
                    if (d == T->split_axis || d == T->split2_axis) {
                        uint16_t grp = d == T->split_axis ? T->split_group : T->split2_group;
                        int64_t g = mgc_grid_group(&plan->grid, (mgc_group_kind)grp, 0, NULL, 0);
                        t->dim[d] *= g > 0 ? g : 1;
                    }
                    t->numel *= (uint64_t)t->dim[d];
                }
                size_t nl = strlen(t->name);
                if (kv_rep && T->rank >= 1 && T->split_axis == 0 &&
                    ((nl >= 17 && !strcmp(t->name + nl - 17, "linear_qkv.weight")) ||
                     (nl >= 15 && !strcmp(t->name + nl - 15, "linear_qkv.bias")))) {
                    int64_t a_l = heads / plan->grid.tp, hd = T->dim[0] / (a_l + 2);
                    t->numel = t->numel / (uint64_t)t->dim[0] * (uint64_t)((heads + 2 * groups) * hd);
                    t->dim[0] = (heads + 2 * groups) * hd;
                }
                t->vocab = padded > 0 && t->rank == 2 && t->dim[0] == padded &&
                           (strstr(t->name, "word_embeddings") || !strncmp(t->name, "output_layer", 12));
            }
        }
    qsort(out->t, (size_t)out->n, sizeof *out->t, by_name);
    /* the tied embedding's copy (and any parameter two stages hold) once */
    int64_t k = 0;
    const char *clash = NULL;
    for (int64_t i = 0; i < out->n; i++) {
        if (k > 0 && !strcmp(out->t[k - 1].name, out->t[i].name)) {
            if (out->t[k - 1].numel != out->t[i].numel) clash = out->t[k - 1].name;
            free(out->t[i].name);
            continue;
        }
        out->t[k++] = out->t[i];
    }
    out->n = k;
    if (clash) {
        snprintf(err, errsz, "the plan holds parameter '%s' twice, with different shapes", clash);
        mgc_ckpt_model_free(out);
        return -1;
    }
    out->n = k;
    lay_out(out);
    return 0;
oom:
    mgc_ckpt_model_free(out);
    snprintf(err, errsz, "out of memory");
    return -1;
}

/* ---- files ----------------------------------------------------------------------------------- */

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) {
            errno = EIO; /* shorter than its header says: checked before, so it shrank */
            return -1;
        }
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* fsync the directory, so a rename in it survives a crash (best effort: some file systems
 * refuse it) */
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int mgc_ckpt_prepare_dir(const char *dir, char *err, size_t errsz) {
    char p[4096];
    if (!dir || !*dir || strlen(dir) >= sizeof p) {
        snprintf(err, errsz, "checkpoint directory '%s': give a path shorter than %zu bytes",
                 dir ? dir : "", sizeof p);
        return -1;
    }
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) /* mkdir -p */
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) && errno != EEXIST) break; /* the stat below names the problem */
            *s = '/';
        }
    if (mkdir(p, 0777) && errno != EEXIST) {
        snprintf(err, errsz, "cannot create the checkpoint directory %s: %s (set "
                             "checkpoint.directory, or --checkpoint-dir, to a writable path)",
                 dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        snprintf(err, errsz, "the checkpoint directory %s is not a directory (set "
                             "checkpoint.directory, or --checkpoint-dir, to a directory)",
                 dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK)) {
        snprintf(err, errsz, "the checkpoint directory %s is not writable: %s (set "
                             "checkpoint.directory, or --checkpoint-dir, to a writable directory)",
                 dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* "step-<digits>.mgck" (suffix ".mgck" or ".mgck.partial"): the step, else -1 */
static int64_t step_of(const char *name, const char *suffix) {
    if (strncmp(name, "step-", 5)) return -1;
    const char *d = name + 5, *e = d;
    int64_t v = 0;
    while (*e >= '0' && *e <= '9' && e - d < 18)
        v = v * 10 + (*e++ - '0');
    if (e == d || strcmp(e, suffix)) return -1;
    return v;
}

int mgc_ckpt_latest(const char *dir, char *path, size_t pathsz, int64_t *step, char *err, size_t errsz) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        snprintf(err, errsz, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
        return -1;
    }
    int64_t best = -1;
    char name[1024] = "";
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name, ".mgck");
        struct stat st; /* a checkpoint is a file: a directory of that name is not one */
        if (s > best && strlen(e->d_name) < sizeof name && fstatat(dirfd(d), e->d_name, &st, 0) == 0 &&
            S_ISREG(st.st_mode))
            best = s, snprintf(name, sizeof name, "%s", e->d_name);
    }
    closedir(d);
    if (best < 0) return 0;
    if ((size_t)snprintf(path, pathsz, "%s/%s", dir, name) >= pathsz) {
        snprintf(err, errsz, "the checkpoint path %s/%s is too long", dir, name);
        return -1;
    }
    *step = best;
    return 1;
}

/* Removes dir's complete checkpoints but the newest `keep` (0 keeps all), and unfinished
 * ones (".partial") of steps before `done`. */
static void prune(const char *dir, int64_t keep, int64_t done) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t *steps = NULL, n = 0, cap = 0;
    char p[4600];
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name, ".mgck");
        int64_t u = step_of(e->d_name, ".mgck.partial");
        if (u >= 0 && u < done && (size_t)snprintf(p, sizeof p, "%s/step-%09" PRId64 ".mgck.partial", dir, u) < sizeof p &&
            !strcmp(p + strlen(dir) + 1, e->d_name))
            unlink(p);
        if (s < 0 || keep <= 0) continue;
        if (n == cap) {
            int64_t *g = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!g) break;
            steps = g;
        }
        steps[n++] = s;
    }
    closedir(d);
    for (int64_t i = 0; i < n; i++) { /* remove those with `keep` newer ones */
        int64_t newer = 0;
        for (int64_t j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer >= keep) {
            snprintf(p, sizeof p, "%s/step-%09" PRId64 ".mgck", dir, steps[i]);
            unlink(p);
        }
    }
    free(steps);
}

/* ---- header and table ---------------------------------------------------------------------- */

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static size_t entry_bytes(const mgc_ckpt_tensor *t) {
    return ENTRY_FIXED + ((strlen(t->name) + 7) & ~(size_t)7);
}

static size_t table_bytes(const mgc_ckpt_model *m) {
    size_t n = 0;
    for (int64_t i = 0; i < m->n; i++)
        n += entry_bytes(&m->t[i]);
    return n;
}

static void encode_table(const mgc_ckpt_model *m, uint8_t *p) {
    for (int64_t i = 0; i < m->n; i++) {
        const mgc_ckpt_tensor *t = &m->t[i];
        size_t len = strlen(t->name), e = entry_bytes(t);
        memset(p, 0, e);
        put32(p, (uint32_t)len), put32(p + 4, (uint32_t)t->rank), put32(p + 8, (uint32_t)t->vocab);
        for (int d = 0; d < 4; d++)
            put64(p + 16 + 8 * d, (uint64_t)(d < t->rank ? t->dim[d] : 1));
        put64(p + 48, t->offset);
        for (int a = 0; a < 3; a++)
            put32(p + 56 + 4 * a, t->crc[a]);
        memcpy(p + ENTRY_FIXED, t->name, len);
        p += e;
    }
}

static uint64_t data_offset_for(size_t tbytes) {
    return ((uint64_t)MGC_CKPT_HEADER_BYTES + tbytes + 4095) & ~(uint64_t)4095;
}

static void encode_header(uint8_t *h, const mgc_exec_resume *r, int64_t gbs, const mgc_plan *plan,
                          const mgc_ckpt_model *m, size_t tbytes, uint32_t tcrc) {
    int64_t seed = 0, vocab = 0;
    mgc_plan_config_int(plan, "training.seed", &seed);
    mgc_plan_config_int(plan, "model.vocab_size", &vocab);
    memset(h, 0, MGC_CKPT_HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    put32(h + 8, MGC_CKPT_VERSION), put32(h + 12, MGC_CKPT_HEADER_BYTES);
    put64(h + 16, (uint64_t)r->iteration), put64(h + 24, (uint64_t)r->consumed_samples);
    put64(h + 32, (uint64_t)gbs), put64(h + 40, (uint64_t)plan->seq_length);
    put64(h + 48, (uint64_t)seed), put64(h + 56, (uint64_t)vocab);
    memcpy(h + 64, &r->loss_scale, 8);
    put64(h + 72, (uint64_t)r->ls_clean), put64(h + 80, (uint64_t)r->ls_left);
    put64(h + 88, (uint64_t)m->n), put64(h + 96, (uint64_t)tbytes);
    put64(h + 104, data_offset_for(tbytes));
    put32(h + 112, tcrc);
    put32(h + 124, mgc_crc32c(0, h, 124));
}

void mgc_ckpt_info_free(mgc_ckpt_info *info) {
    if (info) mgc_ckpt_model_free(&info->model);
}


int mgc_ckpt_read_info(const char *path, mgc_ckpt_info *info, char *err, size_t errsz) {
    memset(info, 0, sizeof *info);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return BAD("cannot open the checkpoint %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t h[MGC_CKPT_HEADER_BYTES];
    uint8_t *tab = NULL;
    int rc = -1;
    const char *hint = "move it out of the checkpoint directory to resume from the one before it";
    if (fstat(fd, &st) || st.st_size < MGC_CKPT_HEADER_BYTES || pread_all(fd, h, sizeof h, 0)) {
        BAD("%s: not an mgc checkpoint (shorter than its %d-byte header): %s", path,
            MGC_CKPT_HEADER_BYTES, hint);
        goto done;
    }
    if (memcmp(h, MAGIC, 8)) {
        BAD("%s: not an mgc checkpoint (no MGCCKPT magic): %s", path, hint);
        goto done;
    }
    if (get32(h + 8) != MGC_CKPT_VERSION || get32(h + 12) != MGC_CKPT_HEADER_BYTES) {
        BAD("%s: checkpoint format version %u; this mgc-run reads version %d: resume it with the "
            "mgc-run that wrote it",
            path, get32(h + 8), MGC_CKPT_VERSION);
        goto done;
    }
    if (get32(h + 124) != mgc_crc32c(0, h, 124)) {
        BAD("%s: the checkpoint's header is damaged (checksum mismatch): %s", path, hint);
        goto done;
    }
    uint64_t n = get64(h + 88), tbytes = get64(h + 96), doff = get64(h + 104);
    info->file_bytes = (uint64_t)st.st_size;
    if (tbytes > info->file_bytes || n > tbytes / ENTRY_FIXED || doff != data_offset_for((size_t)tbytes)) {
        BAD("%s: the checkpoint's table is damaged (%" PRIu64 " tensors in %" PRIu64 " bytes): %s",
            path, n, tbytes, hint);
        goto done;
    }
    tab = malloc(tbytes ? (size_t)tbytes : 1);
    info->model.t = calloc(n ? (size_t)n : 1, sizeof *info->model.t);
    if (!tab || !info->model.t) {
        BAD("out of memory");
        goto done;
    }
    if (pread_all(fd, tab, (size_t)tbytes, MGC_CKPT_HEADER_BYTES) ||
        mgc_crc32c(0, tab, (size_t)tbytes) != get32(h + 112)) {
        BAD("%s: the checkpoint's table is damaged (checksum mismatch): %s", path, hint);
        goto done;
    }
    uint64_t at = 0, data = 0;
    for (uint64_t i = 0; i < n; i++) {
        mgc_ckpt_tensor *t = &info->model.t[i];
        uint32_t len = at + ENTRY_FIXED <= tbytes ? get32(tab + at) : 0;
        size_t e = ENTRY_FIXED + (((size_t)len + 7) & ~(size_t)7);
        int ok = at + ENTRY_FIXED <= tbytes && len > 0 && len < MAX_NAME && at + e <= tbytes;
        if (ok) {
            t->rank = (int)get32(tab + at + 4);
            t->vocab = (int)get32(tab + at + 8);
            ok = t->rank >= 1 && t->rank <= 4;
            t->numel = 1;
            for (int d = 0; d < 4 && ok; d++) {
                t->dim[d] = (int64_t)get64(tab + at + 16 + 8 * d);
                ok = t->dim[d] >= 1 && t->dim[d] <= ((int64_t)1 << 40) &&
                     t->numel <= ((uint64_t)1 << 44) / (uint64_t)t->dim[d];
                if (ok) t->numel *= (uint64_t)t->dim[d];
            }
            t->offset = get64(tab + at + 48);
            ok = ok && t->offset == data;
            for (int a = 0; a < 3; a++)
                t->crc[a] = get32(tab + at + 56 + 4 * a);
        }
        if (ok) {
            t->name = malloc(len + 1);
            if (!t->name) {
                BAD("out of memory");
                goto done;
            }
            memcpy(t->name, tab + at + ENTRY_FIXED, len);
            t->name[len] = 0;
            ok = strlen(t->name) == len && (i == 0 || strcmp(info->model.t[i - 1].name, t->name) < 0);
            info->model.n++;
        }
        if (!ok) {
            BAD("%s: the checkpoint's table is damaged (entry %" PRIu64 "): %s", path, i, hint);
            goto done;
        }
        data += 12 * t->numel;
        at += e;
    }
    if (info->file_bytes != doff + data) {
        BAD("%s: the checkpoint is %" PRIu64 " bytes but its table describes %" PRIu64
            " (truncated or extended since it was written): %s",
            path, info->file_bytes, doff + data, hint);
        goto done;
    }
    /* the padding before the data is zeros: no byte of the file goes unchecked */
    uint64_t gap = doff - MGC_CKPT_HEADER_BYTES - tbytes;
    uint8_t z[4096];
    if (gap > sizeof z || pread_all(fd, z, (size_t)gap, MGC_CKPT_HEADER_BYTES + tbytes)) {
        BAD("%s: the checkpoint's table is damaged (its padding cannot be read): %s", path, hint);
        goto done;
    }
    for (uint64_t i = 0; i < gap; i++)
        if (z[i]) {
            BAD("%s: the checkpoint's table is damaged (non-zero padding at byte %" PRIu64 "): %s",
                path, MGC_CKPT_HEADER_BYTES + tbytes + i, hint);
            goto done;
        }
    info->data_offset = doff;
    mgc_exec_resume *r = &info->resume;
    r->iteration = (int64_t)get64(h + 16);
    r->consumed_samples = (int64_t)get64(h + 24);
    info->global_batch = (int64_t)get64(h + 32);
    info->seq_length = (int64_t)get64(h + 40);
    info->seed = (int64_t)get64(h + 48);
    info->vocab_size = (int64_t)get64(h + 56);
    memcpy(&r->loss_scale, h + 64, 8);
    r->ls_clean = (int64_t)get64(h + 72);
    r->ls_left = (int64_t)get64(h + 80);
    rc = 0;
done:
    free(tab);
    close(fd);
    if (rc) mgc_ckpt_info_free(info);
    return rc;
}

static const char *const ARRAY[3] = {"parameter", "Adam m", "Adam v"};

/* CRC-32C of the n bytes at off */
static int crc_range(int fd, uint64_t off, uint64_t n, uint8_t *buf, uint32_t *out) {
    uint32_t c = 0;
    while (n > 0) {
        size_t k = n < IO_BLOCK ? (size_t)n : IO_BLOCK;
        if (pread_all(fd, buf, k, off)) return -1;
        c = mgc_crc32c(c, buf, k);
        off += k, n -= k;
    }
    *out = c;
    return 0;
}

/* ---- the checksums, shared out over the ranks --------------------------------------------
 * The file's 3n arrays (tensor i's parameter, m, v, in table order) are contiguous in the data
 * section.  Rank r of `world` takes the arrays whose first byte falls in the r-th of `world`
 * equal parts of the section: a contiguous run of arrays, about 1/world of the bytes, so the
 * ranks read the file back (to checksum it when saving, to verify it when loading) side by
 * side instead of rank 0 reading all of it. */

/* The share of every rank: arrays [first[r], first[r + 1]) for rank r (first: world + 1). */
static int64_t *crc_shares(const mgc_ckpt_model *m, int world) {
    int64_t *first = malloc((size_t)(world + 1) * sizeof *first), arrays = 3 * m->n;
    if (!first) return NULL;
    uint64_t total = 0;
    for (int64_t i = 0; i < m->n; i++)
        total += 12 * m->t[i].numel;
    int r = 0;
    first[0] = 0;
    for (int64_t j = 0; j < arrays; j++) {
        const mgc_ckpt_tensor *t = &m->t[j / 3];
        uint64_t start = t->offset + (uint64_t)(j % 3) * t->numel * 4;
        int owner = total ? (int)((unsigned __int128)start * (unsigned)world / total) : 0;
        while (r < owner && r < world - 1)
            first[++r] = j;
    }
    while (r < world)
        first[++r] = arrays;
    return first;
}

/* CRC-32C of arrays [lo, hi) of the file (data section at doff) into crc[0 .. hi - lo). */
static int crc_arrays(int fd, uint64_t doff, const mgc_ckpt_model *m, int64_t lo, int64_t hi, uint32_t *crc) {
    uint8_t *buf = malloc(IO_BLOCK);
    if (!buf) return -1;
    int rc = 0;
    for (int64_t j = lo; j < hi && !rc; j++) {
        const mgc_ckpt_tensor *t = &m->t[j / 3];
        rc = crc_range(fd, doff + t->offset + (uint64_t)(j % 3) * t->numel * 4, t->numel * 4, buf, &crc[j - lo]);
    }
    free(buf);
    return rc;
}

/* The checksums of rank `me` of `world`'s share (crc_shares) of the file at path (data section
 * at doff) into *out (malloc'd, first[me + 1] - first[me] of them); `doing` names the read in
 * errors ("reading", "reading back"). */
static int checksum_share(const char *path, const mgc_ckpt_model *m, uint64_t doff, int me, int world,
                          const char *doing, uint32_t **out, char *err, size_t errsz) {
    *out = NULL;
    int64_t *first = crc_shares(m, world);
    if (!first) return BAD("out of memory");
    int64_t lo = first[me], hi = first[me + 1];
    free(first);
    uint32_t *crc = malloc((size_t)(hi > lo ? hi - lo : 1) * sizeof *crc);
    int fd = crc ? open(path, O_RDONLY) : -1;
    int rc = !crc ? BAD("out of memory") : fd < 0 ? BAD("cannot open the checkpoint %s: %s", path, strerror(errno)) : 0;
    if (!rc && crc_arrays(fd, doff, m, lo, hi, crc))
        rc = BAD("%s the checkpoint %s: %s", doing, path, errno ? strerror(errno) : "out of memory");
    if (fd >= 0) close(fd);
    if (rc) free(crc), crc = NULL;
    *out = crc;
    return rc;
}

/* Rank `rank` of `world`'s share of mgc_ckpt_verify. */
static int verify_share(const char *path, const mgc_ckpt_info *info, int rank, int world, char *err, size_t errsz) {
    uint32_t *crc = NULL;
    int rc = checksum_share(path, &info->model, info->data_offset, rank, world, "reading", &crc, err, errsz);
    int64_t *first = rc ? NULL : crc_shares(&info->model, world);
    if (!rc && !first) rc = BAD("out of memory");
    for (int64_t j = rc ? 0 : first[rank]; !rc && j < first[rank + 1]; j++) {
        const mgc_ckpt_tensor *t = &info->model.t[j / 3];
        uint32_t c = crc[j - first[rank]];
        if (c != t->crc[j % 3])
            rc = BAD("%s: the %s values of '%s' are damaged (checksum %08x, written %08x): the "
                     "file changed after it was written; move it out of the checkpoint "
                     "directory to resume from the one before it",
                     path, ARRAY[j % 3], t->name, c, t->crc[j % 3]);
    }
    free(first);
    free(crc);
    return rc;
}

int mgc_ckpt_verify(const char *path, const mgc_ckpt_info *info, char *err, size_t errsz) {
    return verify_share(path, info, 0, 1, err, errsz);
}

/* ---- collective agreement ------------------------------------------------------------------ */

/* 0 when rc is 0 on every rank; else -1 on every rank, with the lowest failing rank's message
 * in err everywhere. */
static int agree(mgc_comm *world, int rc, char *err, size_t errsz) {
    int me = mgc_comm_rank(world), n = mgc_comm_size(world);
    float mine = rc ? (float)(n - me) : 0.0f, worst = 0;
    if (mgc_comm_all_reduce(world, &mine, &worst, 1, MGC_DT_F32, MGC_COMM_MAX) != MGC_COMM_OK) {
        if (!rc) snprintf(err, errsz, "checkpoint: %s", mgc_comm_error(world));
        return -1;
    }
    if (worst == 0) return 0;
    int root = n - (int)worst;
    char msg[MSG];
    snprintf(msg, sizeof msg, "%s", me == root ? err : "");
    if (mgc_comm_broadcast(world, msg, sizeof msg, MGC_DT_U8, root) != MGC_COMM_OK) {
        if (!rc) snprintf(err, errsz, "checkpoint: %s", mgc_comm_error(world));
        return -1;
    }
    msg[MSG - 1] = 0;
    if (me != root) snprintf(err, errsz, "%s", msg);
    return -1;
}

/* ---- save ------------------------------------------------------------------------------------ */

typedef struct io_ctx {
    int fd;
    const mgc_ckpt_model *m;    /* the file's tensors */
    uint64_t data_offset;
    const char *path;
    char err[MSG];
    int fresh_biases; /* --init-from: expert biases the file lacks read as zeros */
} io_ctx;

/* A router's expert bias (moe.expert_bias_update_rate): state, not a parameter. */
static int is_bias(const char *name) {
    return mgc_plan_expert_bias_layer(name) >= 0;
}

static const mgc_ckpt_tensor *io_find(io_ctx *c, const char *name, uint64_t gi, int64_t n, uint64_t limit) {
    const mgc_ckpt_tensor *t = find(c->m, name);
    if (!t) snprintf(c->err, sizeof c->err, "%s: no tensor '%s'", c->path, name);
    else if (n < 0 || gi + (uint64_t)n > limit)
        snprintf(c->err, sizeof c->err, "%s: elements %" PRIu64 "..%" PRIu64 " of '%s' are outside its %" PRIu64,
                 c->path, gi, gi + (uint64_t)n, name, limit);
    else return t;
    return NULL;
}

static int io_put(void *ctx, const char *name, int array, uint64_t gi, const float *v, int64_t n) {
    io_ctx *c = ctx;
    const mgc_ckpt_tensor *t = find(c->m, name);
    if (!(t = io_find(c, name, gi, n, t ? t->numel : 0))) return -1;
    uint64_t off = c->data_offset + t->offset + ((uint64_t)array * t->numel + gi) * 4;
    if (pwrite_all(c->fd, v, (size_t)n * 4, off)) {
        snprintf(c->err, sizeof c->err, "writing the checkpoint %s: %s", c->path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads in the plan's global indices: the inner dims match the file's (mgc_ckpt_load checked);
 * vocabulary rows the file lacks (it was padded to fewer) read as zeros. */
static int io_get(void *ctx, const char *name, int array, uint64_t gi, float *v, int64_t n) {
    io_ctx *c = ctx;
    const mgc_ckpt_tensor *t = find(c->m, name);
    if (!t && c->fresh_biases && is_bias(name)) { /* a model trained without them */
        memset(v, 0, (size_t)(n > 0 ? n : 0) * 4);
        return 0;
    }
    uint64_t have = t ? t->numel : 0;
    if (t && t->vocab) {
        if (!(t = io_find(c, name, gi, n, UINT64_MAX / 2))) return -1;
        if (gi + (uint64_t)n > have) {
            uint64_t keep = gi < have ? have - gi : 0;
            memset(v + keep, 0, (size_t)((uint64_t)n - keep) * 4);
            n = (int64_t)keep;
        }
    } else if (!(t = io_find(c, name, gi, n, have))) {
        return -1;
    }
    if (n > 0 && pread_all(c->fd, v, (size_t)n * 4, c->data_offset + t->offset + ((uint64_t)array * t->numel + gi) * 4)) {
        snprintf(c->err, sizeof c->err, "reading the checkpoint %s: %s", c->path, strerror(errno));
        return -1;
    }
    return 0;
}

/* rank 0: DIR/step-N.mgck.partial with its header and table (no checksums yet), full size */
static int create_partial(const char *dir, const char *partial, const mgc_ckpt_model *m,
                          const mgc_exec_resume *r, int64_t gbs, const mgc_plan *plan,
                          char *err, size_t errsz) {
    if (mgc_ckpt_prepare_dir(dir, err, errsz)) return -1;
    size_t tb = table_bytes(m);
    uint8_t *tab = malloc(tb ? tb : 1), h[MGC_CKPT_HEADER_BYTES];
    if (!tab) return BAD("out of memory");
    encode_table(m, tab);
    encode_header(h, r, gbs, plan, m, tb, mgc_crc32c(0, tab, tb));
    uint64_t total = data_offset_for(tb);
    for (int64_t i = 0; i < m->n; i++)
        total += 12 * m->t[i].numel;
    int fd = open(partial, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int rc = 0;
    if (fd < 0 || pwrite_all(fd, h, sizeof h, 0) || pwrite_all(fd, tab, tb, sizeof h) ||
        ftruncate(fd, (off_t)total))
        rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    if (fd >= 0 && close(fd) && !rc) rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    free(tab);
    return rc;
}

/* Collective: every rank's share of the checksums into every rank's m (an all-gather of
 * equal blocks, each rank's padded to the largest share). */
static int gather_checksums(mgc_comm *world, mgc_ckpt_model *m, const uint32_t *mine, char *err, size_t errsz) {
    int me = mgc_comm_rank(world), W = mgc_comm_size(world);
    int64_t *first = crc_shares(m, W), most = 0;
    if (!first) return BAD("out of memory");
    for (int r = 0; r < W; r++)
        most = first[r + 1] - first[r] > most ? first[r + 1] - first[r] : most;
    if (most == 0) most = 1;
    uint32_t *send = calloc((size_t)most, sizeof *send), *recv = calloc((size_t)most * (size_t)W, sizeof *recv);
    int rc = send && recv ? 0 : BAD("out of memory");
    if (!rc) {
        if (first[me + 1] > first[me]) memcpy(send, mine, (size_t)(first[me + 1] - first[me]) * sizeof *send);
        if (mgc_comm_all_gather(world, send, recv, (size_t)most * 4, MGC_DT_U8) != MGC_COMM_OK)
            rc = BAD("checkpoint: gathering the checksums: %s", mgc_comm_error(world));
    }
    for (int r = 0; r < W && !rc; r++)
        for (int64_t j = first[r]; j < first[r + 1]; j++)
            m->t[j / 3].crc[j % 3] = recv[(size_t)r * (size_t)most + (size_t)(j - first[r])];
    free(first), free(send), free(recv);
    return rc;
}

/* rank 0, with every checksum in m: the table and header completed, synced, renamed */
static int seal(const char *dir, const char *partial, const char *final, const mgc_ckpt_model *m,
                const mgc_exec_resume *r, int64_t gbs, const mgc_plan *plan, char *err, size_t errsz) {
    int fd = open(partial, O_RDWR);
    if (fd < 0) return BAD("cannot reopen the checkpoint %s: %s", partial, strerror(errno));
    size_t tb = table_bytes(m);
    uint8_t *buf = malloc(tb ? tb : 1), h[MGC_CKPT_HEADER_BYTES];
    int rc = buf ? 0 : BAD("out of memory");
    if (!rc) {
        encode_table(m, buf);
        encode_header(h, r, gbs, plan, m, tb, mgc_crc32c(0, buf, tb));
        if (pwrite_all(fd, buf, tb, sizeof h) || pwrite_all(fd, h, sizeof h, 0) || fsync(fd))
            rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    }
    if (close(fd) && !rc) rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    if (!rc && rename(partial, final)) rc = BAD("cannot rename %s to %s: %s", partial, final, strerror(errno));
    if (!rc) sync_dir(dir);
    free(buf);
    return rc;
}

int mgc_ckpt_save(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *dir,
                  int64_t completed, int64_t keep, char *err, size_t errsz) {
    int me = mgc_comm_rank(world);
    char final[4200], partial[4300];
    if ((size_t)snprintf(final, sizeof final, "%s/step-%09" PRId64 ".mgck", dir, completed) >= sizeof final)
        return BAD("the checkpoint directory path %s is too long", dir);
    snprintf(partial, sizeof partial, "%s.partial", final);
    mgc_ckpt_model m;
    mgc_exec_resume r;
    mgc_exec_get_resume(x, completed, &r);
    int rc = mgc_ckpt_model_of(plan, &m, err, errsz);
    int64_t gbs = mgc_exec_global_batch(x);
    if (!rc && me == 0) rc = create_partial(dir, partial, &m, &r, gbs, plan, err, errsz);
    if (agree(world, rc, err, errsz)) goto fail;
    /* every rank: the elements it owns */
    io_ctx c = {open(partial, O_WRONLY), &m, data_offset_for(table_bytes(&m)), partial, ""};
    if (c.fd < 0) {
        rc = BAD("cannot open the checkpoint %s: %s", partial, strerror(errno));
    } else {
        mgc_exec_ckpt_io io = {io_put, io_get, &c};
        rc = mgc_exec_ckpt_save(x, &io);
        if (rc) snprintf(err, errsz, "%s", c.err[0] ? c.err : mgc_exec_error(x));
        if (!rc && fsync(c.fd)) rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
        if (close(c.fd) && !rc) rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    }
    if (agree(world, rc, err, errsz)) goto fail;
    /* every rank checksums its share of the file; rank 0 completes the table and renames */
    uint32_t *mine = NULL;
    rc = checksum_share(partial, &m, data_offset_for(table_bytes(&m)), me, mgc_comm_size(world), "reading back",
                        &mine, err, errsz);
    if (agree(world, rc, err, errsz) || gather_checksums(world, &m, mine, err, errsz)) {
        free(mine);
        goto fail;
    }
    free(mine);
    if (me == 0) {
        rc = seal(dir, partial, final, &m, &r, gbs, plan, err, errsz);
        if (!rc) prune(dir, keep, completed);
    }
    if (agree(world, rc, err, errsz)) goto fail;
    mgc_ckpt_model_free(&m);
    return 0;
fail:
    if (me == 0) unlink(partial);
    mgc_ckpt_model_free(&m);
    return -1;
}

/* ---- asynchronous save ------------------------------------------------------------------ */

/* One contiguous run of the snapshot: `len` bytes at `pos` of the snapshot, for file offset
 * `off`. */
typedef struct snap_run {
    uint64_t off;
    size_t pos, len;
} snap_run;

struct mgc_ckpt_async {
    const mgc_plan *plan;
    char dir[4200], final[4200], partial[4300];
    mgc_ckpt_model m;
    mgc_exec_resume r;
    int64_t gbs, completed, keep;
    int me;
    /* the values this rank owns, copied at the save (mgc_exec_ckpt_save through snap_put) */
    uint8_t *bytes;
    size_t n_bytes, cap_bytes;
    snap_run *runs;
    size_t n_runs, cap_runs;
    uint64_t data_offset;
    char snap_err[MSG];
    /* the thread: writing the snapshot (phase 0, every rank), checksumming its share of the
     * file (phase 1, every rank), completing and renaming it (phase 2, rank 0) */
    pthread_t th;
    int running;      /* a thread was started and not joined yet */
    atomic_int busy;  /* 1 while the thread works; it stores 0 (release) as its last act */
    int phase;        /* 0 writing, 1 checksumming, 2 sealing */
    int world;        /* ranks */
    uint32_t *crc;    /* phase 1's checksums of this rank's share */
    int rc;           /* the thread's result (read after busy is 0) */
    char err[MSG];
    double t0;        /* when the save began (CLOCK_MONOTONIC s) */
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mgc_exec_ckpt_io.put for a snapshot: the values to host memory, runs coalesced */
static int snap_put(void *ctx, const char *name, int array, uint64_t gi, const float *v, int64_t n) {
    mgc_ckpt_async *a = ctx;
    const mgc_ckpt_tensor *t = find(&a->m, name);
    if (!t || n < 0 || gi + (uint64_t)n > t->numel) {
        snprintf(a->snap_err, sizeof a->snap_err, "%.900s: elements %" PRIu64 "..%" PRIu64 " of '%.60s' are not in the model",
                 a->partial, gi, gi + (uint64_t)(n > 0 ? n : 0), name);
        return -1;
    }
    size_t len = (size_t)n * 4;
    uint64_t off = a->data_offset + t->offset + ((uint64_t)array * t->numel + gi) * 4;
    if (a->n_bytes + len > a->cap_bytes) {
        size_t cap = a->cap_bytes ? a->cap_bytes : (size_t)1 << 20;
        while (cap < a->n_bytes + len)
            cap *= 2;
        uint8_t *b = realloc(a->bytes, cap);
        if (!b) {
            snprintf(a->snap_err, sizeof a->snap_err, "out of memory copying the checkpoint's values (%zu bytes)", cap);
            return -1;
        }
        a->bytes = b, a->cap_bytes = cap;
    }
    memcpy(a->bytes + a->n_bytes, v, len);
    snap_run *last = a->n_runs ? &a->runs[a->n_runs - 1] : NULL;
    if (last && last->off + last->len == off && last->pos + last->len == a->n_bytes) {
        last->len += len;
    } else {
        if (a->n_runs == a->cap_runs) {
            size_t cap = a->cap_runs ? 2 * a->cap_runs : 256;
            snap_run *r = realloc(a->runs, cap * sizeof *r);
            if (!r) {
                snprintf(a->snap_err, sizeof a->snap_err, "out of memory copying the checkpoint's values");
                return -1;
            }
            a->runs = r, a->cap_runs = cap;
        }
        a->runs[a->n_runs++] = (snap_run){off, a->n_bytes, len};
    }
    a->n_bytes += len;
    return 0;
}

static int snap_get(void *ctx, const char *name, int array, uint64_t gi, float *v, int64_t n) {
    (void)ctx, (void)name, (void)array, (void)gi, (void)v, (void)n;
    return -1; /* a save reads nothing */
}

/* phase 0, every rank: the snapshot into the partial file, synced */
static int write_snapshot(mgc_ckpt_async *a, char *err, size_t errsz) {
    int fd = open(a->partial, O_WRONLY);
    if (fd < 0) return BAD("cannot open the checkpoint %s: %s", a->partial, strerror(errno));
    int rc = 0;
    for (size_t i = 0; i < a->n_runs && !rc; i++)
        if (pwrite_all(fd, a->bytes + a->runs[i].pos, a->runs[i].len, a->runs[i].off))
            rc = BAD("writing the checkpoint %s: %s", a->partial, strerror(errno));
    if (!rc && fsync(fd)) rc = BAD("cannot write the checkpoint %s: %s", a->partial, strerror(errno));
    if (close(fd) && !rc) rc = BAD("cannot write the checkpoint %s: %s", a->partial, strerror(errno));
    return rc;
}

/* the thread's work for the current phase; no communication */
static void async_work(mgc_ckpt_async *a) {
    if (a->phase == 0) {
        a->rc = write_snapshot(a, a->err, sizeof a->err);
        free(a->bytes), a->bytes = NULL; /* written: the memory goes back at once */
        a->n_bytes = a->cap_bytes = 0;
    } else if (a->phase == 1) {
        a->rc = checksum_share(a->partial, &a->m, a->data_offset, a->me, a->world, "reading back", &a->crc, a->err,
                               sizeof a->err);
    } else {
        a->rc = seal(a->dir, a->partial, a->final, &a->m, &a->r, a->gbs, a->plan, a->err, sizeof a->err);
        if (!a->rc) prune(a->dir, a->keep, a->completed);
    }
}

static void *async_main(void *arg) {
    mgc_ckpt_async *a = arg;
    async_work(a);
    atomic_store_explicit(&a->busy, 0, memory_order_release);
    return NULL;
}

/* Starts the current phase's work on a thread (in line when no thread can start). */
static void async_start(mgc_ckpt_async *a) {
    atomic_store(&a->busy, 1);
    if (pthread_create(&a->th, NULL, async_main, a) == 0) {
        a->running = 1;
        return;
    }
    async_main(a);
}

static void async_free(mgc_ckpt_async *a) {
    if (!a) return;
    if (a->running) pthread_join(a->th, NULL);
    mgc_ckpt_model_free(&a->m);
    free(a->bytes);
    free(a->runs);
    free(a->crc);
    free(a);
}

int mgc_ckpt_save_async(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *dir,
                        int64_t completed, int64_t keep, mgc_ckpt_async **out, char *err, size_t errsz) {
    *out = NULL;
    mgc_ckpt_async *a = calloc(1, sizeof *a);
    int rc = a ? 0 : BAD("out of memory");
    if (!rc) {
        a->plan = plan, a->completed = completed, a->keep = keep, a->me = mgc_comm_rank(world);
        a->world = mgc_comm_size(world);
        a->t0 = mono_s();
        snprintf(a->dir, sizeof a->dir, "%s", dir);
        if ((size_t)snprintf(a->final, sizeof a->final, "%s/step-%09" PRId64 ".mgck", dir, completed) >= sizeof a->final ||
            strlen(dir) >= sizeof a->dir)
            rc = BAD("the checkpoint directory path %s is too long", dir);
        snprintf(a->partial, sizeof a->partial, "%s.partial", a->final);
        mgc_exec_get_resume(x, completed, &a->r);
        a->gbs = mgc_exec_global_batch(x);
        if (!rc) rc = mgc_ckpt_model_of(plan, &a->m, err, errsz);
        if (!rc) a->data_offset = data_offset_for(table_bytes(&a->m));
    }
    if (!rc && a->me == 0) rc = create_partial(dir, a->partial, &a->m, &a->r, a->gbs, plan, err, errsz);
    if (agree(world, rc, err, errsz)) goto fail;
    /* every rank: the values it owns, copied now (the next step changes them) */
    mgc_exec_ckpt_io io = {snap_put, snap_get, a};
    rc = mgc_exec_ckpt_save(x, &io);
    if (rc) snprintf(err, errsz, "%s", a->snap_err[0] ? a->snap_err : mgc_exec_error(x));
    if (agree(world, rc, err, errsz)) goto fail;
    async_start(a);
    *out = a;
    return 0;
fail:
    if (a && a->me == 0) unlink(a->partial);
    async_free(a);
    return -1;
}

int64_t mgc_ckpt_async_step(const mgc_ckpt_async *a) {
    return a ? a->completed : 0;
}

double mgc_ckpt_async_seconds(const mgc_ckpt_async *a) {
    return a ? mono_s() - a->t0 : 0;
}

void mgc_ckpt_async_abandon(mgc_ckpt_async *a) {
    async_free(a);
}

int mgc_ckpt_async_poll(mgc_ckpt_async **ap, mgc_comm *world, int wait, char *err, size_t errsz) {
    mgc_ckpt_async *a = *ap;
    if (!a) return 0;
    int me = mgc_comm_rank(world), n = mgc_comm_size(world);
    for (;;) {
        if (a->running && (wait || !atomic_load_explicit(&a->busy, memory_order_acquire))) {
            pthread_join(a->th, NULL);
            a->running = 0;
        }
        int busy = a->running; /* joined threads are done; a running one may still be */
        float mine[2] = {busy ? 1.0f : 0.0f, !busy && a->rc ? (float)(n - me) : 0.0f}, all[2] = {0, 0};
        if (mgc_comm_all_reduce(world, mine, all, 2, MGC_DT_F32, MGC_COMM_MAX) != MGC_COMM_OK) {
            snprintf(err, errsz, "checkpoint %s: %s", a->final, mgc_comm_error(world));
            if (me == 0) {
                if (a->running) pthread_join(a->th, NULL), a->running = 0;
                unlink(a->partial);
            }
            async_free(a), *ap = NULL;
            return -1;
        }
        if (all[1] > 0) { /* some rank's part failed: every rank reports the lowest one's */
            snprintf(err, errsz, "%s", a->err);
            agree(world, !busy && a->rc, err, errsz);
            if (me == 0) {
                if (a->running) pthread_join(a->th, NULL), a->running = 0;
                unlink(a->partial);
            }
            async_free(a), *ap = NULL;
            return -1;
        }
        if (all[0] == 0) {
            if (a->phase == 2) { /* rank 0 has renamed it: complete */
                async_free(a), *ap = NULL;
                return 0;
            }
            if (a->phase == 1 && gather_checksums(world, &a->m, a->crc, err, errsz)) {
                if (me == 0) unlink(a->partial);
                async_free(a), *ap = NULL;
                return -1;
            }
            /* every rank has written: each checksums its share; then rank 0 seals */
            a->phase++;
            if (a->phase == 1 || me == 0) async_start(a);
        }
        if (!wait) return 1;
    }
}

/* A checkpoint of the plan's model from whole tensors (a converter's: mgc-import). */
int mgc_ckpt_write_model(const mgc_plan *plan, const char *path, mgc_ckpt_fill_fn fill, void *ctx,
                         char *err, size_t errsz) {
    char partial[4300], dir[4200];
    if ((size_t)snprintf(partial, sizeof partial, "%s.partial", path) >= sizeof partial)
        return BAD("the checkpoint path %s is too long", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;
    else snprintf(dir, sizeof dir, "%s", slash ? "/" : ".");
    if (access(path, F_OK) == 0) return BAD("%s exists: choose another name, or move it away first", path);
    mgc_ckpt_model m;
    mgc_exec_resume r;
    memset(&r, 0, sizeof r); /* step 0; loss scaling as the plan starts it */
    int64_t gbs = plan->micro_batch_size * plan->num_microbatches * plan->grid.dp;
    if (mgc_ckpt_model_of(plan, &m, err, errsz)) return -1;
    int rc = create_partial(dir, partial, &m, &r, gbs, plan, err, errsz);
    uint64_t most = 0;
    for (int64_t i = 0; i < m.n; i++)
        if (m.t[i].numel > most) most = m.t[i].numel;
    float *v = rc ? NULL : malloc((size_t)most * 4 + 4);
    int fd = rc ? -1 : open(partial, O_WRONLY);
    if (!rc && (!v || fd < 0)) rc = BAD(v ? "cannot open %s: %s" : "out of memory for %s", partial, strerror(errno));
    uint64_t doff = data_offset_for(table_bytes(&m));
    /* the parameters; Adam's moments stay the zeros the file was sized with */
    for (int64_t i = 0; i < m.n && !rc; i++) {
        if (fill(ctx, &m.t[i], v, err, errsz)) rc = -1;
        else if (pwrite_all(fd, v, (size_t)m.t[i].numel * 4, doff + m.t[i].offset))
            rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    }
    if (fd >= 0 && (fsync(fd) || close(fd)) && !rc) rc = BAD("cannot write the checkpoint %s: %s", partial, strerror(errno));
    uint32_t *crc = NULL; /* one writer: the whole file is its share */
    if (!rc) rc = checksum_share(partial, &m, doff, 0, 1, "reading back", &crc, err, errsz);
    for (int64_t j = 0; j < 3 * m.n && !rc; j++)
        m.t[j / 3].crc[j % 3] = crc[j];
    free(crc);
    if (!rc) rc = seal(dir, partial, path, &m, &r, gbs, plan, err, errsz);
    if (rc) unlink(partial);
    free(v);
    mgc_ckpt_model_free(&m);
    return rc;
}

/* ---- load ------------------------------------------------------------------------------------ */

/* The file holds the plan's model: the same tensors and shapes, but for the vocabulary
 * padding rows; params_only (--init-from): the expert biases may be absent on either side (a
 * model fine-tuned with or without them). */
static int match(const char *path, const mgc_ckpt_model *have, const mgc_ckpt_model *want,
                 int params_only, char *err, size_t errsz) {
    const char *hint = "resume with the model it was saved for, or give this model a checkpoint "
                       "directory of its own";
    char a[128], b[128];
    for (int64_t i = 0; i < want->n; i++) {
        const mgc_ckpt_tensor *w = &want->t[i], *h = find(have, w->name);
        if (!h && params_only && is_bias(w->name)) continue;
        if (!h)
            return BAD("%s has no %s '%s', which this plan's model has: %s", path,
                       is_bias(w->name) ? "expert bias" : "parameter", w->name, hint);
        int same = h->rank == w->rank && h->vocab == w->vocab;
        for (int d = 0; d < w->rank && same; d++)
            same = h->dim[d] == w->dim[d] || (d == 0 && w->vocab);
        if (!same)
            return BAD("'%s' is %s in %s but %s in this plan's model: %s", w->name, shape(h, a, sizeof a),
                       path, shape(w, b, sizeof b), hint);
    }
    for (int64_t i = 0; i < have->n; i++)
        if (!find(want, have->t[i].name) && !(params_only && is_bias(have->t[i].name)))
            return BAD("%s has %s '%s' that this plan's model lacks: %s", path,
                       is_bias(have->t[i].name) ? "an expert bias" : "a parameter", have->t[i].name,
                       hint);
    return 0;
}

int mgc_ckpt_load(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *path,
                  int params_only, mgc_exec_resume *r, char *err, size_t errsz) {
    mgc_ckpt_info info;
    mgc_ckpt_model want = {0, NULL};
    memset(&info, 0, sizeof info);
    int rc = mgc_ckpt_read_info(path, &info, err, errsz);
    if (!rc) rc = mgc_ckpt_model_of(plan, &want, err, errsz);
    int64_t vocab = 0;
    mgc_plan_config_int(plan, "model.vocab_size", &vocab);
    if (!rc && info.vocab_size != vocab)
        rc = BAD("%s was saved for a vocabulary of %" PRId64 " tokens, this plan's model has %" PRId64
                 ": resume with the model it was saved for, or give this model a checkpoint "
                 "directory of its own",
                 path, info.vocab_size, vocab);
    if (!rc) rc = match(path, &info.model, &want, params_only, err, errsz);
    /* every rank verifies its share of the checksums before any rank reads a value */
    if (!rc) rc = verify_share(path, &info, mgc_comm_rank(world), mgc_comm_size(world), err, errsz);
    if (agree(world, rc, err, errsz)) {
        rc = -1;
        goto done;
    }
    io_ctx c = {open(path, O_RDONLY), &info.model, info.data_offset, path, "", params_only};
    if (c.fd < 0) {
        rc = BAD("cannot open the checkpoint %s: %s", path, strerror(errno));
    } else {
        mgc_exec_ckpt_io io = {io_put, io_get, &c};
        rc = mgc_exec_ckpt_load(x, &io, params_only);
        if (rc) snprintf(err, errsz, "%s", c.err[0] ? c.err : mgc_exec_error(x));
        close(c.fd);
    }
    if (agree(world, rc, err, errsz)) {
        rc = -1;
        goto done;
    }
    if (!params_only) *r = info.resume;
    rc = 0;
done:
    mgc_ckpt_info_free(&info);
    mgc_ckpt_model_free(&want);
    return rc ? -1 : 0;
}
