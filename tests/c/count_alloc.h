/* count_alloc.h -- the counting allocator that alloc_hook.h routes the
 * core's malloc/calloc/realloc/free to in the sanitizer driver and the
 * fuzzers (count_alloc.c). It knows how many bytes the core holds, so a
 * test can compare that with mn_memory_bytes(), and it can make the k-th
 * allocation from now fail, so a test can check that an operation whose
 * allocation fails leaves the stream exactly as it was. */
#ifndef RCP11_COUNT_ALLOC_H
#define RCP11_COUNT_ALLOC_H

#include <stddef.h>

/* Bytes the core holds right now (sum of the sizes it asked for). */
size_t count_alloc_live(void);

/* Let `k` more allocations succeed, then fail every one after them (a real
 * out-of-memory condition does not go away by itself). k < 0: never fail. */
void count_alloc_fail_after(long k);

/* Allocations that failed on purpose since the last call (then reset). */
long count_alloc_failures(void);

#endif /* RCP11_COUNT_ALLOC_H */
