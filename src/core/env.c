/* env.c — see env.h. */
#include "core/env.h"

#include <stdlib.h>
#include <string.h>

bool ds_env_switch(const char *name, bool dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strcmp(v, "0") != 0 && strcmp(v, "off") != 0;
}
