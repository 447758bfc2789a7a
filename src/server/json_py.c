#include "server/json_py.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds_json_py_string(ds_strbuf *out, const char *s) {
    ds_strbuf_append(out, "\"", 1);
    const char *run = s;
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (esc) {
            ds_strbuf_append(out, run, (size_t)(p - run));
            ds_strbuf_puts(out, esc);
            run = p + 1;
        }
    }
    ds_strbuf_puts(out, run);
    ds_strbuf_append(out, "\"", 1);
}

/* Python float repr: the shortest digit string that reads back to the same double, written in
 * plain notation when the decimal exponent is in [-4, 16), else as d.ddde±XX. */
static void dump_number(ds_strbuf *out, double d) {
    if (!isfinite(d)) { /* Python writes NaN / Infinity (not valid JSON, but that is json.dumps) */
        ds_strbuf_puts(out, isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity"));
        return;
    }
    if (d == floor(d) && fabs(d) < 1e16) { /* cJSON cannot tell 2 from 2.0: write an int */
        ds_strbuf_printf(out, "%.0f", d);
        return;
    }
    char buf[48];
    for (int prec = 0; prec <= 16; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec, fabs(d));
        if (strtod(buf, NULL) == fabs(d)) break;
    }
    char digits[24]; /* mantissa digits without the point */
    int nd = 0;
    const char *e = strchr(buf, 'e');
    for (const char *p = buf; p < e; p++)
        if (*p >= '0' && *p <= '9' && nd < 20) digits[nd++] = *p;
    digits[nd] = 0;
    int exp10 = atoi(e + 1);
    if (d < 0) ds_strbuf_puts(out, "-");
    if (exp10 < -4 || exp10 >= 16) {
        ds_strbuf_printf(out, "%c", digits[0]);
        if (nd > 1) ds_strbuf_printf(out, ".%s", digits + 1);
        ds_strbuf_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        ds_strbuf_puts(out, "0.");
        for (int i = 0; i < -exp10 - 1; i++) ds_strbuf_puts(out, "0");
        ds_strbuf_puts(out, digits);
    } else {
        /* exp10 + 1 integer digits, the rest after the point (d is not integral here) */
        for (int i = 0; i <= exp10; i++) ds_strbuf_printf(out, "%c", i < nd ? digits[i] : '0');
        ds_strbuf_puts(out, ".");
        ds_strbuf_puts(out, nd > exp10 + 1 ? digits + exp10 + 1 : "0");
    }
}

void ds_json_py_dump(ds_strbuf *out, const cJSON *v) {
    if (!v || cJSON_IsNull(v)) {
        ds_strbuf_puts(out, "null");
    } else if (cJSON_IsTrue(v)) {
        ds_strbuf_puts(out, "true");
    } else if (cJSON_IsFalse(v)) {
        ds_strbuf_puts(out, "false");
    } else if (cJSON_IsNumber(v)) {
        dump_number(out, v->valuedouble);
    } else if (cJSON_IsString(v)) {
        ds_json_py_string(out, v->valuestring);
    } else if (cJSON_IsArray(v)) {
        ds_strbuf_puts(out, "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            ds_json_py_dump(out, c);
            if (c->next) ds_strbuf_puts(out, ", ");
        }
        ds_strbuf_puts(out, "]");
    } else if (cJSON_IsObject(v)) {
        ds_strbuf_puts(out, "{");
        for (const cJSON *c = v->child; c; c = c->next) {
            ds_json_py_string(out, c->string ? c->string : "");
            ds_strbuf_puts(out, ": ");
            ds_json_py_dump(out, c);
            if (c->next) ds_strbuf_puts(out, ", ");
        }
        ds_strbuf_puts(out, "}");
    } else if (cJSON_IsRaw(v)) {
        ds_strbuf_puts(out, v->valuestring);
    } else {
        ds_strbuf_puts(out, "null");
    }
}
