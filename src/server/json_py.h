/* json_py.h — JSON text exactly as Python's json.dumps(x, ensure_ascii=False) writes it (the
 * `tojson` filter of Hugging Face chat templates): ", " and ": " separators, keys in their
 * original order, non-ASCII characters raw, control characters as \uXXXX except the short
 * escapes \n \r \t \b \f, integers without a fraction, floats in shortest round-trip form
 * (Python's repr: 0.1, 1e-05, 1e+16). cJSON keeps no int/float distinction, so a float with
 * an integral value (2.0) is written as an int (2) — the one known difference. */
#ifndef DS_SERVER_JSON_PY_H
#define DS_SERVER_JSON_PY_H

#include <cjson/cJSON.h>

#include "server/strbuf.h"

void ds_json_py_dump(ds_strbuf *out, const cJSON *v);
/* A JSON string literal with Python's escaping (ensure_ascii=False). */
void ds_json_py_string(ds_strbuf *out, const char *s);

#endif
