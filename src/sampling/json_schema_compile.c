/* json_schema_compile.c — a JSON Schema (cJSON tree, untrusted) → the node graph of
 * json_schema_internal.h, or a message naming what is not supported and where. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sampling/json_schema_internal.h"

#define JS_MAX_NEST 64  /* nested schema objects while compiling (bounds the C recursion) */
#define JS_MAX_REFS 256 /* distinct $ref targets */

typedef struct js_ref {
    char *ref;
    int node;
} js_ref;

typedef struct cc {
    ds_json_schema *s;
    const cJSON *doc; /* the whole schema: $ref targets resolve in it */
    js_ref refs[JS_MAX_REFS];
    int n_refs;
    int cap_nodes, cap_props, cap_lits, cap_alts;
    char **union_path; /* [n_nodes] where each union was written, for the disjointness check */
    char *err;
    size_t err_len;
    bool failed;
} cc;

static int fail(cc *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cc *c, const char *path, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->err_len, "%s (at %.200s)", msg, path);
    return -1;
}

/* grows *arr (elements of size sz) to hold n + 1 */
static bool grow(void **arr, int *cap, int n, size_t sz) {
    if (n < *cap) return true;
    const int nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, (size_t)nc * sz);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

static int new_node(cc *c, const char *path) {
    if (c->s->n_nodes >= DS_JS_MAX_NODES)
        return fail(c, path, "the schema has more than %d nodes", DS_JS_MAX_NODES);
    const int cap0 = c->cap_nodes;
    if (!grow((void **)&c->s->nodes, &c->cap_nodes, c->s->n_nodes, sizeof(js_node)))
        return fail(c, path, "out of memory");
    if (c->cap_nodes != cap0) {
        char **up = realloc(c->union_path, (size_t)c->cap_nodes * sizeof *up);
        if (!up) return fail(c, path, "out of memory");
        c->union_path = up;
    }
    const int i = c->s->n_nodes++;
    c->s->nodes[i] = (js_node){.kind = JS_REF, .item = -1};
    c->union_path[i] = NULL;
    return i;
}

static char *json_text(const cJSON *v) { return cJSON_PrintUnformatted(v); }

static int add_lit(cc *c, const cJSON *v, const char *path) {
    char *t = json_text(v);
    if (!t) return fail(c, path, "out of memory");
    if (strlen(t) > DS_JS_MAX_TEXT) { /* (the automaton counts matched bytes in 16 bits) */
        free(t);
        return fail(c, path, "an enum / const value is longer than %d bytes as JSON", DS_JS_MAX_TEXT);
    }
    if (!grow((void **)&c->s->lits, &c->cap_lits, c->s->n_lits, sizeof(js_lit))) {
        free(t);
        return fail(c, path, "out of memory");
    }
    c->s->lits[c->s->n_lits++] = (js_lit){t, (int)strlen(t)};
    return 0;
}

static const char *const ANNOTATIONS[] = {"title",   "description", "default",    "examples",
                                          "$schema", "$id",         "$comment",   "deprecated",
                                          "readOnly", "writeOnly",  "$defs",      "definitions"};
/* keywords this compiler enforces */
static const char *const HANDLED[] = {"type",  "properties", "required", "additionalProperties",
                                      "items", "enum",       "const",    "anyOf",
                                      "oneOf", "$ref"};

static bool in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return true;
    return false;
}

static int compile_into(cc *c, const cJSON *sch, const char *path, int depth, int idx);

static int compile(cc *c, const cJSON *sch, const char *path, int depth) {
    const int idx = new_node(c, path);
    if (idx < 0) return -1;
    return compile_into(c, sch, path, depth, idx) < 0 ? -1 : idx;
}

