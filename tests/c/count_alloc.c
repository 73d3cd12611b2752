/* count_alloc.c -- see count_alloc.h. Compiled without alloc_hook.h, so
 * malloc() here is the C library's (or the sanitizer's). */
#include "count_alloc.h"

#include <stdlib.h>
#include <string.h>

/* Each block carries its size in front; 16 bytes keep malloc's alignment. */
#define HOOK_HEADER 16

static size_t live_bytes;
static long fail_after = -1;
static long failures;

size_t count_alloc_live(void) { return live_bytes; }

void count_alloc_fail_after(long k) { fail_after = k < 0 ? -1 : k; }

long count_alloc_failures(void) {
    long n = failures;
    failures = 0;
    return n;
}

static int hook_should_fail(void) {
    if (fail_after < 0) return 0;
    if (fail_after == 0) {
        failures++;
        return 1;
    }
    fail_after--;
    return 0;
}

void *mn_test_malloc(size_t size) {
    if (hook_should_fail()) return NULL;
    unsigned char *p = malloc(size + HOOK_HEADER);
    if (p == NULL) return NULL;
    memcpy(p, &size, sizeof size);
    live_bytes += size;
    return p + HOOK_HEADER;
}

void *mn_test_calloc(size_t count, size_t size) {
    if (size != 0 && count > (size_t)-1 / size) return NULL;
    void *p = mn_test_malloc(count * size);
    if (p != NULL) memset(p, 0, count * size);
    return p;
}

void *mn_test_realloc(void *ptr, size_t size) {
    if (ptr == NULL) return mn_test_malloc(size);
    if (hook_should_fail()) return NULL;
    unsigned char *base = (unsigned char *)ptr - HOOK_HEADER;
    size_t old;
    memcpy(&old, base, sizeof old);
    unsigned char *p = realloc(base, size + HOOK_HEADER);
    if (p == NULL) return NULL;
    memcpy(p, &size, sizeof size);
    live_bytes = live_bytes - old + size;
    return p + HOOK_HEADER;
}

void mn_test_free(void *ptr) {
    if (ptr == NULL) return;
    unsigned char *base = (unsigned char *)ptr - HOOK_HEADER;
    size_t old;
    memcpy(&old, base, sizeof old);
    live_bytes -= old;
    free(base);
}
