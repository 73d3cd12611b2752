/* check.h -- CHECK(cond) for the C tests (driver.c) and the fuzzers
 * (fuzz/core): print the failed condition and abort, so that the
 * sanitizers and libFuzzer report it with a stack trace. */
#ifndef RCP11_CHECK_H
#define RCP11_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

#endif /* RCP11_CHECK_H */
