/* memplan.c - see memplan.h and docs/memory-plan.md.
 *
 * Sections: sorting helpers; the offset assigner (greedy by size, best fit,
 * an interval index over time); the stage builder (instruction index,
 * parameter layout, pass workspaces, per-microbatch buffers, placement,
 * peak breakdown). */
#include "memplan.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- sorting ----------------------------------------------------------------
 * Stable LSD radix sort of (key, val) pairs on 64-bit keys, 8 bits a pass;
 * passes where every key has the same byte are skipped, so small keys cost
 * two or three passes.  Stable sorts compose: sorting by the least
 * significant key first gives a lexicographic order. */

typedef struct kv {
    uint64_t key;
    uint64_t val;
} kv;

static void insertion_sort(kv *a, size_t n) {
    for (size_t i = 1; i < n; i++) {
        kv x = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1].key > x.key) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Unstable, deterministic quicksort (median of three, insertion sort below
 * 24): the overlap lists, where equal keys need no order. */
static void quick_sort(kv *a, size_t n) {
    while (n > 24) {
        size_t m = n / 2, l = n - 1;
        if (a[m].key < a[0].key) { kv t = a[m]; a[m] = a[0]; a[0] = t; }
        if (a[l].key < a[0].key) { kv t = a[l]; a[l] = a[0]; a[0] = t; }
        if (a[l].key < a[m].key) { kv t = a[l]; a[l] = a[m]; a[m] = t; }
        uint64_t pivot = a[m].key;
        size_t i = 0, j = l;
        for (;;) {
            while (a[i].key < pivot) i++;
            while (a[j].key > pivot) j--;
            if (i >= j) break;
            kv t = a[i];
            a[i] = a[j];
            a[j] = t;
            i++, j--;
        }
        /* [0, j] <= pivot <= [j+1, n): recurse into the smaller side */
        if (j + 1 < n - j - 1) {
            quick_sort(a, j + 1);
            a += j + 1, n -= j + 1;
        } else {
            quick_sort(a + j + 1, n - j - 1);
            n = j + 1;
        }
    }
    insertion_sort(a, n);
}

