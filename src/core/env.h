/* env.h — optimisation switches and other boolean knobs read from the environment. */
#ifndef DS_CORE_ENV_H
#define DS_CORE_ENV_H

#include <stdbool.h>

/* A switch (README "Switches"): dflt when the variable is unset or empty, off when it is "0" or
 * "off", on for any other value. */
bool ds_env_switch(const char *name, bool dflt);

#endif
