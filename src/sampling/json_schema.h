/* json_schema.h — structured outputs (OpenAI's response_format {"type": "json_schema"}): the
 * output is one JSON object that matches a JSON Schema.
 *
 * Two parts, like JSON mode (json_grammar.h), whose vocabulary tables and mask strategy this
 * shares:
 *  - the compiler (json_schema_compile.c): a schema → an immutable node graph
 *    (ds_json_schema, reference-counted so requests and their samplers can share it). It takes
 *    the subset below and refuses everything else with a message naming the keyword and where
 *    it is, so a schema is never silently enforced only in part;
 *  - the machine (json_schema.c): a byte-level pushdown automaton over that graph
 *    (ds_js_state, a fixed-size value: copying a sampler copies it) and the token mask.
 *
 * The subset (what OpenAI's strict mode and pydantic's usual output need):
 *  - root: an object schema;
 *  - "type": object, array, string, number, integer, boolean, null, or a list of them;
 *  - object: "properties" (at most 64), "required", "additionalProperties" false / true /
 *    absent. Properties are generated in the schema's order (as xgrammar and OpenAI do); a
 *    property that is not required may be left out; no other keys are generated. An object
 *    schema without "properties" takes any JSON object (JSON mode's automaton), or only {}
 *    with "additionalProperties": false;
 *  - array: "items" (a schema; required);
 *  - "enum" (at most 64 values) and "const": exactly one of the values, spelled as compact
 *    JSON;
 *  - "anyOf" / "oneOf" and type lists, when the alternatives start with different bytes
 *    (object / array / string / number / true-false / null), e.g. Optional[X];
 *  - "$ref" to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed);
 *  - annotations ignored: title, description, default, examples, $schema, $id, $comment,
 *    deprecated, readOnly, writeOnly.
 * Refused: pattern, format, minLength / maxLength, minimum / maximum and the like, minItems /
 * maxItems, allOf, not, if / then / else, prefixItems, patternProperties, additionalProperties
 * as a schema, and anyOf alternatives that start alike.
 *
 * Whitespace between tokens follows JSON mode's rule (one space, or a newline and up to
 * DS_JSON_MAX_INDENT spaces / tabs); strings take any byte ≥ 0x20 except '"' and '\\', and
 * JSON's escapes. Nesting is bounded by DS_JS_MAX_DEPTH open values (a recursive schema
 * cannot be generated deeper). */
#ifndef DS_SAMPLING_JSON_SCHEMA_H
#define DS_SAMPLING_JSON_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampling/json_grammar.h"

#define DS_JS_MAX_DEPTH 24    /* open values (frames) */
#define DS_JS_MAX_PROPS 64    /* properties of one object schema */
#define DS_JS_MAX_ALTS 64     /* enum values / const of one schema */
#define DS_JS_MAX_NODES 4096  /* nodes of one compiled schema */
#define DS_JS_MAX_TEXT 4096   /* bytes of one property name or enum / const value as JSON */

struct cJSON;
typedef struct ds_json_schema ds_json_schema;

/* Compiles `schema`; NULL with a message in err (err_len bytes) that names the keyword and
 * the JSON pointer of the schema it sits in. */
ds_json_schema *ds_json_schema_compile(const struct cJSON *schema, char *err, size_t err_len);
/* Another reference (returns s); thread-safe. */
ds_json_schema *ds_json_schema_ref(ds_json_schema *s);
/* Drops a reference; the last one frees. NULL is a no-op. */
void ds_json_schema_unref(ds_json_schema *s);

/* One open value. */
typedef struct ds_js_frame {
    uint16_t node;  /* schema node */
    uint8_t kind;   /* JS_F_* (json_schema.c) */
    uint8_t phase;  /* where inside the value */
    uint16_t idx;   /* object: the next property that may come; array: unused */
    uint16_t pos;   /* bytes of a key / literal matched; object after a key: the property */
    uint64_t alive; /* keys / literals still possible */
} ds_js_frame;

typedef struct ds_js_state {
    ds_js_frame f[DS_JS_MAX_DEPTH];
    uint8_t depth;
    uint8_t ws;         /* whitespace bytes in a row */
    uint8_t nl;         /* the whitespace run began with '\n' */
    uint8_t done;       /* the root object is closed */
    ds_json_state free; /* the open free object (an object schema without properties) */
} ds_js_state;

/* The state before the first byte. */
void ds_js_init(ds_js_state *st, const ds_json_schema *s);
/* Feeds one byte / n bytes; false (state unchanged) when they cannot continue a document that
 * matches the schema. */
bool ds_js_feed(ds_js_state *st, const ds_json_schema *s, uint8_t c);
bool ds_js_feed_bytes(ds_js_state *st, const ds_json_schema *s, const uint8_t *b, size_t n);
/* The root object is closed: only the end may follow. */
bool ds_js_done(const ds_js_state *st);
/* JSON mode's mask (ds_json_mask) for a schema: −inf for every id whose bytes cannot all be
 * fed; end_ids allowed exactly when done, and then alone. */
void ds_js_mask(const ds_js_state *st, const ds_json_schema *s, const ds_json_vocab *v,
                const int *end_ids, int n_end, float *logits, int n_logits);
/* Feeds token id's bytes; false when they cannot be fed. */
bool ds_js_feed_token(ds_js_state *st, const ds_json_schema *s, const ds_json_vocab *v, int id);

#endif