/* tmp: n entries of scratch. */
static void radix_sort(kv *a, kv *tmp, size_t n) {
    if (n < 48) {
        insertion_sort(a, n);
        return;
    }
    uint64_t all = ~UINT64_C(0), any = 0;
    for (size_t i = 0; i < n; i++) all &= a[i].key, any |= a[i].key;
    uint64_t varies = all ^ any; /* bits that differ between keys */
    int bytes[8], nb = 0;
    for (int b = 0; b < 8; b++)
        if ((varies >> (8 * b)) & 0xff) bytes[nb++] = b;
    size_t count[8][256];
    memset(count, 0, (size_t)nb * sizeof count[0]);
    for (size_t i = 0; i < n; i++) {
        uint64_t k = a[i].key;
        for (int j = 0; j < nb; j++) count[j][(k >> (8 * bytes[j])) & 0xff]++;
    }
    kv *src = a, *dst = tmp;
    for (int j = 0; j < nb; j++) {
        size_t *c = count[j], sum = 0;
        int sh = 8 * bytes[j];
        for (int v = 0; v < 256; v++) {
            size_t t = c[v];
            c[v] = sum;
            sum += t;
        }
        for (size_t i = 0; i < n; i++) dst[c[(src[i].key >> sh) & 0xff]++] = src[i];
        kv *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

/* int64 -> uint64 preserving order. */
static uint64_t okey(int64_t v) {
    return (uint64_t)v ^ (UINT64_C(1) << 63);
}

/* v rounded up to a multiple of a power of two */
static uint64_t align_up(uint64_t v, uint64_t a) {
    return (v + (a - 1)) & ~(a - 1);
}

/* v rounded up to a multiple of any a > 0 */
static uint64_t round_up(uint64_t v, uint64_t a) {
    return (v + (a - 1)) / a * a;
}

/* ---- the offset assigner ----------------------------------------------------- */

const char *mgc_memplan_status_name(mgc_memplan_status s) {
    switch (s) {
    case MGC_MEMPLAN_OK: return "ok";
    case MGC_MEMPLAN_ERR_NOMEM: return "out of memory";
    case MGC_MEMPLAN_ERR_INVALID: return "invalid request";
    case MGC_MEMPLAN_ERR_OVERFLOW: return "arena above 2^64 bytes";
    }
    return "?";
}

/* A live interval of one request, in the begin-sorted segment table. */
typedef struct seg {
    int64_t begin, end;
    int64_t req;
} seg;

/* Finding the placed requests whose lifetimes overlap a segment [b, e) takes
 * two indexes, so that the cost follows k, the number found:
 *
 *   - those live at time b (begin <= b < end): a segment tree over the
 *     elementary time intervals; a placed segment is appended to the lists
 *     of its O(log T) canonical nodes, and the nodes on the path from the
 *     leaf of b to the root list exactly the segments covering b, each once;
 *   - those beginning inside (b, e): a max tree over the begin-sorted
 *     segment table whose leaf holds the segment's end once placed
 *     (INT64_MIN before); a descent over the positions of (b, e) that prunes
 *     subtrees with nothing placed finds them.
 *
 * Time lists are laid out once (CSR) from a counting pass over every
 * segment, so placing never allocates. */

typedef struct assign_ctx {
    const mgc_memreq *req;
    uint64_t *offsets;
    const seg *segs; /* (m) sorted by begin */
    size_t m;
    /* the begin-sorted max tree */
    int64_t *tree; /* (2 * cap) */
    size_t cap;    /* leaves, a power of two >= m */
    /* the time segment tree */
    size_t P;           /* leaves, a power of two >= distinct times */
    size_t *start;      /* (2P + 1) node i lists items[start[i] .. fill[i]) */
    size_t *fill;       /* (2P) */
    int64_t *items;     /* request ids */
    int64_t *tv;        /* (T) the distinct times, ascending: leaf j is [tv[j], tv[j+1]) */
    size_t T;
    size_t *tlo, *thi;  /* (m) a segment's leaf range [tlo, thi) */
    size_t *pos_of;     /* (T + 1) first begin-sorted position whose segment begins at leaf >= j */
    kv *placed;         /* (n) (offset, end) of each placed request */
    /* the overlap set of the current request, kept sorted by offset from one
     * request to the next: consecutive requests (equal sizes in time order)
     * overlap mostly the same buffers, so only the newcomers need sorting */
    kv *cur, *cur2;     /* (n) (offset, request) sorted; cur2 scratch */
    size_t cur_n;
    kv *fresh;          /* (n) found now, not in cur */
    size_t fresh_n, found;
    uint32_t *mark;     /* (n) generation a request was last found in */
    uint8_t *in_cur;    /* (n) */
    uint32_t gen;
    kv *glob;           /* placed requests live over the whole timeline, sorted by offset:
                           they overlap everything, so they stay out of the indexes */
    size_t glob_n;
} assign_ctx;

static void tree_set(assign_ctx *a, size_t pos, int64_t end) {
    size_t i = a->cap + pos;
    a->tree[i] = end;
    for (i >>= 1; i >= 1; i >>= 1) {
        int64_t m = a->tree[2 * i] > a->tree[2 * i + 1] ? a->tree[2 * i] : a->tree[2 * i + 1];
        if (a->tree[i] == m) break;
        a->tree[i] = m;
    }
}

static void found(assign_ctx *a, int64_t r) {
    if (a->mark[r] == a->gen) return; /* seen through another segment */
    a->mark[r] = a->gen;
    a->found++;
    if (a->in_cur[r]) return;
    a->fresh[a->fresh_n].key = a->placed[r].key;
    a->fresh[a->fresh_n].val = (uint64_t)r;
    a->fresh_n++;
}

/* cur := the requests found in this generation, sorted by offset. */
static void update_cur(assign_ctx *a) {
    size_t w = 0;
    for (size_t i = 0; i < a->cur_n; i++) {
        if (a->mark[a->cur[i].val] == a->gen) a->cur[w++] = a->cur[i];
        else a->in_cur[a->cur[i].val] = 0;
    }
    quick_sort(a->fresh, a->fresh_n);
    size_t i = 0, j = 0, k = 0;
    while (i < w || j < a->fresh_n) {
        if (j == a->fresh_n || (i < w && a->cur[i].key <= a->fresh[j].key)) a->cur2[k++] = a->cur[i++];
        else a->in_cur[a->fresh[j].val] = 1, a->cur2[k++] = a->fresh[j++];
    }
    kv *t = a->cur;
    a->cur = a->cur2;
    a->cur2 = t;
    a->cur_n = k;
}

/* Placed segments at begin-sorted positions [lo, hi). */
static void collect_range(assign_ctx *a, size_t lo, size_t hi) {
    if (hi <= lo + 32) { /* short: the leaves themselves */
        for (size_t p = lo; p < hi; p++)
            if (a->tree[a->cap + p] != INT64_MIN) found(a, a->segs[p].req);
        return;
    }
    struct {
        size_t node, lo, w;
    } stack[130];
    int sp = 0;
    stack[sp].node = 1, stack[sp].lo = 0, stack[sp].w = a->cap, sp++;
    while (sp > 0) {
        sp--;
        size_t node = stack[sp].node, l = stack[sp].lo, w = stack[sp].w;
        if (l >= hi || l + w <= lo || a->tree[node] == INT64_MIN) continue;
        if (w == 1) {
            found(a, a->segs[l].req);
            continue;
        }
        w /= 2;
        stack[sp].node = 2 * node + 1, stack[sp].lo = l + w, stack[sp].w = w, sp++;
        stack[sp].node = 2 * node, stack[sp].lo = l, stack[sp].w = w, sp++;
    }
}

/* Placed segments covering time leaf j. */
static void collect_stab(assign_ctx *a, size_t j) {
    for (size_t i = a->P + j; i >= 1; i >>= 1)
        for (size_t q = a->start[i]; q < a->fill[i]; q++) found(a, a->items[q]);
}

/* The canonical nodes of leaf range [l, r): count (items == NULL) or append r. */
static void time_cover(assign_ctx *a, size_t l, size_t r, int64_t req, int count) {
    for (l += a->P, r += a->P; l < r; l >>= 1, r >>= 1) {
        if (l & 1) {
            if (count) a->start[l + 1]++;
            else a->items[a->fill[l]++] = req;
            l++;
        }
        if (r & 1) {
            --r;
            if (count) a->start[r + 1]++;
            else a->items[a->fill[r]++] = req;
        }
    }
}

/* First position in a sorted array of n values with value >= t (or > t). */
static size_t lower_bound_i64(const int64_t *v, size_t n, int64_t t, int strict) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid] < t || (strict && v[mid] == t)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Build both indexes over the m segments; 0 or -1 on OOM. */
static int index_init(assign_ctx *a) {
    size_t m = a->m;
    a->cap = 1;
    while (a->cap < m) a->cap *= 2;
    a->tree = malloc(2 * a->cap * sizeof *a->tree);
    int64_t *tv = a->tv = malloc(2 * m * sizeof *tv);
    kv *k = malloc(2 * m * sizeof *k), *tmp = malloc(2 * m * sizeof *tmp);
    a->tlo = malloc(m * sizeof *a->tlo);
    a->thi = malloc(m * sizeof *a->thi);
    int rc = -1;
    if (!a->tree || !tv || !k || !tmp || !a->tlo || !a->thi) goto out;
    for (size_t i = 0; i < 2 * a->cap; i++) a->tree[i] = INT64_MIN;
    /* distinct times */
    for (size_t i = 0; i < m; i++) {
        k[2 * i].key = okey(a->segs[i].begin), k[2 * i].val = 0;
        k[2 * i + 1].key = okey(a->segs[i].end), k[2 * i + 1].val = 0;
    }
    radix_sort(k, tmp, 2 * m);
    size_t T = 0;
    for (size_t i = 0; i < 2 * m; i++)
        if (!T || k[i].key != k[i - 1].key) tv[T++] = (int64_t)(k[i].key ^ (UINT64_C(1) << 63));
    a->T = T;
    a->P = 1;
    while (a->P < T) a->P *= 2;
    a->start = calloc(2 * a->P + 1, sizeof *a->start);
    a->fill = malloc(2 * a->P * sizeof *a->fill);
    if (!a->start || !a->fill) goto out;
    a->pos_of = malloc((T + 1) * sizeof *a->pos_of);
    if (!a->pos_of) goto out;
    for (size_t i = 0, j = 0; i < m; i++) { /* begins ascend with i: walk */
        while (tv[j] < a->segs[i].begin) j++;
        a->tlo[i] = j;
        a->thi[i] = lower_bound_i64(tv, T, a->segs[i].end, 0);
        time_cover(a, a->tlo[i], a->thi[i], 0, 1);
    }
    for (size_t j = 0, i = 0; j <= T; j++) {
        while (i < m && a->tlo[i] < j) i++;
        a->pos_of[j] = i;
    }
    for (size_t i = 0; i < 2 * a->P; i++) a->start[i + 1] += a->start[i];
    memcpy(a->fill, a->start, 2 * a->P * sizeof *a->fill);
    a->items = malloc((a->start[2 * a->P] ? a->start[2 * a->P] : 1) * sizeof *a->items);
    if (!a->items) goto out;
    rc = 0;
out:
    free(k);
    free(tmp);
    return rc;
}

/* Max over the time leaves of the live bytes (a difference array). */
static int index_lower_bound(const assign_ctx *a, uint64_t *lb, int64_t *peak) {
    uint64_t *delta = calloc(a->T + 1, sizeof *delta);
    if (!delta) return -1;
    for (size_t p = 0; p < a->m; p++) {
        uint64_t bytes = a->req[a->segs[p].req].bytes;
        delta[a->tlo[p]] += bytes;
        delta[a->thi[p]] -= bytes; /* wraps; the prefix sums do not */
    }
    uint64_t cur = 0, best = 0;
    int64_t at = -1;
    for (size_t j = 0; j < a->T; j++) {
        cur += delta[j];
        if (cur > best) best = cur, at = a->tv[j];
    }
    free(delta);
    *lb = best;
    *peak = at;
    return 0;
}

static void index_free(assign_ctx *a) {
    free(a->tree);
    free(a->start);
    free(a->fill);
    free(a->items);
    free(a->tv);
    free(a->pos_of);
    free(a->tlo);
    free(a->thi);
    free(a->placed);
    free(a->cur);
    free(a->cur2);
    free(a->fresh);
    free(a->mark);
    free(a->in_cur);
    free(a->glob);
}

/* Max over time of live bytes of the segments (disjoint per request). */
static mgc_memplan_status lower_bound_of(const seg *s, size_t m, const mgc_memreq *req, uint64_t *lb,
                                         int64_t *peak) {
    *lb = 0;
    *peak = -1;
    if (m == 0) return MGC_MEMPLAN_OK;
    kv *ev = malloc(2 * m * sizeof *ev), *tmp = malloc(2 * m * sizeof *tmp);
    if (!ev || !tmp) {
        free(ev);
        free(tmp);
        return MGC_MEMPLAN_ERR_NOMEM;
    }
    /* ends first, so that at equal times ends sort before begins (stable) */
    for (size_t i = 0; i < m; i++) ev[i].key = okey(s[i].end), ev[i].val = 2 * (uint64_t)s[i].req;
    for (size_t i = 0; i < m; i++) ev[m + i].key = okey(s[i].begin), ev[m + i].val = 2 * (uint64_t)s[i].req + 1;
    radix_sort(ev, tmp, 2 * m);
    uint64_t cur = 0, best = 0;
    int64_t at = -1;
    for (size_t i = 0; i < 2 * m; i++) {
        uint64_t bytes = req[ev[i].val / 2].bytes;
        if (ev[i].val & 1) {
            cur += bytes;
            if (cur > best) best = cur, at = (int64_t)(ev[i].key ^ (UINT64_C(1) << 63));
        } else {
            cur -= bytes;
        }
    }
    free(ev);
    free(tmp);
    *lb = best;
    *peak = at;
    return MGC_MEMPLAN_OK;
}

/* The live segments (non-empty, of requests with bytes), sorted by begin then
 * request; validates the inputs.  *out is malloc'd (NULL when m == 0). */
static mgc_memplan_status build_segs(const mgc_memreq *req, size_t n, const mgc_memseg *extra, size_t n_extra,
                                     seg **out, size_t *m_out) {
    *out = NULL;
    *m_out = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = req[i].align ? req[i].align : MGC_PLAN_ALIGN;
        if (a & (a - 1)) return MGC_MEMPLAN_ERR_INVALID;
        if (req[i].live_end < req[i].live_begin) return MGC_MEMPLAN_ERR_INVALID;
        if (req[i].bytes > UINT64_MAX - a) return MGC_MEMPLAN_ERR_OVERFLOW;
        m += req[i].bytes && req[i].live_end > req[i].live_begin;
    }
    for (size_t i = 0; i < n_extra; i++) {
        if (extra[i].req < 0 || (uint64_t)extra[i].req >= n || extra[i].end < extra[i].begin)
            return MGC_MEMPLAN_ERR_INVALID;
        m += req[extra[i].req].bytes && extra[i].end > extra[i].begin;
    }
    if (m == 0) return MGC_MEMPLAN_OK;
    seg *s = malloc(m * sizeof *s);
    kv *k = malloc(m * sizeof *k), *tmp = malloc(m * sizeof *tmp);
    if (!s || !k || !tmp) {
        free(s);
        free(k);
        free(tmp);
        return MGC_MEMPLAN_ERR_NOMEM;
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (req[i].bytes && req[i].live_end > req[i].live_begin)
            s[j].begin = req[i].live_begin, s[j].end = req[i].live_end, s[j].req = (int64_t)i, j++;
    for (size_t i = 0; i < n_extra; i++)
        if (req[extra[i].req].bytes && extra[i].end > extra[i].begin)
            s[j].begin = extra[i].begin, s[j].end = extra[i].end, s[j].req = extra[i].req, j++;
    /* by begin; ties keep the order above (requests, then extra intervals) */
    for (size_t i = 0; i < m; i++) k[i].key = okey(s[i].begin), k[i].val = i;
    radix_sort(k, tmp, m);
    seg *t = malloc(m * sizeof *t);
    if (!t) {
        free(s);
        free(k);
        free(tmp);
        return MGC_MEMPLAN_ERR_NOMEM;
    }
    for (size_t i = 0; i < m; i++) t[i] = s[k[i].val];
    free(s);
    free(k);
    free(tmp);
    *out = t;
    *m_out = m;
    return MGC_MEMPLAN_OK;
}

mgc_memplan_status mgc_memplan_lower_bound(const mgc_memreq *req, size_t n, uint64_t *lower_bound_bytes,
                                           int64_t *peak_time) {
    seg *s = NULL;
    size_t m = 0;
    uint64_t lb = 0;
    int64_t at = -1;
    mgc_memplan_status rc = build_segs(req, n, NULL, 0, &s, &m);
    if (rc == MGC_MEMPLAN_OK) rc = lower_bound_of(s, m, req, &lb, &at);
    free(s);
    if (lower_bound_bytes) *lower_bound_bytes = lb;
    if (peak_time) *peak_time = at;
    return rc;
}

mgc_memplan_status mgc_memplan_assign_segs(const mgc_memreq *req, size_t n, const mgc_memseg *extra, size_t n_extra,
                                           uint64_t *offsets, uint64_t *arena_bytes, mgc_memplan_stats *stats) {
    seg *segs = NULL;
    size_t m = 0;
    size_t *first = NULL, *list = NULL;
    kv *order = NULL, *tmp = NULL;
    assign_ctx a;
    memset(&a, 0, sizeof a);
    uint64_t arena = 0, lb = 0, overlaps = 0;
    int64_t peak = -1;
    if (arena_bytes) *arena_bytes = 0;
    if (stats) memset(stats, 0, sizeof *stats), stats->peak_time = -1;
    mgc_memplan_status rc = build_segs(req, n, extra, n_extra, &segs, &m);
    if (rc) goto done;
    for (size_t i = 0; i < n; i++) offsets[i] = 0;
    if (m == 0) goto done;
    rc = MGC_MEMPLAN_ERR_NOMEM;

    /* each request's segments, in begin order (CSR); they must not overlap */
    first = calloc(n + 1, sizeof *first);
    list = malloc(m * sizeof *list);
    if (!first || !list) goto done;
    for (size_t p = 0; p < m; p++) first[segs[p].req + 1]++;
    for (size_t i = 0; i < n; i++) first[i + 1] += first[i];
    {
        size_t *fill = malloc(n * sizeof *fill);
        if (!fill) goto done;
        memcpy(fill, first, n * sizeof *fill);
        for (size_t p = 0; p < m; p++) list[fill[segs[p].req]++] = p;
        free(fill);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t q = first[i] + 1; q < first[i + 1]; q++)
            if (segs[list[q]].begin < segs[list[q - 1]].end) {
                rc = MGC_MEMPLAN_ERR_INVALID;
                goto done;
            }


    a.req = req;
    a.offsets = offsets;
    a.segs = segs;
    a.m = m;
    a.placed = malloc(n * sizeof *a.placed);
    a.glob = malloc(n * sizeof *a.glob);
    a.cur = malloc(n * sizeof *a.cur);
    a.cur2 = malloc(n * sizeof *a.cur2);
    a.fresh = malloc(n * sizeof *a.fresh);
    a.mark = calloc(n, sizeof *a.mark);
    a.in_cur = calloc(n, sizeof *a.in_cur);
    if (!a.placed || !a.glob || !a.cur || !a.cur2 || !a.fresh || !a.mark || !a.in_cur || index_init(&a) ||
        index_lower_bound(&a, &lb, &peak))
        goto done;
    /* greedy by size: bytes descending, then first begin, then longer
     * lifetime (in time leaves), then index -- stable sorts, least
     * significant key first */
    size_t nl = 0;
    for (size_t i = 0; i < n; i++) nl += first[i + 1] > first[i];
    order = malloc(nl * sizeof *order);
    tmp = malloc(nl * sizeof *tmp);
    if (!order || !tmp) goto done;
    nl = 0;
    for (size_t i = 0; i < n; i++) {
        if (first[i + 1] == first[i]) continue;
        uint64_t life = 0;
        for (size_t q = first[i]; q < first[i + 1]; q++) life += a.thi[list[q]] - a.tlo[list[q]];
        if (life > UINT32_MAX) life = UINT32_MAX;
        order[nl].key = (uint64_t)a.tlo[list[first[i]]] << 32 | (UINT32_MAX - life);
        order[nl].val = i, nl++;
    }
    radix_sort(order, tmp, nl);
    for (size_t i = 0; i < nl; i++) order[i].key = ~req[order[i].val].bytes;
    radix_sort(order, tmp, nl);

    int64_t tmin = segs[0].begin, tmax = segs[0].end;
    for (size_t p = 1; p < m; p++)
        if (segs[p].end > tmax) tmax = segs[p].end;

    for (size_t oi = 0; oi < nl; oi++) {
        size_t r = (size_t)order[oi].val;
        uint64_t bytes = req[r].bytes, al = req[r].align ? req[r].align : MGC_PLAN_ALIGN;
        a.gen++;
        a.fresh_n = a.found = 0;
        int global = 0;
        for (size_t q = first[r]; q < first[r + 1]; q++) {
            size_t p = list[q];
            global |= segs[p].begin == tmin && segs[p].end == tmax;
            collect_stab(&a, a.tlo[p]);
            collect_range(&a, a.pos_of[a.tlo[p] + 1], a.pos_of[a.thi[p]]);
        }
        update_cur(&a);
        overlaps += a.found + a.glob_n;
        /* best fit: the smallest gap between overlapping buffers (in address
         * order: the sorted overlap list merged with the global ones) that
         * holds the request; else above the highest of them */
        uint64_t prev_end = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
        for (size_t i = 0, j = 0; i < a.cur_n || j < a.glob_n;) {
            const kv *x = j == a.glob_n || (i < a.cur_n && a.cur[i].key < a.glob[j].key) ? &a.placed[a.cur[i++].val]
                                                                                           : &a.glob[j++];
            uint64_t start = align_up(prev_end, al);
            if (start >= prev_end && x->key >= start && x->key - start >= bytes) {
                uint64_t gap = x->key - prev_end;
                if (gap < best_gap) best_gap = gap, best = start;
            }
            if (x->val > prev_end) prev_end = x->val;
        }
        if (best == UINT64_MAX) {
            best = align_up(prev_end, al);
            if (best < prev_end || best > UINT64_MAX - bytes) {
                rc = MGC_MEMPLAN_ERR_OVERFLOW;
                goto done;
            }
        }
        offsets[r] = best;
        a.placed[r].key = best;
        a.placed[r].val = best + bytes;
        if (best + bytes > arena) arena = best + bytes;
        if (global) { /* into the sorted global list */
            size_t at = a.glob_n;
            while (at > 0 && a.glob[at - 1].key > best) at--;
            memmove(&a.glob[at + 1], &a.glob[at], (a.glob_n - at) * sizeof *a.glob);
            a.glob[at] = a.placed[r];
            a.glob_n++;
            continue;
        }
        for (size_t q = first[r]; q < first[r + 1]; q++) {
            size_t p = list[q];
            tree_set(&a, p, segs[p].end);
            time_cover(&a, a.tlo[p], a.thi[p], (int64_t)r, 0);
        }
    }
    if (arena > UINT64_MAX - MGC_PLAN_ALIGN) {
        rc = MGC_MEMPLAN_ERR_OVERFLOW;
        goto done;
    }
    arena = align_up(arena, MGC_PLAN_ALIGN);
    rc = MGC_MEMPLAN_OK;
done:
    if (rc == MGC_MEMPLAN_OK) {
        if (arena_bytes) *arena_bytes = arena;
        if (stats) {
            stats->arena_bytes = arena;
            stats->lower_bound_bytes = lb;
            stats->peak_time = peak;
            stats->overlaps = overlaps;
        }
    }
    free(segs);
    free(first);
    free(list);
    free(order);
    free(tmp);
    index_free(&a);
    return rc;
}

mgc_memplan_status mgc_memplan_assign(const mgc_memreq *req, size_t n, uint64_t *offsets, uint64_t *arena_bytes,
                                      mgc_memplan_stats *stats) {
    return mgc_memplan_assign_segs(req, n, NULL, 0, offsets, arena_bytes, stats);
}

/* ---- the stage builder ---------------------------------------------------------
 * One pass over the instruction stream indexes every (mb, chunk)'s forward
 * and backward; the parameters are laid out flat (per chunk, a dense then an
 * expert section); each chunk's transient tensors are packed on the timeline
 * of its own forward + backward op lists; then every buffer of the rank is
 * one request on the instruction timeline for the assigner. */

/* Where a tensor goes, before buffer indices exist. */
enum { CAT_NONE = 0, CAT_WEIGHT, CAT_GRAD, CAT_ACT, CAT_INPUT, CAT_STASH };

typedef struct tplace {
    uint8_t cat;  /* CAT_* */
    uint64_t off; /* offset inside the buffer of that category */
} tplace;

/* How a chunk's ops touch a tensor. */
typedef struct use {
    int32_t first[2], last[2]; /* op index per pass (0 forward, 1 backward); -1 untouched */
    uint8_t first_read[2];     /* the first touch reads it: live from the pass start */
    uint8_t last_write[2];     /* the last touch writes it: live to the pass end */
    uint8_t expert;            /* touched by a grouped (expert) linear */
} use;

typedef struct builder {
    const mgc_config *c;
    const mgc_grid *g;
    mgc_plan *plan;
    mgc_stage_program *sp;
    mgc_diags *d;
    mgc_loc loc;
    int64_t n;                 /* instructions */
    int64_t M, V;              /* microbatches seen (max mb + 1), chunks */
    int64_t *fwd, *bwd;        /* (M * V) instruction of FORWARD / BACKWARD of (mb, c); -1 none */
    int64_t *load;             /* (M) first LOAD_BATCH of mb; -1 none */
    int64_t first_compute, last_compute; /* -1 when none */
    uint64_t wsize;            /* compute dtype bytes */
    use **uses;                /* [chunk][tensor] */
    tplace **place;            /* [chunk][tensor] */
    /* the growing buffer list and its requests */
    mgc_buffer *buf;
    mgc_memreq *req;
    int64_t nb, cap;
} builder;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(builder *b, const char *hint, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mgc_diag(b->d, MGC_SEV_ERROR, b->loc, hint, "memory plan of pipeline rank %" PRId64 ": %s", b->sp->pp_rank, msg);
    return -1;
}

/* Instruction names for messages (plan.h's table is not declared there yet). */
static const char *instr_name(unsigned op) {
    static const char *const names[] = {"LOAD_BATCH", "FORWARD", "BACKWARD", "SEND_ACT", "RECV_ACT", "SEND_GRAD",
                                        "RECV_GRAD", "REDUCE_GRADS", "EMBED_GRADS", "OPTIMIZER", "GATHER_PARAMS"};
    return op < sizeof names / sizeof *names ? names[op] : "?";
}

static int oom(builder *b) {
    return fail(b, NULL, "out of memory");
}

#define BUG_HINT "the stage program breaks the partition/schedule contract (plan/plan.h): a compiler bug"

static uint32_t name_of(builder *b, const char *s) {
    if (!b->plan) return 0;
    uint32_t off = mgc_plan_str(b->plan, s);
    return off == UINT32_MAX ? 0 : off;
}

static const char *tensor_name(const builder *b, const mgc_plan_tensor *t) {
    const char *s = b->plan ? mgc_plan_strat(b->plan, t->name) : NULL;
    return s && s[0] ? s : "(unnamed)";
}

/* Append a buffer and its request; its index, or -1 on OOM. */
static int64_t buf_add(builder *b, mgc_buf_kind kind, int64_t chunk, int64_t mb, uint32_t name, uint64_t bytes,
                       int64_t begin, int64_t end) {
    if (b->nb == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 64;
        mgc_buffer *v = realloc(b->buf, (size_t)cap * sizeof *v);
        if (v) b->buf = v;
        mgc_memreq *r = realloc(b->req, (size_t)cap * sizeof *r);
        if (r) b->req = r;
        if (!v || !r) return -1;
        b->cap = cap;
    }
    mgc_buffer *x = &b->buf[b->nb];
    memset(x, 0, sizeof *x);
    x->name = name;
    x->kind = (uint16_t)kind;
    x->chunk = chunk < 0 ? 0xffffu : (uint16_t)chunk;
    x->mb = (int32_t)mb;
    x->bytes = bytes;
    x->live_begin = begin;
    x->live_end = end;
    b->req[b->nb] = (mgc_memreq){bytes, begin, end, MGC_PLAN_ALIGN};
    return b->nb++;
}

uint64_t mgc_memplan_boundary_bytes(const mgc_config *c, const mgc_grid *grid) {
    uint64_t wsize = c->training.precision == MGC_PREC_FP32 ? 4 : 2;
    int64_t cp = grid->cp > 0 ? grid->cp : 1, tp = grid->tp > 0 ? grid->tp : 1;
    uint64_t v = (uint64_t)(c->model.seq_length / cp) * (uint64_t)c->training.micro_batch_size *
                 (uint64_t)c->model.hidden_size * wsize;
    if (c->derived.sequence_parallel && tp > 1) v /= (uint64_t)tp;
    return v;
}

/* ---- instruction index ---- */

static int index_stream(builder *b) {
    const mgc_stage_program *sp = b->sp;
    int64_t maxmb = -1;
    b->first_compute = b->last_compute = -1;
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        if (in->op >= MGC_I__COUNT)
            return fail(b, BUG_HINT, "instruction %" PRId64 " has unknown op %u", i, in->op);
        if (in->op <= MGC_I_RECV_GRAD) {
            if (in->mb < 0)
                return fail(b, BUG_HINT, "instruction %" PRId64 " (%s) has no microbatch", i,
                            instr_name(in->op));
            if (in->chunk >= b->V)
                return fail(b, BUG_HINT, "instruction %" PRId64 " names chunk %u of %" PRId64, i, in->chunk, b->V);
            if (in->mb > maxmb) maxmb = in->mb;
        }
        if (in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD) {
            if (b->first_compute < 0) b->first_compute = i;
            b->last_compute = i;
        }
    }
    b->M = maxmb + 1;
    size_t pairs = (size_t)(b->M * b->V);
    b->fwd = malloc((pairs ? pairs : 1) * sizeof *b->fwd);
    b->bwd = malloc((pairs ? pairs : 1) * sizeof *b->bwd);
    b->load = malloc((b->M ? (size_t)b->M : 1) * sizeof *b->load);
    if (!b->fwd || !b->bwd || !b->load) return oom(b);
    for (size_t i = 0; i < pairs; i++) b->fwd[i] = b->bwd[i] = -1;
    for (int64_t m = 0; m < b->M; m++) b->load[m] = -1;
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int64_t k = (int64_t)in->mb * b->V + in->chunk;
        switch (in->op) {
        case MGC_I_LOAD_BATCH:
            if (b->load[in->mb] < 0) b->load[in->mb] = i;
            break;
        case MGC_I_FORWARD:
            if (b->fwd[k] >= 0)
                return fail(b, BUG_HINT,
                            "microbatch %" PRId32 " chunk %u is forwarded twice (instructions %" PRId64 " and %" PRId64
                            ")",
                            in->mb, in->chunk, b->fwd[k], i);
            b->fwd[k] = i;
            break;
        case MGC_I_BACKWARD:
            if (b->bwd[k] >= 0)
                return fail(b, BUG_HINT,
                            "microbatch %" PRId32 " chunk %u is run backward twice (instructions %" PRId64
                            " and %" PRId64 ")",
                            in->mb, in->chunk, b->bwd[k], i);
            if (b->fwd[k] < 0)
                return fail(b, BUG_HINT,
                            "instruction %" PRId64 ": backward of microbatch %" PRId32 " chunk %u before its forward",
                            i, in->mb, in->chunk);
            b->bwd[k] = i;
            break;
        default: break;
        }
    }
    for (int64_t k = 0; k < b->M * b->V; k++)
        if ((b->fwd[k] >= 0) != (b->bwd[k] >= 0))
            return fail(b, BUG_HINT, "microbatch %" PRId64 " chunk %" PRId64 " is forwarded but never run backward",
                        k / b->V, k % b->V);
    return 0;
}

