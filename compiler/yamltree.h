/* yamltree.h - a YAML document as a small tree, with positions, and hard limits.
 *
 * libyaml's event parser feeds a tree of scalars, sequences and mappings.
 * Every node remembers where it started (line, col), so later passes can
 * report problems in terms of the user's file.  All nodes live in one arena
 * owned by the mgc_ytree and are freed together.
 *
 * Limits make hostile input harmless: at most MGC_YAML_MAX_BYTES of input,
 * MGC_YAML_MAX_DEPTH levels of nesting and MGC_YAML_MAX_NODES nodes.  Anchors
 * and aliases are rejected (a config has no use for them, and they are how
 * "billion laughs" inputs blow up), as are documents after the first.
 */
#ifndef MGC_YAMLTREE_H
#define MGC_YAMLTREE_H

#include <stddef.h>
#include <stdint.h>

#include "diag.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_YAML_MAX_BYTES (4u << 20) /* 4 MiB of YAML is far beyond any config */
#define MGC_YAML_MAX_DEPTH 32         /* configs nest 3 deep */
#define MGC_YAML_MAX_NODES 200000     /* 1,000-entry blends are still fine */

typedef enum mgc_ykind {
    MGC_Y_NULL = 0, /* empty value, `~` or `null` (plain) */
    MGC_Y_SCALAR,   /* any other scalar; `quoted` says whether it was quoted */
    MGC_Y_SEQ,      /* sequence: kids[] are items */
    MGC_Y_MAP,      /* mapping: keys[] and kids[] are pairs */
} mgc_ykind;

typedef struct mgc_ynode mgc_ynode;
struct mgc_ynode {
    mgc_ykind kind; /* what this node is */
    mgc_loc loc;    /* where it starts (1-based) */
    const char *s;  /* scalar text, NUL-terminated (may hold no NUL inside: such input is rejected) */
    size_t len;     /* scalar length in bytes */
    int quoted;     /* 0 plain, 1 single- or double-quoted (loc is the quote), 2 block scalar */
    int n;          /* number of items (SEQ) or pairs (MAP) */
    int cap;        /* allocated slots */
    mgc_ynode **kids;  /* (n) items or values */
    mgc_ynode **keys;  /* (n) mapping keys (scalars), MAP only */
};

typedef struct mgc_ytree mgc_ytree;

/* Parse `len` bytes of YAML named `file` (used in locations).  Returns NULL
 * and appends diagnostics on any syntax error or limit.  An empty document
 * gives a tree whose root is an empty mapping. */
mgc_ytree *mgc_ytree_parse(const char *file, const char *text, size_t len, mgc_diags *d);

void mgc_ytree_free(mgc_ytree *t);

mgc_ynode *mgc_ytree_root(mgc_ytree *t);

/* The file name the tree was parsed under (owned by the tree). */
const char *mgc_ytree_file(const mgc_ytree *t);

/* Make a new node in t's arena (for overrides spliced in from --set). */
mgc_ynode *mgc_ynode_new(mgc_ytree *t, mgc_ykind kind, mgc_loc loc);
/* Copy a node (deeply) from another tree into t's arena. */
mgc_ynode *mgc_ynode_copy(mgc_ytree *t, const mgc_ynode *src);
/* Append a pair to a mapping, or an item (key NULL) to a sequence. 0 on success. */
int mgc_ynode_append(mgc_ytree *t, mgc_ynode *parent, mgc_ynode *key, mgc_ynode *val);
/* Intern a string in t's arena. */
const char *mgc_ytree_strdup(mgc_ytree *t, const char *s, size_t len);

/* Look up `key` in a mapping; NULL when absent or not a mapping. */
mgc_ynode *mgc_ymap_get(const mgc_ynode *map, const char *key);

#ifdef __cplusplus
}
#endif
#endif /* MGC_YAMLTREE_H */
