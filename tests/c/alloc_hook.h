/* alloc_hook.h -- force-included (cc -include) into macronode.c for the
 * sanitizer build only. It routes the core's allocations through the
 * driver's counting allocator, which can make the k-th allocation fail.
 * That lets driver.c check that memory_bytes is exact (it must equal the
 * bytes the core holds) and that every operation is atomic on allocation
 * failure. macronode.c itself knows nothing about this. */
#include <stdlib.h>

void *mn_test_malloc(size_t size);
void *mn_test_calloc(size_t count, size_t size);
void *mn_test_realloc(void *ptr, size_t size);
void mn_test_free(void *ptr);

#define malloc(size) mn_test_malloc(size)
#define calloc(count, size) mn_test_calloc(count, size)
#define realloc(ptr, size) mn_test_realloc(ptr, size)
#define free(ptr) mn_test_free(ptr)