/* "#", "#/$defs/NAME", "#/definitions/NAME" → the node (compiled once; recursion allowed). */
static int compile_ref(cc *c, const char *ref, const char *path, int depth) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].node;
    const cJSON *target = NULL;
    if (!strcmp(ref, "#")) {
        target = c->doc;
    } else {
        const char *name = NULL;
        const cJSON *defs = NULL;
        if (!strncmp(ref, "#/$defs/", 8)) {
            name = ref + 8;
            defs = cJSON_GetObjectItemCaseSensitive(c->doc, "$defs");
        } else if (!strncmp(ref, "#/definitions/", 14)) {
            name = ref + 14;
            defs = cJSON_GetObjectItemCaseSensitive(c->doc, "definitions");
        } else {
            return fail(c, path, "$ref '%.100s' is not supported (only \"#\", \"#/$defs/NAME\" "
                                 "and \"#/definitions/NAME\")", ref);
        }
        if (strchr(name, '/') || strchr(name, '~'))
            return fail(c, path, "$ref '%.100s': nested JSON pointers are not supported", ref);
        target = cJSON_IsObject(defs) ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
        if (!target) return fail(c, path, "$ref '%.100s' names no definition", ref);
    }
    if (c->n_refs >= JS_MAX_REFS) return fail(c, path, "more than %d $ref targets", JS_MAX_REFS);
    const int idx = new_node(c, path);
    if (idx < 0) return -1;
    char *dup = strdup(ref);
    if (!dup) return fail(c, path, "out of memory");
    c->refs[c->n_refs++] = (js_ref){dup, idx};
    char sub[256];
    snprintf(sub, sizeof sub, "%.200s", ref);
    return compile_into(c, target, sub, depth + 1, idx) < 0 ? -1 : idx;
}

/* Node idx becomes the union of nodes ids[n]; `where` (NULL: a $ref, one alternative) is kept
 * for the message of check_unions. */
static int make_union(cc *c, int idx, const int *ids, int n, const char *path, const char *where) {
    js_node *nd = &c->s->nodes[idx];
    nd->kind = JS_UNION;
    nd->first = c->s->n_alts;
    nd->n = n;
    for (int i = 0; i < n; i++) {
        if (!grow((void **)&c->s->alts, &c->cap_alts, c->s->n_alts, sizeof(int)))
            return fail(c, path, "out of memory");
        c->s->alts[c->s->n_alts++] = ids[i];
    }
    if (where && !(c->union_path[idx] = strdup(where))) return fail(c, path, "out of memory");
    return 0;
}

static int compile_union(cc *c, const cJSON *alts, const char *kw, const char *path, int depth, int idx) {
    if (!cJSON_IsArray(alts) || cJSON_GetArraySize(alts) < 1)
        return fail(c, path, "%s must be a non-empty array", kw);
    int ids[DS_JS_MAX_ALTS];
    int n = 0;
    char sub[256];
    for (const cJSON *a = alts->child; a; a = a->next) {
        if (n >= DS_JS_MAX_ALTS) return fail(c, path, "%s has more than %d alternatives", kw, DS_JS_MAX_ALTS);
        snprintf(sub, sizeof sub, "%.200s/%s/%d", path, kw, n);
        ids[n] = compile(c, a, sub, depth + 1);
        if (ids[n] < 0) return -1;
        n++;
    }
    return make_union(c, idx, ids, n, path, path);
}

