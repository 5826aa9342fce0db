/* yamltree.c - libyaml events to an mgc_ytree.  See yamltree.h. */
#include "yamltree.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define ARENA_CHUNK (64u << 10)
#define MAX_MAP_PAIRS 4096 /* duplicate-key check is quadratic; configs have ~20 */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    unsigned char data[];
} chunk;

struct mgc_ytree {
    chunk *chunks;     /* arena, newest first */
    mgc_ynode *root;   /* document root (a MAP for configs) */
    const char *file;  /* interned input name */
    size_t nodes;      /* nodes made, against MGC_YAML_MAX_NODES */
};

static void *arena_alloc(mgc_ytree *t, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!t->chunks || t->chunks->cap - t->chunks->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = t->chunks;
        c->used = 0;
        c->cap = cap;
        t->chunks = c;
    }
    void *p = t->chunks->data + t->chunks->used;
    t->chunks->used += n;
    return p;
}

const char *mgc_ytree_strdup(mgc_ytree *t, const char *s, size_t len) {
    char *p = arena_alloc(t, len + 1);
    if (!p) return NULL;
    memcpy(p, s, len);
    p[len] = 0;
    return p;
}

mgc_ynode *mgc_ynode_new(mgc_ytree *t, mgc_ykind kind, mgc_loc loc) {
    if (t->nodes >= MGC_YAML_MAX_NODES) return NULL;
    mgc_ynode *n = arena_alloc(t, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->loc = loc;
    n->s = "";
    t->nodes++;
    return n;
}

int mgc_ynode_append(mgc_ytree *t, mgc_ynode *parent, mgc_ynode *key, mgc_ynode *val) {
    if (parent->n == parent->cap) {
        int cap = parent->cap ? parent->cap * 2 : 8;
        mgc_ynode **kids = arena_alloc(t, (size_t)cap * sizeof *kids);
        mgc_ynode **keys = parent->kind == MGC_Y_MAP ? arena_alloc(t, (size_t)cap * sizeof *keys) : NULL;
        if (!kids || (parent->kind == MGC_Y_MAP && !keys)) return -1;
        if (parent->n) {
            memcpy(kids, parent->kids, (size_t)parent->n * sizeof *kids);
            if (keys) memcpy(keys, parent->keys, (size_t)parent->n * sizeof *keys);
        }
        parent->kids = kids;
        parent->keys = keys;
        parent->cap = cap;
    }
    parent->kids[parent->n] = val;
    if (parent->kind == MGC_Y_MAP) parent->keys[parent->n] = key;
    parent->n++;
    return 0;
}

mgc_ynode *mgc_ynode_copy(mgc_ytree *t, const mgc_ynode *src) {
    mgc_ynode *n = mgc_ynode_new(t, src->kind, src->loc);
    if (!n) return NULL;
    n->s = mgc_ytree_strdup(t, src->s, src->len);
    if (!n->s) return NULL;
    n->len = src->len;
    n->quoted = src->quoted;
    for (int i = 0; i < src->n; i++) {
        mgc_ynode *k = NULL;
        if (src->kind == MGC_Y_MAP && !(k = mgc_ynode_copy(t, src->keys[i]))) return NULL;
        mgc_ynode *v = mgc_ynode_copy(t, src->kids[i]);
        if (!v || mgc_ynode_append(t, n, k, v)) return NULL;
    }
    return n;
}

mgc_ynode *mgc_ymap_get(const mgc_ynode *map, const char *key) {
    if (!map || map->kind != MGC_Y_MAP) return NULL;
    for (int i = 0; i < map->n; i++)
        if (strcmp(map->keys[i]->s, key) == 0) return map->kids[i];
    return NULL;
}

void mgc_ytree_free(mgc_ytree *t) {
    if (!t) return;
    chunk *c = t->chunks;
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    free(t);
}

mgc_ynode *mgc_ytree_root(mgc_ytree *t) {
    return t->root;
}

const char *mgc_ytree_file(const mgc_ytree *t) {
    return t->file;
}

/* ---- the event loop ---------------------------------------------------- */

typedef struct frame {
    mgc_ynode *node;    /* open SEQ or MAP */
    mgc_ynode *key;     /* MAP: key waiting for its value, or NULL */
} frame;

static mgc_loc mark_loc(const mgc_ytree *t, yaml_mark_t m) {
    mgc_loc l = {t->file, (int)m.line + 1, (int)m.column + 1};
    return l;
}

static int is_null_text(const char *s, size_t n) {
    return n == 0 || (n == 1 && s[0] == '~') || (n == 4 && (!memcmp(s, "null", 4) || !memcmp(s, "Null", 4) || !memcmp(s, "NULL", 4)));
}

/* Attach a finished node to the innermost open container. Returns 0 on
 * success, -1 after reporting. */
static int attach(mgc_ytree *t, frame *stack, int depth, mgc_ynode *n, mgc_diags *d) {
    if (depth == 0) {
        if (!t->root) t->root = n;
        return 0;
    }
    frame *f = &stack[depth - 1];
    if (f->node->kind == MGC_Y_SEQ) {
        if (mgc_ynode_append(t, f->node, NULL, n)) goto oom;
        return 0;
    }
    if (!f->key) {
        if (n->kind != MGC_Y_SCALAR) {
            mgc_diag(d, MGC_SEV_ERROR, n->loc, "write keys as plain names, e.g. `hidden_size: 768`",
                     "mapping keys must be names, not %s", n->kind == MGC_Y_NULL ? "empty values" : n->kind == MGC_Y_SEQ ? "sequences" : "mappings");
            return -1;
        }
        if (f->node->n >= MAX_MAP_PAIRS) {
            mgc_diag(d, MGC_SEV_ERROR, n->loc, "a config section has a few dozen keys at most",
                     "mapping has more than %d keys", MAX_MAP_PAIRS);
            return -1;
        }
        for (int i = 0; i < f->node->n; i++) {
            if (strcmp(f->node->keys[i]->s, n->s) == 0) {
                char hint[160];
                snprintf(hint, sizeof hint, "the first `%.60s` is at line %d; keep one of them", n->s, f->node->keys[i]->loc.line);
                mgc_diag(d, MGC_SEV_ERROR, n->loc, hint, "duplicate key '%.80s'", n->s);
                return -1;
            }
        }
        f->key = n;
        return 0;
    }
    if (mgc_ynode_append(t, f->node, f->key, n)) goto oom;
    f->key = NULL;
    return 0;
oom:
    mgc_diag(d, MGC_SEV_ERROR, n->loc, NULL, "out of memory while reading YAML");
    return -1;
}

mgc_ytree *mgc_ytree_parse(const char *file, const char *text, size_t len, mgc_diags *d) {
    mgc_ytree *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->file = mgc_ytree_strdup(t, file, strlen(file));
    mgc_loc whole = {t->file, 0, 0};
    if (!t->file) goto fail_oom;
    if (len > MGC_YAML_MAX_BYTES) {
        mgc_diag(d, MGC_SEV_ERROR, whole, "a model config is a few kilobytes; is this the right file?",
                 "input is %zu bytes, more than the limit of %u", len, MGC_YAML_MAX_BYTES);
        goto fail;
    }

    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) goto fail_oom;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);

    frame stack[MGC_YAML_MAX_DEPTH];
    int depth = 0, docs = 0, done = 0, ok = 1;
    while (!done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            mgc_loc l = mark_loc(t, p.problem_mark);
            char hint[256] = "check indentation, that every `key: value` has a space after the colon, and quoting";
            if (p.context)
                snprintf(hint, sizeof hint, "%s (line %d); check indentation and quoting", p.context,
                         (int)p.context_mark.line + 1);
            if (p.error == YAML_MEMORY_ERROR) l = whole;
            mgc_diag(d, MGC_SEV_ERROR, l, hint, "invalid YAML: %s", p.problem ? p.problem : "unknown error");
            ok = 0;
            break;
        }
        mgc_loc l = mark_loc(t, ev.start_mark);
        mgc_ynode *n = NULL;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                mgc_diag(d, MGC_SEV_ERROR, l, "put the whole config in one document (remove the second `---`)",
                         "more than one YAML document");
                ok = 0;
                done = 1;
            }
            break;
        case YAML_ALIAS_EVENT:
            mgc_diag(d, MGC_SEV_ERROR, l, "write the value out in full; mgc configs do not use anchors",
                     "YAML aliases (*%.40s) are not supported", (const char *)ev.data.alias.anchor);
            ok = 0;
            done = 1;
            break;
        case YAML_SCALAR_EVENT: {
            const char *s = (const char *)ev.data.scalar.value;
            size_t sl = ev.data.scalar.length;
            if (ev.data.scalar.anchor) goto anchor;
            if (memchr(s, 0, sl)) {
                mgc_diag(d, MGC_SEV_ERROR, l, "remove the \\0 escape", "a NUL character inside a value is not allowed");
                ok = 0;
                done = 1;
                break;
            }
            int plain = ev.data.scalar.plain_implicit && ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            n = mgc_ynode_new(t, plain && is_null_text(s, sl) ? MGC_Y_NULL : MGC_Y_SCALAR, l);
            if (!n || !(n->s = mgc_ytree_strdup(t, s, sl))) goto limit;
            n->len = sl;
            n->quoted = plain ? 0
                        : (ev.data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                           ev.data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE) ? 1 : 2;
            if (attach(t, stack, depth, n, d)) ok = 0, done = 1;
            break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
            int seq = ev.type == YAML_SEQUENCE_START_EVENT;
            if ((seq ? ev.data.sequence_start.anchor : ev.data.mapping_start.anchor)) goto anchor;
            if (depth == MGC_YAML_MAX_DEPTH) {
                mgc_diag(d, MGC_SEV_ERROR, l, "mgc configs nest three levels deep",
                         "nesting deeper than %d levels", MGC_YAML_MAX_DEPTH);
                ok = 0;
                done = 1;
                break;
            }
            n = mgc_ynode_new(t, seq ? MGC_Y_SEQ : MGC_Y_MAP, l);
            if (!n) goto limit;
            if (attach(t, stack, depth, n, d)) {
                ok = 0;
                done = 1;
                break;
            }
            stack[depth].node = n;
            stack[depth].key = NULL;
            depth++;
            break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: depth--; break;
        default: break;
        }
        yaml_event_delete(&ev);
        continue;
    anchor:
        mgc_diag(d, MGC_SEV_ERROR, l, "write the value out in full; mgc configs do not use anchors",
                 "YAML anchors (&%.40s) are not supported",
                 ev.type == YAML_SCALAR_EVENT ? (const char *)ev.data.scalar.anchor
                 : ev.type == YAML_SEQUENCE_START_EVENT ? (const char *)ev.data.sequence_start.anchor
                                                        : (const char *)ev.data.mapping_start.anchor);
        yaml_event_delete(&ev);
        ok = 0;
        break;
    limit:
        mgc_diag(d, MGC_SEV_ERROR, l, "a model config has a few hundred values at most",
                 "more than %d YAML nodes (or out of memory)", MGC_YAML_MAX_NODES);
        yaml_event_delete(&ev);
        ok = 0;
        break;
    }
    yaml_parser_delete(&p);
    if (!ok) goto fail;
    if (!t->root || t->root->kind == MGC_Y_NULL) {
        t->root = mgc_ynode_new(t, MGC_Y_MAP, (mgc_loc){t->file, 1, 1});
        if (!t->root) goto fail_oom;
    }
    return t;
fail_oom:
    mgc_diag(d, MGC_SEV_ERROR, whole, NULL, "out of memory while reading YAML");
fail:
    mgc_ytree_free(t);
    return NULL;
}