/* ---- how ops touch tensors ---- */

static void touch(use *u, int pass, int32_t op, int read) {
    if (u->first[pass] < 0) u->first[pass] = op, u->first_read[pass] = (uint8_t)read;
    u->last[pass] = op;
    u->last_write[pass] = (uint8_t)!read;
}

static int is_grouped(uint16_t kind) {
    return kind == MGC_POP_GROUPED_LINEAR || kind == MGC_POP_GROUPED_LINEAR_DGRAD ||
           kind == MGC_POP_GROUPED_LINEAR_WGRAD;
}

static int chunk_uses(builder *b, int64_t c) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
    use *u = b->uses[c] = malloc(nt * sizeof *u);
    b->place[c] = calloc(nt, sizeof *b->place[c]);
    if (!u || !b->place[c]) return oom(b);
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        u[t].first[0] = u[t].first[1] = u[t].last[0] = u[t].last[1] = -1;
        u[t].first_read[0] = u[t].first_read[1] = u[t].last_write[0] = u[t].last_write[1] = 0;
        u[t].expert = 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        if (n > INT32_MAX) return fail(b, BUG_HINT, "chunk %" PRId64 " has %" PRId64 " ops", c, n);
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *o = &ops[i];
            uint8_t g = (uint8_t)is_grouped(o->kind);
            if (o->n_in > MGC_PLAN_MAX_IO || o->n_out > MGC_PLAN_MAX_IO)
                return fail(b, BUG_HINT, "chunk %" PRId64 " op %" PRId64 " has too many operands", c, i);
            for (int k = 0; k < o->n_in + o->n_out; k++) {
                int read = k < o->n_in;
                int32_t t = read ? o->in[k] : o->out[k - o->n_in];
                if (t < 0 || t >= ch->n_tensors)
                    return fail(b, BUG_HINT, "chunk %" PRId64 " %s op %" PRId64 " names tensor %" PRId32 " of %" PRId64,
                                c, pass ? "backward" : "forward", i, t, ch->n_tensors);
                touch(&u[t], pass, (int32_t)i, read);
                u[t].expert |= g;
            }
        }
    }
    return 0;
}