/* One type name of "type" into node idx (the schema's other keywords apply to it). */
static int compile_typed(cc *c, const cJSON *sch, const char *type, const char *path, int depth, int idx) {
    js_node *nd = &c->s->nodes[idx];
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(sch, "items");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    char sub[256];
    if (!strcmp(type, "string")) {
        nd->kind = JS_STRING;
    } else if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        nd->kind = type[0] == 'n' ? JS_NUMBER : JS_INTEGER;
    } else if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        nd->kind = JS_LITERALS;
        nd->first = c->s->n_lits;
        cJSON *t = type[0] == 'b' ? cJSON_CreateTrue() : cJSON_CreateNull();
        cJSON *f = type[0] == 'b' ? cJSON_CreateFalse() : NULL;
        const int r = (t ? add_lit(c, t, path) : fail(c, path, "out of memory")) < 0 ||
                              (f && add_lit(c, f, path) < 0) ? -1 : 0;
        cJSON_Delete(t);
        cJSON_Delete(f);
        if (r < 0) return -1;
        nd = &c->s->nodes[idx];
        nd->n = c->s->n_lits - nd->first;
    } else if (!strcmp(type, "array")) {
        if (!items) return fail(c, path, "an array schema needs \"items\"");
        if (!cJSON_IsObject(items)) return fail(c, path, "\"items\" must be a schema object");
        snprintf(sub, sizeof sub, "%.200s/items", path);
        const int it = compile(c, items, sub, depth + 1);
        if (it < 0) return -1;
        nd = &c->s->nodes[idx];
        nd->kind = JS_ARRAY;
        nd->item = it;
    } else if (!strcmp(type, "object")) {
        bool closed = false;
        if (addl && cJSON_IsFalse(addl)) closed = true;
        else if (addl && !cJSON_IsTrue(addl) && !(cJSON_IsObject(addl) && !addl->child))
            return fail(c, path, "\"additionalProperties\" as a schema is not supported (true or false)");
        if (props && !cJSON_IsObject(props)) return fail(c, path, "\"properties\" must be an object");
        if (req && !cJSON_IsArray(req)) return fail(c, path, "\"required\" must be an array");
        const int n = props ? cJSON_GetArraySize(props) : 0;
        if (n == 0 && !closed) {
            if (req && cJSON_GetArraySize(req) > 0)
                return fail(c, path, "\"required\" names properties the schema does not define");
            nd->kind = JS_FREE_OBJECT;
            return 0;
        }
        if (n > DS_JS_MAX_PROPS)
            return fail(c, path, "an object schema has more than %d properties", DS_JS_MAX_PROPS);
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
            if (!cJSON_IsString(r)) return fail(c, path, "\"required\" must list strings");
            if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return fail(c, path, "\"required\" names '%.60s', which is not in \"properties\"",
                            r->valuestring);
        }
        /* the children first: compiling them may move c->s->props */
        int kids[DS_JS_MAX_PROPS];
        int k = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next, k++) {
            for (const cJSON *q = props->child; q != p; q = q->next)
                if (!strcmp(q->string, p->string))
                    return fail(c, path, "property '%.60s' is defined twice", p->string);
            if (!cJSON_IsObject(p)) return fail(c, path, "property '%.60s' is not a schema object", p->string);
            snprintf(sub, sizeof sub, "%.150s/properties/%.60s", path, p->string);
            kids[k] = compile(c, p, sub, depth + 1);
            if (kids[k] < 0) return -1;
        }
        nd = &c->s->nodes[idx];
        nd->kind = JS_OBJECT;
        nd->first = c->s->n_props;
        nd->n = n;
        k = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next, k++) {
            if (!grow((void **)&c->s->props, &c->cap_props, c->s->n_props, sizeof(js_prop)))
                return fail(c, path, "out of memory");
            cJSON *ks = cJSON_CreateString(p->string);
            char *kt = ks ? json_text(ks) : NULL;
            cJSON_Delete(ks);
            if (!kt) return fail(c, path, "out of memory");
            if (strlen(kt) > DS_JS_MAX_TEXT) {
                free(kt);
                return fail(c, path, "property name '%.40s...' is longer than %d bytes", p->string, DS_JS_MAX_TEXT);
            }
            bool required = false;
            for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
                required |= !strcmp(r->valuestring, p->string);
            c->s->props[c->s->n_props++] = (js_prop){kt, (int)strlen(kt), kids[k], required};
        }
    } else {
        return fail(c, path, "type '%.40s' is not a JSON Schema type", type);
    }
    return 0;
}

