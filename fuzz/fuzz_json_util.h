/* fuzz_json_util.h — shared by the JSON fuzz targets. */
#ifndef DS_FUZZ_JSON_UTIL_H
#define DS_FUZZ_JSON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A \u escape of a UTF-16 surrogate (\uD800-\uDFFF): JSON's grammar allows it, cJSON refuses
 * an unpaired one, so the cJSON oracle skips such inputs. */
static inline bool has_surrogate_escape(const uint8_t *d, size_t n) {
    for (size_t i = 0; i + 2 < n; i++)
        if (d[i] == '\\' && d[i + 1] == 'u' && (d[i + 2] == 'd' || d[i + 2] == 'D')) return true;
    return false;
}

#endif