static int is_expert_param(const mgc_plan_tensor *t, const use *u) {
    return u->expert || t->split_group == MGC_GROUP_EP || t->split_group == MGC_GROUP_ETP ||
           t->split_group == MGC_GROUP_EDP;
}

/* ---- parameters: the flat layout and the optimizer shards ----
 * Per chunk a dense section then an expert section; each parameter starts at
 * a multiple of MGC_MEMPLAN_PARAM_ALIGN_ELEMS elements; each section is
 * padded to a multiple of D * that, D its shard divisor (dp*cp dense, edp
 * expert; 1 without the distributed optimizer), so it reduce-scatters in
 * place into D equal, aligned shards.  Weights (compute dtype) and main
 * grads (fp32) share element positions. */

typedef struct param_layout {
    uint64_t flat;  /* padded elements of the flat weight / grad layout */
    uint64_t shard; /* elements of this rank's optimizer shard (sum over sections) */
    uint64_t elems, expert_elems;
} param_layout;

static int grad_pair(builder *b, int64_t c, int64_t *params, int64_t np, int64_t *grads, int64_t ng);

static int layout_params(builder *b, param_layout *pl, uint64_t d_dense, uint64_t d_expert) {
    const uint64_t A = MGC_MEMPLAN_PARAM_ALIGN_ELEMS;
    mgc_dtype want = b->c->training.precision == MGC_PREC_FP32   ? MGC_DT_F32
                     : b->c->training.precision == MGC_PREC_FP16 ? MGC_DT_F16
                                                                 : MGC_DT_BF16;
    memset(pl, 0, sizeof *pl);
    for (int64_t c = 0; c < b->V; c++) {
        mgc_plan_chunk *ch = &b->sp->chunks[c];
        size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
        int64_t *params = malloc(nt * sizeof *params), *grads = malloc(nt * sizeof *grads), np = 0, ng = 0;
        if (!params || !grads) {
            free(params);
            free(grads);
            return oom(b);
        }
        for (int grp = 0; grp < 2; grp++) {
            uint64_t start = pl->flat, D = grp ? d_expert : d_dense;
            for (int64_t t = 0; t < ch->n_tensors; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (x->role != MGC_TR_PARAM || is_expert_param(x, &b->uses[c][t]) != grp) continue;
                if (x->dtype != want) {
                    free(params);
                    free(grads);
                    return fail(b, "the partitioner gives every parameter the training precision",
                                "parameter %s of chunk %" PRId64 " is %s, the training precision is %s",
                                tensor_name(b, x), c, mgc_dtype_name((mgc_dtype)x->dtype), mgc_dtype_name(want));
                }
                uint64_t el = x->bytes / b->wsize;
                if (el > (UINT64_MAX >> 8) - pl->flat) {
                    free(params);
                    free(grads);
                    return fail(b, NULL, "parameter bytes overflow");
                }
                b->place[c][t].cat = CAT_WEIGHT;
                b->place[c][t].off = pl->flat; /* elements for now; bytes below */
                pl->elems += el;
                if (grp) pl->expert_elems += el;
                pl->flat += align_up(el, A);
            }
            uint64_t sec = round_up(pl->flat - start, A * D);
            pl->flat = start + sec;
            pl->shard += sec / D;
        }
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            if (ch->tensors[t].role == MGC_TR_PARAM) params[np++] = t;
            if (ch->tensors[t].role == MGC_TR_GRAD) grads[ng++] = t;
        }
        int rc = grad_pair(b, c, params, np, grads, ng);
        free(params);
        free(grads);
        if (rc) return rc;
        for (int64_t t = 0; t < ch->n_tensors; t++)
            if (b->place[c][t].cat == CAT_WEIGHT) b->place[c][t].off *= b->wsize;
    }
    return 0;
}