static int compile_into(cc *c, const cJSON *sch, const char *path, int depth, int idx) {
    if (depth > JS_MAX_NEST) return fail(c, path, "the schema nests deeper than %d", JS_MAX_NEST);
    if (!cJSON_IsObject(sch)) return fail(c, path, "a schema must be a JSON object");
    for (const cJSON *k = sch->child; k; k = k->next) {
        if (in_list(k->string, ANNOTATIONS, sizeof ANNOTATIONS / sizeof ANNOTATIONS[0]) ||
            in_list(k->string, HANDLED, sizeof HANDLED / sizeof HANDLED[0]))
            continue;
        return fail(c, path, "keyword '%.60s' is not supported", k->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sch, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sch, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(sch, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(sch, "oneOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type");
    const int forms = !!ref + !!(en || cn) + !!any + !!one;
    if (forms > 1)
        return fail(c, path, "combining $ref, enum / const, anyOf and oneOf in one schema is not "
                             "supported");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, path, "$ref must be a string");
        const int t = compile_ref(c, ref->valuestring, path, depth);
        if (t < 0) return -1;
        /* this node becomes a one-way union to the target: the machine follows it */
        return make_union(c, idx, &t, 1, path, NULL);
    }
    if (en || cn) { /* the values alone decide (a "type" beside them adds nothing) */
        js_node *nd = &c->s->nodes[idx];
        nd->kind = JS_LITERALS;
        nd->first = c->s->n_lits;
        if (cn) {
            if (add_lit(c, cn, path) < 0) return -1;
        } else {
            if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) < 1)
                return fail(c, path, "enum must be a non-empty array");
            if (cJSON_GetArraySize(en) > DS_JS_MAX_ALTS)
                return fail(c, path, "enum has more than %d values", DS_JS_MAX_ALTS);
            for (const cJSON *v = en->child; v; v = v->next)
                if (add_lit(c, v, path) < 0) return -1;
        }
        nd = &c->s->nodes[idx];
        nd->n = c->s->n_lits - nd->first;
        return 0;
    }
    if (any || one) return compile_union(c, any ? any : one, any ? "anyOf" : "oneOf", path, depth, idx);
    if (cJSON_IsString(type)) return compile_typed(c, sch, type->valuestring, path, depth, idx);
    if (cJSON_IsArray(type)) { /* ["string", "null"]: a union of the types */
        const int n = cJSON_GetArraySize(type);
        if (n < 1 || n > 7) return fail(c, path, "\"type\" lists 1 to 7 types");
        int ids[8], k = 0;
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return fail(c, path, "\"type\" must list strings");
            ids[k] = new_node(c, path);
            if (ids[k] < 0 || compile_typed(c, sch, t->valuestring, path, depth + 1, ids[k]) < 0) return -1;
            k++;
        }
        return make_union(c, idx, ids, k, path, path);
    }
    if (type) return fail(c, path, "\"type\" must be a string or a list of strings");
    /* no type: implied by the keywords that only make sense for one */
    if (cJSON_GetObjectItemCaseSensitive(sch, "properties")) return compile_typed(c, sch, "object", path, depth, idx);
    if (cJSON_GetObjectItemCaseSensitive(sch, "items")) return compile_typed(c, sch, "array", path, depth, idx);
    return fail(c, path, "a schema without \"type\" (any value) is not supported");
}

static void set_start(js_node *n, uint8_t c) { n->start[c >> 6] |= 1ull << (c & 63); }

