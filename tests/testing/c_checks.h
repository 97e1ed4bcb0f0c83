/* The check macros of the C ABI's C99 tests (tests/c_api_test.c, tests/c_api_contract_test.c):
 * a failed check counts and prints its line; the test's main returns nonzero when g_failures is.
 * Each test keeps its own CHECK_FAILS (they check different things of a failing call). */
#ifndef E8KV_TESTS_C_CHECKS_H
#define E8KV_TESTS_C_CHECKS_H

#include <stdio.h>

#include "e8kv/c_api.h"

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                             \
  do {                                                                          \
    ++g_checks;                                                                 \
    if (!(cond)) {                                                              \
      ++g_failures;                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                           \
  } while (0)

/* A call must succeed; on failure prints the library's message. */
#define CHECK_OK(call)                                                                                       \
  do {                                                                                                       \
    e8kv_status status_ = (call);                                                                            \
    ++g_checks;                                                                                              \
    if (status_ != E8KV_OK) {                                                                                \
      ++g_failures;                                                                                          \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, e8kv_status_name(status_), \
              e8kv_last_error());                                                                            \
    }                                                                                                        \
  } while (0)

#endif