/* Place each gradient at its parameter's element position (x 4 bytes).
 * Pairing: the i-th grad with the i-th param when the chunk lists as many of
 * each with matching element counts (the partitioner's order); otherwise by
 * name, "<param>.grad" and similar. */
static int grad_pair(builder *b, int64_t c, int64_t *params, int64_t np, int64_t *grads, int64_t ng) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    static const char *const suffix[] = {".main_grad", ".grad", "_grad", "@grad", ":grad"};
    static const char *const prefix[] = {"grad.", "grad:", "grad_", "d_", "d."};
    int ordinal = np == ng;
    for (int64_t i = 0; ordinal && i < ng; i++) {
        size_t gs = mgc_dtype_size((mgc_dtype)ch->tensors[grads[i]].dtype);
        if (!gs || ch->tensors[grads[i]].bytes / gs != ch->tensors[params[i]].bytes / b->wsize) ordinal = 0;
    }
    for (int64_t i = 0; i < ng; i++) {
        const mgc_plan_tensor *x = &ch->tensors[grads[i]];
        int64_t p = ordinal ? params[i] : -1;
        const char *gn = b->plan ? mgc_plan_strat(b->plan, x->name) : NULL;
        size_t gl = gn ? strlen(gn) : 0;
        for (int64_t j = 0; p < 0 && gl && j < np; j++) {
            const char *pn = mgc_plan_strat(b->plan, ch->tensors[params[j]].name);
            size_t pnl = pn ? strlen(pn) : 0;
            if (!pnl || pnl >= gl) continue;
            for (size_t s = 0; p < 0 && s < sizeof suffix / sizeof *suffix; s++)
                if (gl == pnl + strlen(suffix[s]) && !strncmp(gn, pn, pnl) && !strcmp(gn + pnl, suffix[s]))
                    p = params[j];
            for (size_t s = 0; p < 0 && s < sizeof prefix / sizeof *prefix; s++) {
                size_t sl = strlen(prefix[s]);
                if (gl == pnl + sl && !strncmp(gn, prefix[s], sl) && !strcmp(gn + sl, pn)) p = params[j];
            }
        }
        if (p < 0)
            return fail(b, "name gradients \"<param>.grad\" or list them in the order of their parameters",
                        "gradient %s of chunk %" PRId64 " matches no parameter", tensor_name(b, x), c);
        size_t gs = mgc_dtype_size((mgc_dtype)x->dtype);
        uint64_t el = ch->tensors[p].bytes / b->wsize;
        if (!gs || gs > 4 || x->bytes / gs != el)
            return fail(b, BUG_HINT,
                        "gradient %s of chunk %" PRId64 " (%s, %" PRIu64 " bytes) does not fit the fp32 main grad of %s (%" PRIu64
                        " elements)",
                        tensor_name(b, x), c, mgc_dtype_name((mgc_dtype)x->dtype), x->bytes,
                        tensor_name(b, &ch->tensors[p]), el);
        b->place[c][grads[i]].cat = CAT_GRAD;
        b->place[c][grads[i]].off = b->place[c][p].off * 4; /* param position is still in elements */
    }
    return 0;
}