/* Start bytes of every node: a fixpoint, since unions may refer to each other. */
static void start_sets(ds_json_schema *s) {
    for (int i = 0; i < s->n_nodes; i++) {
        js_node *n = &s->nodes[i];
        memset(n->start, 0, sizeof n->start);
        switch (n->kind) {
        case JS_OBJECT:
        case JS_FREE_OBJECT: set_start(n, '{'); break;
        case JS_ARRAY: set_start(n, '['); break;
        case JS_STRING: set_start(n, '"'); break;
        case JS_NUMBER:
        case JS_INTEGER:
            set_start(n, '-');
            for (int d = '0'; d <= '9'; d++) set_start(n, (uint8_t)d);
            break;
        case JS_LITERALS:
            for (int l = 0; l < n->n; l++)
                if (s->lits[n->first + l].len > 0) set_start(n, (uint8_t)s->lits[n->first + l].text[0]);
            break;
        default: break;
        }
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < s->n_nodes; i++) {
            js_node *n = &s->nodes[i];
            if (n->kind != JS_UNION) continue;
            for (int a = 0; a < n->n; a++) {
                const js_node *t = &s->nodes[s->alts[n->first + a]];
                for (int w = 0; w < 4; w++) {
                    const uint64_t m = n->start[w] | t->start[w];
                    changed |= m != n->start[w];
                    n->start[w] = m;
                }
            }
        }
    }
}

/* Alternatives must start with different bytes (the machine picks one by the first byte), and
 * every node must be able to start at all (a $ref cycle through unions alone cannot). */
static int check_unions(cc *c) {
    const ds_json_schema *s = c->s;
    for (int i = 0; i < s->n_nodes; i++) {
        const js_node *n = &s->nodes[i];
        const char *where = c->union_path[i] ? c->union_path[i] : "#";
        if (!(n->start[0] | n->start[1] | n->start[2] | n->start[3]))
            return fail(c, where, "a schema that no value can match (a $ref cycle without content?)");
        if (n->kind != JS_UNION) continue;
        uint64_t seen[4] = {0};
        for (int a = 0; a < n->n; a++) {
            const js_node *t = &s->nodes[s->alts[n->first + a]];
            for (int w = 0; w < 4; w++) {
                if (seen[w] & t->start[w])
                    return fail(c, where, "anyOf / oneOf / type-list alternatives %d and an earlier one "
                                          "can start alike (they must differ in type: object, array, "
                                          "string, number, boolean, null)", a);
                seen[w] |= t->start[w];
            }
        }
    }
    return 0;
}

ds_json_schema *ds_json_schema_compile(const cJSON *schema, char *err, size_t err_len) {
    cc c = {.doc = schema, .err = err, .err_len = err_len};
    if (err_len) err[0] = 0;
    c.s = calloc(1, sizeof *c.s);
    if (!c.s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    atomic_init(&c.s->refs, 1);
    c.s->root = compile(&c, schema, "#", 0);
    if (!c.failed) {
        /* the root is an object (as OpenAI requires): the output ends when it closes; a root
         * that is only a $ref stands for its target */
        for (int hops = 0; hops < c.s->n_nodes && c.s->nodes[c.s->root].kind == JS_UNION &&
                           c.s->nodes[c.s->root].n == 1;
             hops++) /* (bounded: $ref cycles) */
            c.s->root = c.s->alts[c.s->nodes[c.s->root].first];
        const js_node *r = &c.s->nodes[c.s->root];
        if (r->kind != JS_OBJECT && r->kind != JS_FREE_OBJECT)
            fail(&c, "#", "the root schema must be an object (\"type\": \"object\")");
    }
    if (!c.failed) {
        start_sets(c.s);
        check_unions(&c);
    }
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    for (int i = 0; i < c.s->n_nodes; i++) free(c.union_path ? c.union_path[i] : NULL);
    free(c.union_path);
    if (c.failed) {
        ds_json_schema_unref(c.s);
        return NULL;
    }
    return c.s;
}

ds_json_schema *ds_json_schema_ref(ds_json_schema *s) {
    if (s) atomic_fetch_add(&s->refs, 1);
    return s;
}

void ds_json_schema_unref(ds_json_schema *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    for (int i = 0; i < s->n_props; i++) free(s->props[i].key);
    for (int i = 0; i < s->n_lits; i++) free(s->lits[i].text);
    free(s->nodes);
    free(s->props);
    free(s->lits);
    free(s->alts);
    free(s);
}
