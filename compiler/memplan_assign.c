/* memplan_assign.c - the offset assigner of the memory planner (see
 * memplan.h and docs/memory-plan.md): greedy by size with best fit into the
 * gaps of already-placed buffers whose lifetimes overlap, over an interval
 * index on the time axis; a lower bound; sorting helpers. */
#include "memplan.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- sorting ----------------------------------------------------------------
 * (key, val) pairs.  radix_sort: stable LSD radix sort on 64-bit keys, 8 bits
 * a pass, only over the bytes in which keys differ; stable sorts compose, so
 * sorting by the least significant key first gives a lexicographic order.
 * quick_sort: for the short overlap lists, where equal keys need no order. */

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

/* Unstable, deterministic quicksort (median of three, insertion sort below 24). */
static void quick_sort(kv *a, size_t n) {
    while (n > 24) {
        size_t m = n / 2, l = n - 1;
        if (a[m].key < a[0].key) {
            kv t = a[m];
            a[m] = a[0];
            a[0] = t;
        }
        if (a[l].key < a[0].key) {
            kv t = a[l];
            a[l] = a[0];
            a[0] = t;
        }
        if (a[l].key < a[m].key) {
            kv t = a[l];
            a[l] = a[m];
            a[m] = t;
        }
        uint64_t pivot = a[m].key;
        size_t i = 0, j = l;
        for (;;) {
            while (a[i].key < pivot)
                i++;
            while (a[j].key > pivot)
                j--;
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
    for (size_t i = 0; i < n; i++)
        all &= a[i].key, any |= a[i].key;
    uint64_t varies = all ^ any; /* bits that differ between keys */
    int bytes[8], nb = 0;
    for (int b = 0; b < 8; b++)
        if ((varies >> (8 * b)) & 0xff) bytes[nb++] = b;
    size_t count[8][256];
    memset(count, 0, (size_t)nb * sizeof count[0]);
    for (size_t i = 0; i < n; i++) {
        uint64_t k = a[i].key;
        for (int j = 0; j < nb; j++)
            count[j][(k >> (8 * bytes[j])) & 0xff]++;
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
        for (size_t i = 0; i < n; i++)
            dst[c[(src[i].key >> sh) & 0xff]++] = src[i];
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
/* ---- the offset assigner ----------------------------------------------------- */

const char *mgc_memplan_status_name(mgc_memplan_status s) {
    switch (s) {
    case MGC_MEMPLAN_OK:
        return "ok";
    case MGC_MEMPLAN_ERR_NOMEM:
        return "out of memory";
    case MGC_MEMPLAN_ERR_INVALID:
        return "invalid request";
    case MGC_MEMPLAN_ERR_OVERFLOW:
        return "arena above 2^64 bytes";
    }
    return "?";
}

/* A placed request in the overlap set: its bytes [off, end). */
typedef struct ent {
    uint64_t off, end;
    uint64_t req;
} ent;

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
    const seg *segs; /* (m) sorted by begin */
    size_t m;
    /* the begin-sorted max tree */
    int64_t *tree; /* (2 * cap) */
    size_t cap;    /* leaves, a power of two >= m */
    /* the time segment tree */
    size_t P;       /* leaves, a power of two >= distinct times */
    size_t *start;  /* (2P + 1) node i lists items[start[i] .. fill[i]) */
    size_t *fill;   /* (2P) */
    int64_t *items; /* request ids */
    int64_t *tv;    /* (T) the distinct times, ascending: leaf j is [tv[j], tv[j+1]) */
    size_t T;
    size_t *tlo, *thi; /* (m) a segment's leaf range [tlo, thi) */
    size_t *pos_of;    /* (T + 1) first begin-sorted position whose segment begins at leaf >= j */
    uint64_t *breadth; /* (T) bytes live over leaf j */
    kv *placed;        /* (n) (offset, end) of each placed request */
    /* the overlap set of the current request, kept sorted by offset from one
     * request to the next: consecutive requests (equal sizes in time order)
     * overlap mostly the same buffers, so only the newcomers need sorting */
    ent *cur, *cur2; /* (n) sorted by offset; cur2 scratch */
    size_t cur_n;
    kv *fresh; /* (n) found now, not in cur */
    size_t fresh_n, found;
    uint32_t *mark;  /* (n) generation a request was last found in */
    uint8_t *in_cur; /* (n) */
    uint32_t gen;
    kv *glob; /* placed requests live over the whole timeline, sorted by offset:
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

/* cur := the requests found in this generation, sorted by offset (the ones
 * of cur not found again leave; the fresh ones merge in), and in the same
 * pass over the overlap set in address order -- merged with the global
 * requests -- the best fit for `bytes` at alignment `al`: the smallest gap
 * between overlapping buffers that holds it.  Returns that offset, or
 * UINT64_MAX when no gap holds it; *top receives the end of the highest
 * overlapping buffer.  Requests with equal offsets may come in any order:
 * the second of two at one offset never starts a gap (prev_end is already
 * past it), so the result does not depend on their order. */
static uint64_t update_cur_fit(assign_ctx *a, uint64_t bytes, uint64_t al, uint64_t *top) {
    quick_sort(a->fresh, a->fresh_n);
    const ent *cur = a->cur;
    ent *out = a->cur2;
    const kv *fresh = a->fresh, *glob = a->glob;
    const size_t cn = a->cur_n, fn = a->fresh_n, gn = a->glob_n;
    size_t i = 0, j = 0, g = 0, k = 0;
    uint64_t prev_end = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
    for (;;) {
        while (i < cn && a->mark[cur[i].req] != a->gen)
            a->in_cur[cur[i++].req] = 0;
        uint64_t off, end;
        if (i < cn && (j == fn || cur[i].off <= fresh[j].key) &&
            (g == gn || cur[i].off < glob[g].key)) {
            off = cur[i].off, end = cur[i].end;
            out[k++] = cur[i++];
        } else if (j < fn && (g == gn || fresh[j].key < glob[g].key)) {
            uint64_t r = fresh[j++].val;
            off = a->placed[r].key, end = a->placed[r].val;
            a->in_cur[r] = 1;
            out[k].off = off, out[k].end = end, out[k].req = r, k++;
        } else if (g < gn) {
            off = glob[g].key, end = glob[g].val;
            g++;
        } else {
            break;
        }
        uint64_t start = align_up(prev_end, al);
        if (start >= prev_end && off >= start && off - start >= bytes) {
            uint64_t gap = off - prev_end;
            if (gap < best_gap) best_gap = gap, best = start;
        }
        if (end > prev_end) prev_end = end;
    }
    a->cur2 = a->cur;
    a->cur = out;
    a->cur_n = k;
    *top = prev_end;
    return best;
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
        for (size_t q = a->start[i]; q < a->fill[i]; q++)
            found(a, a->items[q]);
}

/* The canonical nodes of leaf range [l, r): count them (count != 0, the
 * layout pass) or append request req to their lists. */
static void time_cover(assign_ctx *a, size_t l, size_t r, int64_t req, int count) {
    for (l += a->P, r += a->P; l < r; l >>= 1, r >>= 1) {
        if (l & 1) {
            if (count)
                a->start[l + 1]++;
            else
                a->items[a->fill[l]++] = req;
            l++;
        }
        if (r & 1) {
            --r;
            if (count)
                a->start[r + 1]++;
            else
                a->items[a->fill[r]++] = req;
        }
    }
}

/* Build both indexes over the m segments; 0 or -1 on OOM. */
static int index_init(assign_ctx *a) {
    size_t m = a->m;
    a->cap = 1;
    while (a->cap < m)
        a->cap *= 2;
    a->tree = malloc(2 * a->cap * sizeof *a->tree);
    int64_t *tv = a->tv = malloc(2 * m * sizeof *tv);
    kv *k = malloc(2 * m * sizeof *k), *tmp = malloc(2 * m * sizeof *tmp);
    a->tlo = malloc(m * sizeof *a->tlo);
    a->thi = malloc(m * sizeof *a->thi);
    int rc = -1;
    if (!a->tree || !tv || !k || !tmp || !a->tlo || !a->thi) goto out;
    for (size_t i = 0; i < 2 * a->cap; i++)
        a->tree[i] = INT64_MIN;
    /* distinct times; a segment's leaf range [tlo, thi) falls out of the same
     * pass: the leaves of its begin and of its end */
    for (size_t i = 0; i < m; i++) {
        k[2 * i].key = okey(a->segs[i].begin), k[2 * i].val = 2 * i;
        k[2 * i + 1].key = okey(a->segs[i].end), k[2 * i + 1].val = 2 * i + 1;
    }
    radix_sort(k, tmp, 2 * m);
    size_t T = 0;
    for (size_t i = 0; i < 2 * m; i++) {
        if (!T || k[i].key != k[i - 1].key) tv[T++] = (int64_t)(k[i].key ^ (UINT64_C(1) << 63));
        if (k[i].val & 1)
            a->thi[k[i].val / 2] = T - 1;
        else
            a->tlo[k[i].val / 2] = T - 1;
    }
    a->T = T;
    a->P = 1;
    while (a->P < T)
        a->P *= 2;
    a->start = calloc(2 * a->P + 1, sizeof *a->start);
    a->fill = malloc(2 * a->P * sizeof *a->fill);
    if (!a->start || !a->fill) goto out;
    a->pos_of = malloc((T + 1) * sizeof *a->pos_of);
    if (!a->pos_of) goto out;
    for (size_t i = 0; i < m; i++)
        time_cover(a, a->tlo[i], a->thi[i], 0, 1);
    for (size_t j = 0, i = 0; j <= T; j++) {
        while (i < m && a->tlo[i] < j)
            i++;
        a->pos_of[j] = i;
    }
    for (size_t i = 0; i < 2 * a->P; i++)
        a->start[i + 1] += a->start[i];
    memcpy(a->fill, a->start, 2 * a->P * sizeof *a->fill);
    a->items = malloc((a->start[2 * a->P] ? a->start[2 * a->P] : 1) * sizeof *a->items);
    if (!a->items) goto out;
    rc = 0;
out:
    free(k);
    free(tmp);
    return rc;
}

/* Max over the time leaves of the live bytes (a difference array); keeps
 * the bytes live per leaf in a->breadth. */
static int index_lower_bound(assign_ctx *a, uint64_t *lb, int64_t *peak) {
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
        delta[j] = cur;
        if (cur > best) best = cur, at = a->tv[j];
    }
    a->breadth = delta;
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
    free(a->breadth);
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
static mgc_memplan_status lower_bound_of(const seg *s, size_t m, const mgc_memreq *req,
                                         uint64_t *lb, int64_t *peak) {
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
    for (size_t i = 0; i < m; i++)
        ev[i].key = okey(s[i].end), ev[i].val = 2 * (uint64_t)s[i].req;
    for (size_t i = 0; i < m; i++)
        ev[m + i].key = okey(s[i].begin), ev[m + i].val = 2 * (uint64_t)s[i].req + 1;
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
static mgc_memplan_status build_segs(const mgc_memreq *req, size_t n, const mgc_memseg *extra,
                                     size_t n_extra, seg **out, size_t *m_out) {
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
    /* by begin; ties keep the order above (requests, then extra intervals):
     * a stable sort, so input that already ascends stays as it is */
    size_t sorted = 1;
    while (sorted < m && s[sorted - 1].begin <= s[sorted].begin)
        sorted++;
    if (sorted == m) {
        free(k);
        free(tmp);
        *out = s;
        *m_out = m;
        return MGC_MEMPLAN_OK;
    }
    for (size_t i = 0; i < m; i++)
        k[i].key = okey(s[i].begin), k[i].val = i;
    radix_sort(k, tmp, m);
    seg *t = malloc(m * sizeof *t);
    if (!t) {
        free(s);
        free(k);
        free(tmp);
        return MGC_MEMPLAN_ERR_NOMEM;
    }
    for (size_t i = 0; i < m; i++)
        t[i] = s[k[i].val];
    free(s);
    free(k);
    free(tmp);
    *out = t;
    *m_out = m;
    return MGC_MEMPLAN_OK;
}

mgc_memplan_status mgc_memplan_lower_bound(const mgc_memreq *req, size_t n,
                                           uint64_t *lower_bound_bytes, int64_t *peak_time) {
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

/* One greedy pass in the given order: offsets[], the arena end (unrounded)
 * and the overlaps examined.  Resets the mutable index state first, so the
 * pass can be repeated with another order. */
static mgc_memplan_status place(assign_ctx *a, const kv *order, size_t nl, const size_t *first,
                                const size_t *list, uint64_t *offsets, uint64_t *arena_out,
                                uint64_t *overlaps) {
    const mgc_memreq *req = a->req;
    const seg *segs = a->segs;
    for (size_t i = 0; i < 2 * a->cap; i++)
        a->tree[i] = INT64_MIN;
    memcpy(a->fill, a->start, 2 * a->P * sizeof *a->fill);
    for (size_t i = 0; i < a->cur_n; i++)
        a->in_cur[a->cur[i].req] = 0;
    a->cur_n = a->glob_n = 0;
    int64_t tmin = segs[0].begin, tmax = segs[0].end;
    for (size_t p = 1; p < a->m; p++)
        if (segs[p].end > tmax) tmax = segs[p].end;
    uint64_t arena = 0;
    for (size_t oi = 0; oi < nl; oi++) {
        size_t r = (size_t)order[oi].val;
        uint64_t bytes = req[r].bytes, al = req[r].align ? req[r].align : MGC_PLAN_ALIGN;
        a->gen++;
        a->fresh_n = a->found = 0;
        int global = 0;
        for (size_t q = first[r]; q < first[r + 1]; q++) {
            size_t p = list[q];
            global |= segs[p].begin == tmin && segs[p].end == tmax;
            collect_stab(a, a->tlo[p]);
            collect_range(a, a->pos_of[a->tlo[p] + 1], a->pos_of[a->thi[p]]);
        }
        *overlaps += a->found + a->glob_n;
        /* best fit: the smallest gap between overlapping buffers (in address
         * order: the sorted overlap list merged with the global ones) that
         * holds the request; else above the highest of them */
        uint64_t prev_end;
        uint64_t best = update_cur_fit(a, bytes, al, &prev_end);
        if (best == UINT64_MAX) {
            best = align_up(prev_end, al);
            if (best < prev_end || best > UINT64_MAX - MGC_PLAN_ALIGN - bytes)
                return MGC_MEMPLAN_ERR_OVERFLOW;
        }
        offsets[r] = best;
        a->placed[r].key = best;
        a->placed[r].val = best + bytes;
        if (best + bytes > arena) arena = best + bytes;
        if (global) { /* into the sorted global list */
            size_t at = a->glob_n;
            while (at > 0 && a->glob[at - 1].key > best)
                at--;
            memmove(&a->glob[at + 1], &a->glob[at], (a->glob_n - at) * sizeof *a->glob);
            a->glob[at] = a->placed[r];
            a->glob_n++;
            continue;
        }
        for (size_t q = first[r]; q < first[r + 1]; q++) {
            size_t p = list[q];
            tree_set(a, p, segs[p].end);
            time_cover(a, a->tlo[p], a->thi[p], (int64_t)r, 0);
        }
    }
    *arena_out = arena;
    return MGC_MEMPLAN_OK;
}

/* Placement orders, tried in turn while the arena exceeds the lower bound:
 *   0  bytes descending (greedy by size), then first begin, then longer life;
 *   1  greedy by breadth (Pisarchyk & Lee 2020): the request whose busiest
 *      time leaf has the most live bytes first, by that leaf, then bytes
 *      descending -- the buffers of the peak are placed first, contiguously,
 *      so the peak itself costs no more than the lower bound;
 *   2  time order: first begin, then bytes descending -- a replay of an
 *      allocator that frees on time, with best fit.
 * The smallest arena wins (the earliest order on ties).  Every sort is
 * stable and starts from request order: deterministic. */
#define N_ORDERS 3

/* Range-argmax of breadth over time leaves (sparse table, ties to the
 * earliest leaf); 0 or -1 on OOM. */
typedef struct argmax_table {
    uint32_t *v; /* (levels * T) */
    size_t T, levels;
} argmax_table;

static size_t better(const uint64_t *w, size_t i, size_t j) {
    return w[j] > w[i] ? j : i; /* i < j: ties keep the earlier */
}

static int argmax_init(argmax_table *t, const uint64_t *w, size_t T) {
    t->T = T;
    t->levels = 1;
    while (((size_t)1 << t->levels) <= T)
        t->levels++;
    t->v = malloc(t->levels * T * sizeof *t->v);
    if (!t->v) return -1;
    for (size_t j = 0; j < T; j++)
        t->v[j] = (uint32_t)j;
    for (size_t k = 1; k < t->levels; k++)
        for (size_t j = 0; j + ((size_t)1 << k) <= T; j++)
            t->v[k * T + j] = (uint32_t)better(w, t->v[(k - 1) * T + j],
                                               t->v[(k - 1) * T + j + ((size_t)1 << (k - 1))]);
    return 0;
}

/* argmax over leaves [l, r), r > l */
static size_t argmax_query(const argmax_table *t, const uint64_t *w, size_t l, size_t r) {
    size_t k = 0;
    while (((size_t)2 << k) <= r - l)
        k++;
    return better(w, t->v[k * t->T + l], t->v[k * t->T + r - ((size_t)1 << k)]);
}

static uint64_t life_of(const assign_ctx *a, const size_t *first, const size_t *list, size_t r) {
    uint64_t life = 0; /* in time leaves */
    for (size_t q = first[r]; q < first[r + 1]; q++)
        life += a->thi[list[q]] - a->tlo[list[q]];
    return life < UINT32_MAX ? life : UINT32_MAX;
}

/* Sort by key(r) descending (stable). */
static void sort_desc(kv *order, kv *tmp, size_t nl, const uint64_t *key) {
    for (size_t i = 0; i < nl; i++)
        order[i].key = ~key[order[i].val];
    radix_sort(order, tmp, nl);
}

static int make_order(int which, const assign_ctx *a, const size_t *first, const size_t *list,
                      size_t n, kv *order, kv *tmp, uint64_t *key, size_t *nl_out) {
    const mgc_memreq *req = a->req;
    size_t nl = 0;
    for (size_t i = 0; i < n; i++) {
        if (first[i + 1] == first[i]) continue;
        order[nl].val = i;
        uint64_t begin = a->tlo[list[first[i]]]; /* in time leaves */
        order[nl].key = begin << 32 | (UINT32_MAX - life_of(a, first, list, i));
        nl++;
    }
    if (which == 2) { /* bytes descending within begin */
        for (size_t i = 0; i < nl; i++)
            key[order[i].val] = req[order[i].val].bytes;
        sort_desc(order, tmp, nl, key);
        for (size_t i = 0; i < nl; i++)
            order[i].key = a->tlo[list[first[order[i].val]]];
    }
    radix_sort(order, tmp, nl); /* begin ascending, then life descending */
    for (size_t i = 0; i < nl; i++) {
        size_t r = (size_t)order[i].val;
        key[r] = req[r].bytes;
    }
    if (which != 2) sort_desc(order, tmp, nl, key); /* order 2: begin first, then bytes */
    if (which == 1) {                               /* by the busiest leaf of each request */
        argmax_table at;
        if (argmax_init(&at, a->breadth, a->T)) return -1;
        for (size_t i = 0; i < nl; i++) {
            size_t r = (size_t)order[i].val, best = SIZE_MAX;
            for (size_t q = first[r]; q < first[r + 1]; q++) {
                size_t j = argmax_query(&at, a->breadth, a->tlo[list[q]], a->thi[list[q]]);
                if (best == SIZE_MAX || a->breadth[j] > a->breadth[best] ||
                    (a->breadth[j] == a->breadth[best] && j < best))
                    best = j;
            }
            order[i].key = best;
        }
        free(at.v);
        radix_sort(order, tmp, nl); /* leaf ascending */
        for (size_t i = 0; i < nl; i++)
            key[order[i].val] = a->breadth[order[i].key];
        sort_desc(order, tmp, nl, key);
    }
    *nl_out = nl;
    return 0;
}

mgc_memplan_status mgc_memplan_assign_segs(const mgc_memreq *req, size_t n, const mgc_memseg *extra,
                                           size_t n_extra, uint64_t *offsets, uint64_t *arena_bytes,
                                           mgc_memplan_stats *stats) {
    seg *segs = NULL;
    size_t m = 0;
    size_t *first = NULL, *list = NULL;
    kv *order = NULL, *tmp = NULL;
    uint64_t *trial = NULL, *keys = NULL;
    assign_ctx a;
    memset(&a, 0, sizeof a);
    uint64_t arena = 0, lb = 0, overlaps = 0;
    int64_t peak = -1;
    if (arena_bytes) *arena_bytes = 0;
    if (stats) memset(stats, 0, sizeof *stats), stats->peak_time = -1;
    mgc_memplan_status rc = build_segs(req, n, extra, n_extra, &segs, &m);
    if (rc) goto done;
    for (size_t i = 0; i < n; i++)
        offsets[i] = 0;
    if (m == 0) goto done;
    rc = MGC_MEMPLAN_ERR_NOMEM;

    /* each request's segments, in begin order (CSR); they must not overlap */
    first = calloc(n + 1, sizeof *first);
    list = malloc(m * sizeof *list);
    if (!first || !list) goto done;
    for (size_t p = 0; p < m; p++)
        first[segs[p].req + 1]++;
    for (size_t i = 0; i < n; i++)
        first[i + 1] += first[i];
    {
        size_t *fill = malloc(n * sizeof *fill);
        if (!fill) goto done;
        memcpy(fill, first, n * sizeof *fill);
        for (size_t p = 0; p < m; p++)
            list[fill[segs[p].req]++] = p;
        free(fill);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t q = first[i] + 1; q < first[i + 1]; q++)
            if (segs[list[q]].begin < segs[list[q - 1]].end) {
                rc = MGC_MEMPLAN_ERR_INVALID;
                goto done;
            }

    a.req = req;
    a.segs = segs;
    a.m = m;
    a.placed = malloc(n * sizeof *a.placed);
    a.glob = malloc(n * sizeof *a.glob);
    a.cur = malloc(n * sizeof *a.cur);
    a.cur2 = malloc(n * sizeof *a.cur2);
    a.fresh = malloc(n * sizeof *a.fresh);
    a.mark = calloc(n, sizeof *a.mark);
    a.in_cur = calloc(n, sizeof *a.in_cur);
    order = malloc(n * sizeof *order);
    tmp = malloc(n * sizeof *tmp);
    keys = malloc(n * sizeof *keys);
    if (!keys || !a.placed || !a.glob || !a.cur || !a.cur2 || !a.fresh || !a.mark || !a.in_cur ||
        !order || !tmp || index_init(&a) || index_lower_bound(&a, &lb, &peak))
        goto done;

    /* the first order; the others only while the arena is clearly above the lower bound */
    uint64_t best = UINT64_MAX;
    for (int which = 0; which < N_ORDERS; which++) {
        size_t nl;
        if (make_order(which, &a, first, list, n, order, tmp, keys, &nl)) {
            rc = MGC_MEMPLAN_ERR_NOMEM;
            goto done;
        }
        uint64_t end;
        uint64_t *dst = which == 0 ? offsets : trial;
        rc = place(&a, order, nl, first, list, dst, &end, &overlaps);
        if (rc) goto done;
        if (end < best) {
            best = end;
            if (which > 0) memcpy(offsets, trial, n * sizeof *offsets);
        }
        /* good enough: within 1/512 (0.2%) of the lower bound; another order
         * costs a full placement pass and could win at most that much */
        if (align_up(best, MGC_PLAN_ALIGN) <= align_up(lb + lb / 512, MGC_PLAN_ALIGN)) break;
        if (!trial) {
            trial = malloc(n * sizeof *trial);
            if (!trial) {
                rc = MGC_MEMPLAN_ERR_NOMEM;
                goto done;
            }
            memcpy(trial, offsets, n * sizeof *trial); /* zero-byte requests keep offset 0 */
        }
    }
    arena = align_up(best, MGC_PLAN_ALIGN);
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
    free(trial);
    free(keys);
    index_free(&a);
    return rc;
}

mgc_memplan_status mgc_memplan_assign(const mgc_memreq *req, size_t n, uint64_t *offsets,
                                      uint64_t *arena_bytes, mgc_memplan_stats *stats) {
    return mgc_memplan_assign_segs(req, n, NULL, 0, offsets, arena_bytes, stats);
}