/* ---- stashed and input tensors ---- */

static int check_stash(builder *b, int64_t c) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        const mgc_plan_tensor *x = &ch->tensors[t];
        if (x->buffer != MGC_PLAN_BUF_STASH) continue;
        if (x->role == MGC_TR_PARAM || x->role == MGC_TR_GRAD)
            return fail(b, BUG_HINT, "%s %s of chunk %" PRId64 " is marked stashed", x->role ? "gradient" : "parameter",
                        tensor_name(b, x), c);
        if (x->offset > ch->stash_bytes || x->bytes > ch->stash_bytes - x->offset)
            return fail(b, BUG_HINT,
                        "stashed tensor %s of chunk %" PRId64 " at [%" PRIu64 ", +%" PRIu64
                        ") is outside the stash of %" PRIu64 " bytes",
                        tensor_name(b, x), c, x->offset, x->bytes, ch->stash_bytes);
        b->place[c][t].cat = CAT_STASH;
    }
    return 0;
}

/* Input tensors (tokens, labels, loss mask) live in the INPUT buffer of their
 * microbatch: equal names share a slot; LOAD_BATCH fills it.  *in_bwd[c]:
 * chunk c's backward reads an input that is not stashed, so the buffer
 * lives until that backward.  Returns the buffer size, or UINT64_MAX. */
static uint64_t layout_inputs(builder *b, uint8_t *uses_fwd, uint8_t *uses_bwd) {
    uint64_t size = 0;
    for (int64_t c = 0; c < b->V; c++) {
        const mgc_plan_chunk *ch = &b->sp->chunks[c];
        uses_fwd[c] = uses_bwd[c] = 0;
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *x = &ch->tensors[t];
            if (x->role != MGC_TR_INPUT) continue;
            uses_fwd[c] = 1; /* loaded for the forward even when only stashed */
            if (b->place[c][t].cat == CAT_STASH) continue;
            if (b->uses[c][t].first[1] >= 0) uses_bwd[c] = 1;
            /* an earlier input with the same name and size shares the slot */
            int found = 0;
            for (int64_t c2 = 0; c2 <= c && !found; c2++) {
                const mgc_plan_chunk *ch2 = &b->sp->chunks[c2];
                for (int64_t t2 = 0; t2 < (c2 == c ? t : ch2->n_tensors); t2++) {
                    const mgc_plan_tensor *y = &ch2->tensors[t2];
                    if (b->place[c2][t2].cat == CAT_INPUT && y->name == x->name && x->name && y->bytes == x->bytes) {
                        b->place[c][t] = b->place[c2][t2];
                        found = 1;
                        break;
                    }
                }
            }
            if (found) continue;
            if (x->bytes > UINT64_MAX / 2 - size) return UINT64_MAX;
            b->place[c][t].cat = CAT_INPUT;
            b->place[c][t].off = size;
            size = align_up(size + x->bytes, MGC_PLAN_ALIGN);
        }
    }
    return size;
}

/* ---- the pass workspace: transient tensors of one chunk ----
 * Timeline: forward ops 0..n_fwd-1, then backward ops n_fwd..n_fwd+n_bwd-1.
 * A tensor is live in a pass from its first touch to its last; from the pass
 * start when the pass reads it before writing it (the received activation or
 * gradient, copied in first), to the pass end when nothing in the pass reads
 * its last write (the output sent on, the loss).  A tensor of both passes
 * (recomputed) has one interval in each and one offset valid in both. */

