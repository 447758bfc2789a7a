/* JavaScript number spelling and parsing, as the reference renderer (and so tojson, {{ n }},
 * |int, |float and loose ==) see numbers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* Shortest decimal digits that read back as v (v finite, > 0): digits in d (no trailing zeros),
 * returns k = number of digits; *exp10 = n such that v = 0.d1d2.. × 10^n. */
static int shortest_digits(double v, char d[24], int *exp10) {
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        if (strtod(tmp, NULL) == v || p == 17) {
            int k = 0;
            const char *q = tmp;
            for (; *q && *q != 'e'; q++)
                if (*q >= '0' && *q <= '9') d[k++] = *q;
            int e = atoi(q + 1);
            while (k > 1 && d[k - 1] == '0') k--;
            d[k] = 0;
            *exp10 = e + 1;
            return k;
        }
    }
    return 0; /* unreachable */
}

size_t tpl_num_js(double v, char *buf) {
    if (isnan(v)) return (size_t)sprintf(buf, "NaN");
    if (v == 0) return (size_t)sprintf(buf, "0");
    size_t o = 0;
    if (v < 0) {
        buf[o++] = '-';
        v = -v;
    }
    if (isinf(v)) return o + (size_t)sprintf(buf + o, "Infinity");
    char d[24];
    int n;
    int k = shortest_digits(v, d, &n);
    if (k <= n && n <= 21) {
        memcpy(buf + o, d, (size_t)k);
        o += (size_t)k;
        for (int i = 0; i < n - k; i++) buf[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(buf + o, d, (size_t)n);
        o += (size_t)n;
        buf[o++] = '.';
        memcpy(buf + o, d + n, (size_t)(k - n));
        o += (size_t)(k - n);
    } else if (-6 < n && n <= 0) {
        buf[o++] = '0';
        buf[o++] = '.';
        for (int i = 0; i < -n; i++) buf[o++] = '0';
        memcpy(buf + o, d, (size_t)k);
        o += (size_t)k;
    } else {
        buf[o++] = d[0];
        if (k > 1) {
            buf[o++] = '.';
            memcpy(buf + o, d + 1, (size_t)(k - 1));
            o += (size_t)(k - 1);
        }
        o += (size_t)sprintf(buf + o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    buf[o] = 0;
    return o;
}

size_t tpl_num_py(double v, bool is_float, char *buf) {
    if (isnan(v)) return (size_t)sprintf(buf, "NaN");
    if (isinf(v)) return (size_t)sprintf(buf, v < 0 ? "-Infinity" : "Infinity");
    /* an integral value this large came from a JSON float (integers lose precision anyway) */
    if (!is_float && fabs(v) < 1e16) return tpl_num_js(v, buf);
    if (v == 0) return (size_t)sprintf(buf, signbit(v) ? "-0.0" : "0.0");
    size_t o = 0;
    if (v < 0) {
        buf[o++] = '-';
        v = -v;
    }
    char d[24];
    int n;
    int k = shortest_digits(v, d, &n);
    if (n <= -4 || n > 16) { /* repr: d.ddde-05 / de+16 */
        buf[o++] = d[0];
        if (k > 1) {
            buf[o++] = '.';
            memcpy(buf + o, d + 1, (size_t)(k - 1));
            o += (size_t)(k - 1);
        }
        o += (size_t)sprintf(buf + o, "e%c%02d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    } else if (n <= 0) {
        buf[o++] = '0';
        buf[o++] = '.';
        for (int i = 0; i < -n; i++) buf[o++] = '0';
        memcpy(buf + o, d, (size_t)k);
        o += (size_t)k;
    } else if (k <= n) {
        memcpy(buf + o, d, (size_t)k);
        o += (size_t)k;
        for (int i = 0; i < n - k; i++) buf[o++] = '0';
        buf[o++] = '.';
        buf[o++] = '0';
    } else {
        memcpy(buf + o, d, (size_t)n);
        o += (size_t)n;
        buf[o++] = '.';
        memcpy(buf + o, d + n, (size_t)(k - n));
        o += (size_t)(k - n);
    }
    buf[o] = 0;
    return o;
}

size_t ds_json_number_format(double v, char buf[32]) {
    if (!isfinite(v)) return (size_t)sprintf(buf, "null"); /* as JSON.stringify */
    return tpl_num_js(v, buf);
}

static bool digit(char c) { return c >= '0' && c <= '9'; }

/* Length of the longest StrDecimalLiteral prefix of s (sign included), 0 if none. */
static size_t decimal_prefix(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (n - i >= 8 && !memcmp(s + i, "Infinity", 8)) return i + 8;
    size_t int_start = i;
    while (i < n && digit(s[i])) i++;
    size_t int_digits = i - int_start, frac_digits = 0;
    if (i < n && s[i] == '.') {
        size_t j = i + 1;
        while (j < n && digit(s[j])) j++;
        frac_digits = j - i - 1;
        if (int_digits || frac_digits) i = j;
    }
    if (!int_digits && !frac_digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        size_t ds = j;
        while (j < n && digit(s[j])) j++;
        if (j > ds) i = j;
    }
    return i;
}

static double parse_decimal(const char *s, size_t n) {
    char tmp[512];
    size_t i = 0;
    bool neg = false;
    if (n && (s[0] == '+' || s[0] == '-')) neg = s[0] == '-', i = 1;
    if (n - i == 8 && !memcmp(s + i, "Infinity", 8)) return neg ? -INFINITY : INFINITY;
    if (n < sizeof tmp) {
        memcpy(tmp, s, n);
        tmp[n] = 0;
        return strtod(tmp, NULL);
    }
    char *big = malloc(n + 1);
    if (!big) return NAN;
    memcpy(big, s, n);
    big[n] = 0;
    double v = strtod(big, NULL);
    free(big);
    return v;
}

double tpl_parse_int(const char *s, size_t n) {
    size_t i = tpl_js_space_prefix(s, n);
    size_t st = i;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    size_t ds = i;
    while (i < n && digit(s[i])) i++;
    if (i == ds) return NAN;
    return parse_decimal(s + st, i - st);
}

double tpl_parse_float(const char *s, size_t n) {
    size_t i = tpl_js_space_prefix(s, n);
    size_t k = decimal_prefix(s + i, n - i);
    if (!k) return NAN;
    return parse_decimal(s + i, k);
}

double tpl_to_number(const char *s, size_t n) {
    size_t a = tpl_js_space_prefix(s, n);
    size_t b = n - a ? tpl_js_space_suffix(s + a, n - a) : 0;
    s += a;
    n -= a + b;
    if (!n) return 0;
    if (n > 2 && s[0] == '0' && strchr("xXoObB", s[1])) {
        int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
        double v = 0;
        for (size_t i = 2; i < n; i++) {
            int dv = digit(s[i]) ? s[i] - '0'
                     : (s[i] >= 'a' && s[i] <= 'f') ? s[i] - 'a' + 10
                     : (s[i] >= 'A' && s[i] <= 'F') ? s[i] - 'A' + 10
                                                      : 99;
            if (dv >= base) return NAN;
            v = v * base + dv;
        }
        return v;
    }
    if (decimal_prefix(s, n) != n) return NAN;
    return parse_decimal(s, n);
}
