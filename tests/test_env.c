/* test_env.c — ds_env_switch (core/env.h), the rule every DS_OPT_* switch follows (README
 * "Switches"): the default when unset or empty, off for "0" and "off", on for anything else. */
#include <stdlib.h>

#include "testlib.h"

#include "core/env.h"

#define VAR "DS_TEST_ENV_SWITCH"

static void test_switch_rule(void **state) {
    (void)state;
    unsetenv(VAR);
    assert_true(ds_env_switch(VAR, true));
    assert_false(ds_env_switch(VAR, false));
    setenv(VAR, "", 1);
    assert_true(ds_env_switch(VAR, true));
    assert_false(ds_env_switch(VAR, false));
    const char *off[] = {"0", "off"};
    for (int i = 0; i < 2; i++) {
        setenv(VAR, off[i], 1);
        assert_false(ds_env_switch(VAR, true));
        assert_false(ds_env_switch(VAR, false));
    }
    const char *on[] = {"1", "on", "yes", "force"};
    for (int i = 0; i < 4; i++) {
        setenv(VAR, on[i], 1);
        assert_true(ds_env_switch(VAR, true));
        assert_true(ds_env_switch(VAR, false));
    }
    unsetenv(VAR);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_switch_rule)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