static int pack_chunk(builder *b, int64_t c, uint64_t *ws, uint64_t *fwd_peak, uint64_t *bwd_peak) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    const use *u = b->uses[c];
    size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
    mgc_memreq *rq = malloc(nt * sizeof *rq), *rf = malloc(nt * sizeof *rf), *rb = malloc(nt * sizeof *rb);
    mgc_memseg *ex = malloc(nt * sizeof *ex);
    int64_t *tid = malloc(nt * sizeof *tid);
    uint64_t *off = malloc(nt * sizeof *off);
    size_t n = 0, ne = 0, nf = 0, nbw = 0;
    int rc = 0;
    if (!rq || !rf || !rb || !ex || !tid || !off) {
        rc = oom(b);
        goto done;
    }
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        const mgc_plan_tensor *x = &ch->tensors[t];
        if (b->place[c][t].cat != CAT_NONE || x->role == MGC_TR_PARAM || x->role == MGC_TR_GRAD ||
            x->role == MGC_TR_INPUT)
            continue;
        const use *v = &u[t];
        if (v->first[0] < 0 && v->first[1] < 0) continue; /* never touched: not materialised */
        if (v->first[1] >= 0 && v->first_read[1] && (x->role == MGC_TR_ACTIVATION || x->role == MGC_TR_LOSS)) {
            rc = fail(b, BUG_HINT,
                      "tensor %s of chunk %" PRId64 " is read by backward op %" PRId32
                      " but is neither stashed nor recomputed before it",
                      tensor_name(b, x), c, v->first[1]);
            goto done;
        }
        int64_t seg_b[2], seg_e[2];
        int have[2] = {0, 0};
        for (int pass = 0; pass < 2; pass++) {
            if (v->first[pass] < 0) continue;
            int64_t base = pass ? ch->n_fwd : 0, len = pass ? ch->n_bwd : ch->n_fwd;
            seg_b[pass] = base + (v->first_read[pass] ? 0 : v->first[pass]);
            seg_e[pass] = base + (v->last_write[pass] ? len : v->last[pass] + 1);
            have[pass] = 1;
        }
        tid[n] = t;
        int p0 = have[0] ? 0 : 1;
        rq[n] = (mgc_memreq){x->bytes, seg_b[p0], seg_e[p0], MGC_PLAN_ALIGN};
        if (have[0] && have[1]) ex[ne++] = (mgc_memseg){(int64_t)n, seg_b[1], seg_e[1]};
        if (have[0]) rf[nf++] = (mgc_memreq){x->bytes, seg_b[0], seg_e[0], 1};
        if (have[1]) rb[nbw++] = (mgc_memreq){x->bytes, seg_b[1], seg_e[1], 1};
        n++;
    }
    mgc_memplan_status st = mgc_memplan_assign_segs(rq, n, ex, ne, off, ws, NULL);
    if (st == MGC_MEMPLAN_OK) st = mgc_memplan_lower_bound(rf, nf, fwd_peak, NULL);
    if (st == MGC_MEMPLAN_OK) st = mgc_memplan_lower_bound(rb, nbw, bwd_peak, NULL);
    if (st != MGC_MEMPLAN_OK) {
        rc = fail(b, NULL, "packing the workspace of chunk %" PRId64 ": %s", c, mgc_memplan_status_name(st));
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        b->place[c][tid[i]].cat = CAT_ACT;
        b->place[c][tid[i]].off = off[i];
    }
done:
    free(rq);
    free(rf);
    free(rb);
    free(ex);
    free(tid);
    free(off);
    return rc;
}

/* ---- per-microbatch buffers ---- */

static int add_comm(builder *b, const uint32_t *names, uint64_t in_bytes) {
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &b->sp->instrs[i];
        if (in->op < MGC_I_SEND_ACT || in->op > MGC_I_RECV_GRAD) continue;
        int64_t c = in->chunk, k = (int64_t)in->mb * b->V + c;
        const mgc_plan_chunk *ch = &b->sp->chunks[c];
        uint64_t out_bytes = ch->send_bytes ? ch->send_bytes : in_bytes;
        int64_t f = b->fwd[k], bw = b->bwd[k], begin, end;
        uint64_t bytes;
        const char *what = instr_name(in->op);
        switch (in->op) {
        case MGC_I_RECV_ACT: /* received before the forward that reads it */
            if (f < i) goto order;
            begin = i, end = f + 1, bytes = in_bytes;
            break;
        case MGC_I_SEND_ACT: /* written by the forward, sent after it (blocking) */
            if (f < 0 || f > i) goto order;
            begin = f, end = i + 1, bytes = out_bytes;
            break;
        case MGC_I_RECV_GRAD:
            if (bw < i) goto order;
            begin = i, end = bw + 1, bytes = out_bytes;
            break;
        default: /* MGC_I_SEND_GRAD */
            if (bw < 0 || bw > i) goto order;
            begin = bw, end = i + 1, bytes = in_bytes;
            break;
        }
        if (buf_add(b, MGC_BUF_COMM, c, in->mb, names[(in->op - MGC_I_SEND_ACT) * b->V + c], bytes, begin, end) < 0)
            return oom(b);
        continue;
    order:
        return fail(b, BUG_HINT,
                    "instruction %" PRId64 " (%s of microbatch %" PRId32 " chunk %" PRId64
                    ") is not ordered around its %s",
                    i, what, in->mb, c, in->op == MGC_I_RECV_ACT || in->op == MGC_I_SEND_ACT ? "forward" : "backward");
    }
    return 0;
}

static void free_builder(builder *b) {
    for (int64_t c = 0; b->uses && c < b->V; c++) free(b->uses[c]);
    for (int64_t c = 0; b->place && c < b->V; c++) free(b->place[c]);
    free(b->uses);
    free(b->place);
    free(b->fwd);
    free(b->bwd);
    free(b->load);
    free(b->buf);
    free(b->req);
}

int mgc_memplan_build(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan, mgc_stage_program *sp,
                      mgc_diags *d) {
    return mgc_memplan_build_info(c, grid, plan, sp, d, NULL);
}

