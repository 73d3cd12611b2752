/* module_alloc.h -- force-included (cc -include) into macronode.c when it is
 * compiled into the Redis module, so that the storage core allocates through
 * Redis's allocator: then INFO's used_memory, maxmemory and MEMORY USAGE see
 * every byte a stream holds. macronode.c itself knows nothing about this and
 * is compiled unchanged (the sanitizer build does the same with
 * tests/c/alloc_hook.h).
 *
 * RedisModule_Alloc/Calloc/Realloc/Free are the function pointers module.c
 * fills in when the module is loaded; the core allocates nothing before
 * that. Like every allocation in redis-server they abort the process when
 * memory is exhausted (zmalloc's out-of-memory handler), so the core's
 * MN_ERR_NOMEM paths never run inside the module: maxmemory, which refuses
 * TWRITE with -OOM before memory runs out, is what keeps a server alive.
 *
 * RCP11_MODULE_LIBC_ALLOC (set by the sanitizer build of the module) keeps
 * libc's allocator instead, so AddressSanitizer sees the core's heap blocks
 * (Redis's jemalloc blocks have no redzones for it to check). */
#ifndef RCP11_MODULE_LIBC_ALLOC
#include <stdlib.h>

extern void *(*RedisModule_Alloc)(size_t bytes);
extern void *(*RedisModule_Calloc)(size_t nmemb, size_t size);
extern void *(*RedisModule_Realloc)(void *ptr, size_t bytes);
extern void (*RedisModule_Free)(void *ptr);

#define malloc(size) RedisModule_Alloc(size)
#define calloc(count, size) RedisModule_Calloc(count, size)
#define realloc(ptr, size) RedisModule_Realloc(ptr, size)
#define free(ptr) RedisModule_Free(ptr)
/* The host's allocator owns the pages: the core leaves them alone. */
#define MN_HOSTED_ALLOCATOR 1
#endif
