/* json_schema_internal.h — the compiled schema graph shared by the compiler
 * (json_schema_compile.c) and the machine (json_schema.c). */
#ifndef DS_SAMPLING_JSON_SCHEMA_INTERNAL_H
#define DS_SAMPLING_JSON_SCHEMA_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "sampling/json_schema.h"

typedef enum js_kind {
    JS_OBJECT,      /* properties in order (props[first .. first + n)) */
    JS_FREE_OBJECT, /* any JSON object (JSON mode's automaton) */
    JS_ARRAY,       /* items: node `item` */
    JS_STRING,      /* any string */
    JS_NUMBER,      /* any JSON number */
    JS_INTEGER,     /* a JSON number without fraction or exponent */
    JS_LITERALS,    /* one of lits[first .. first + n) (enum, const, boolean, null) */
    JS_UNION,       /* one of alts[first .. first + n), chosen by the first byte */
    JS_REF,         /* a $ref not yet resolved (never left after compilation) */
} js_kind;

typedef struct js_node {
    uint8_t kind;
    int first, n;     /* props / lits / alts range */
    int item;         /* JS_ARRAY: the items' node */
    uint64_t start[4]; /* bytes a value of this node may begin with (bit c of start[c / 64]) */
} js_node;

typedef struct js_prop {
    char *key;   /* the key as compact JSON text, quotes included ("\"name\"") */
    int key_len;
    int node;
    bool required;
} js_prop;

typedef struct js_lit {
    char *text; /* the value as compact JSON text */
    int len;
} js_lit;

struct ds_json_schema {
    atomic_int refs;
    js_node *nodes;
    int n_nodes;
    js_prop *props;
    int n_props;
    js_lit *lits;
    int n_lits;
    int *alts;
    int n_alts;
    int root;
};

static inline bool js_starts(const js_node *n, uint8_t c) { return (n->start[c >> 6] >> (c & 63)) & 1u; }

#endif