int mgc_memplan_build_info(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan, mgc_stage_program *sp,
                           mgc_diags *d, mgc_memplan_info *info) {
    builder bb, *b = &bb;
    memset(b, 0, sizeof *b);
    b->c = c;
    b->g = grid;
    b->plan = plan;
    b->sp = sp;
    b->d = d;
    b->loc = c->file_loc;
    b->n = sp->n_instrs;
    b->V = sp->n_chunks;
    b->wsize = c->training.precision == MGC_PREC_FP32 ? 4 : 2;
    if (info) memset(info, 0, sizeof *info);
    int rc = -1;
    uint8_t *in_fwd = NULL, *in_bwd = NULL;
    uint32_t *names = NULL;
    uint64_t *offsets = NULL;

    if (b->V < 1 || !sp->chunks || b->n < 1 || !sp->instrs || b->V > 0xffff) {
        fail(b, BUG_HINT, "%" PRId64 " chunks and %" PRId64 " instructions", b->V, b->n);
        goto out;
    }
    if (index_stream(b)) goto out;
    b->uses = calloc((size_t)b->V, sizeof *b->uses);
    b->place = calloc((size_t)b->V, sizeof *b->place);
    in_fwd = calloc((size_t)b->V, 1);
    in_bwd = calloc((size_t)b->V, 1);
    names = calloc((size_t)b->V * 5, sizeof *names);
    if (!b->uses || !b->place || !in_fwd || !in_bwd || !names) {
        oom(b);
        goto out;
    }
    for (int64_t ch = 0; ch < b->V; ch++)
        if (chunk_uses(b, ch) || check_stash(b, ch)) goto out;

    /* parameters and optimizer state */
    int dist = c->parallel.distributed_optimizer;
    uint64_t d_dense = 1, d_expert = 1;
    if (dist) {
        d_dense = (uint64_t)(grid->dp > 0 ? grid->dp : 1) * (uint64_t)(grid->cp > 0 ? grid->cp : 1);
        d_expert = grid->edp > 0 ? (uint64_t)grid->edp : d_dense;
    }
    param_layout pl;
    if (layout_params(b, &pl, d_dense, d_expert)) goto out;

    /* inputs, then the pass workspace (everything else that ops touch) */
    uint64_t input_bytes = layout_inputs(b, in_fwd, in_bwd);
    if (input_bytes == UINT64_MAX) {
        fail(b, NULL, "input bytes overflow");
        goto out;
    }
    uint64_t ws = 0, fwd_peak = 0, bwd_peak = 0;
    for (int64_t ch = 0; ch < b->V; ch++) {
        uint64_t w, fp, bp;
        if (pack_chunk(b, ch, &w, &fp, &bp)) goto out;
        if (w > ws) ws = w;
        if (fp > fwd_peak) fwd_peak = fp;
        if (bp > bwd_peak) bwd_peak = bp;
    }

    /* the buffers: persistent first, then per microbatch in stream order */
    int64_t idx[CAT_STASH + 1] = {-1, -1, -1, -1, -1, -1};
    int64_t n = b->n;
    uint64_t master = c->training.precision == MGC_PREC_FP32 ? 0 : pl.shard * 4;
    if (pl.flat) {
        idx[CAT_WEIGHT] = buf_add(b, MGC_BUF_WEIGHT, -1, -1, name_of(b, "weights"), pl.flat * b->wsize, 0, n);
        idx[CAT_GRAD] = buf_add(b, MGC_BUF_GRAD, -1, -1, name_of(b, "main_grads"), pl.flat * 4, 0, n);
        if (master && buf_add(b, MGC_BUF_MASTER, -1, -1, name_of(b, "master_weights"), master, 0, n) < 0) goto nomem;
        if (buf_add(b, MGC_BUF_ADAM_M, -1, -1, name_of(b, "adam_m"), pl.shard * 4, 0, n) < 0) goto nomem;
        if (buf_add(b, MGC_BUF_ADAM_V, -1, -1, name_of(b, "adam_v"), pl.shard * 4, 0, n) < 0) goto nomem;
        if (idx[CAT_WEIGHT] < 0 || idx[CAT_GRAD] < 0) goto nomem;
    }
    if (buf_add(b, MGC_BUF_WORKSPACE, -1, -1, name_of(b, "gemm_workspace"), MGC_MEMPLAN_GEMM_WORKSPACE_BYTES, 0, n) < 0)
        goto nomem;
    if (ws && b->first_compute >= 0) {
        idx[CAT_ACT] = buf_add(b, MGC_BUF_ACTIVATION, -1, -1, name_of(b, "pass_workspace"), ws, b->first_compute,
                               b->last_compute + 1);
        if (idx[CAT_ACT] < 0) goto nomem;
    }
    {
        static const char *const comm[4] = {"send_act", "recv_act", "send_grad", "recv_grad"};
        char nm[64];
        for (int64_t ch = 0; ch < b->V; ch++) {
            snprintf(nm, sizeof nm, "stash.c%" PRId64, ch);
            names[4 * b->V + ch] = name_of(b, nm);
            for (int k = 0; k < 4; k++) {
                snprintf(nm, sizeof nm, "%s.c%" PRId64, comm[k], ch);
                names[k * b->V + ch] = name_of(b, nm);
            }
        }
    }
    for (int64_t m = 0; m < b->M; m++) {
        for (int64_t ch = 0; ch < b->V; ch++) {
            int64_t k = m * b->V + ch;
            if (b->fwd[k] < 0 || !sp->chunks[ch].stash_bytes) continue;
            if (buf_add(b, MGC_BUF_STASH, ch, m, names[4 * b->V + ch], sp->chunks[ch].stash_bytes, b->fwd[k],
                        b->bwd[k] + 1) < 0)
                goto nomem;
        }
        if (!input_bytes) continue;
        int64_t first = -1, last = -1;
        for (int64_t ch = 0; ch < b->V; ch++) {
            int64_t k = m * b->V + ch;
            if (!in_fwd[ch] || b->fwd[k] < 0) continue;
            if (first < 0 || b->fwd[k] < first) first = b->fwd[k];
            int64_t e = in_bwd[ch] ? b->bwd[k] : b->fwd[k];
            if (e > last) last = e;
        }
        if (first < 0) continue; /* this rank runs no input-reading pass of mb */
        int64_t begin = b->load[m] >= 0 && b->load[m] < first ? b->load[m] : first;
        int64_t id = buf_add(b, MGC_BUF_INPUT, -1, m, name_of(b, "input"), input_bytes, begin, last + 1);
        if (id < 0) goto nomem;
        if (idx[CAT_INPUT] < 0) idx[CAT_INPUT] = id; /* tensors name the first; see docs */
    }
    {
        uint64_t in_bytes = 0;
        for (int64_t ch = 0; ch < b->V; ch++)
            if (sp->chunks[ch].send_bytes > in_bytes) in_bytes = sp->chunks[ch].send_bytes;
        if (!in_bytes) in_bytes = mgc_memplan_boundary_bytes(c, grid);
        if (add_comm(b, names, in_bytes)) goto out;
    }

    /* place */
    offsets = malloc((size_t)b->nb * sizeof *offsets);
    if (!offsets) goto nomem;
    mgc_memplan_stats st;
    uint64_t arena = 0;
    mgc_memplan_status ms = mgc_memplan_assign(b->req, (size_t)b->nb, offsets, &arena, &st);
    if (ms != MGC_MEMPLAN_OK) {
        fail(b, NULL, "placing %" PRId64 " buffers: %s", b->nb, mgc_memplan_status_name(ms));
        goto out;
    }
    for (int64_t i = 0; i < b->nb; i++) b->buf[i].offset = offsets[i];

    /* tensors */
    for (int64_t ch = 0; ch < b->V; ch++) {
        mgc_plan_chunk *chk = &sp->chunks[ch];
        for (int64_t t = 0; t < chk->n_tensors; t++) {
            const tplace *p = &b->place[ch][t];
            mgc_plan_tensor *x = &chk->tensors[t];
            if (p->cat == CAT_STASH) continue;
            if (p->cat == CAT_NONE || idx[p->cat] < 0) {
                x->buffer = -1;
                x->offset = 0;
            } else {
                x->buffer = (int32_t)idx[p->cat];
                x->offset = p->off;
            }
        }
    }

    /* the breakdown at the peak, and the most stashes at once */
    memset(sp->by_kind, 0, sizeof sp->by_kind);
    for (int64_t i = 0; st.peak_time >= 0 && i < b->nb; i++)
        if (b->buf[i].live_begin <= st.peak_time && st.peak_time < b->buf[i].live_end)
            sp->by_kind[b->buf[i].kind] += b->buf[i].bytes;
    {
        int64_t *delta = calloc((size_t)b->n + 1, sizeof *delta), cur = 0, best = 0;
        if (!delta) goto nomem;
        for (int64_t k = 0; k < b->M * b->V; k++)
            if (b->fwd[k] >= 0) delta[b->fwd[k]]++, delta[b->bwd[k] + 1]--;
        for (int64_t i = 0; i <= b->n; i++) {
            cur += delta[i];
            if (cur > best) best = cur;
        }
        free(delta);
        sp->max_in_flight = best;
    }
    free(sp->buffers);
    sp->buffers = b->buf;
    sp->n_buffers = b->nb;
    sp->arena_bytes = arena;
    b->buf = NULL;
    if (info) {
        info->arena_bytes = arena;
        info->lower_bound_bytes = st.lower_bound_bytes;
        info->peak_instr = st.peak_time;
        info->param_elems = pl.elems;
        info->expert_param_elems = pl.expert_elems;
        info->param_pad_elems = pl.flat - pl.elems;
        info->optimizer_bytes = pl.flat * (b->wsize + 4) + master + 2 * pl.shard * 4;
        info->shard_dense = (int64_t)d_dense;
        info->shard_expert = (int64_t)d_expert;
        info->workspace_bytes = ws;
        info->fwd_peak_bytes = fwd_peak;
        info->bwd_peak_bytes = bwd_peak;
        info->n_buffers = sp->n_buffers;
        info->assign_overlaps = st.overlaps;
    }
    rc = 0;
    goto out;
nomem:
    oom(b);
out:
    free(in_fwd);
    free(in_bwd);
    free(names);
    free(offsets);
    free_builder(b);
    return rc;
}
