/* module_child_nomem.h -- force-included (cc -include) into every file of a
 * test build of the Redis module (tests/test_module_save_failures.py),
 * never into the module users get. It stands for what cannot be provoked
 * from outside: serialising a value fails. Every allocation of the storage
 * cores (macronode.c, ackgroup.c) fails in a process other than the one
 * that loaded the module -- Redis's fork children, which write BGSAVE's
 * RDB file and a rewritten AOF -- and works as usual in the server itself.
 *
 * It takes the place of src/module_alloc.h (RCP11_MODULE_LIBC_ALLOC tells
 * that header to stand aside): the cores allocate from libc here, so only
 * INFO's memory figures differ from the real module's. The module's own
 * files allocate through RedisModule_Alloc and are not affected. */
#ifndef RCP11_TEST_MODULE_CHILD_NOMEM_H
#define RCP11_TEST_MODULE_CHILD_NOMEM_H

#define RCP11_MODULE_LIBC_ALLOC 1
#define _GNU_SOURCE /* getpid; what module_offsets_file.c asks for too */

#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* One copy per file; each is set when the server dlopen()s the module. */
static pid_t rcp11_test_server_pid;

__attribute__((constructor)) static void rcp11_test_note_server(void) {
    rcp11_test_server_pid = getpid();
}

static inline int rcp11_test_in_child(void) { return getpid() != rcp11_test_server_pid; }

static inline void *rcp11_test_malloc(size_t size) {
    return rcp11_test_in_child() ? NULL : malloc(size);
}

static inline void *rcp11_test_calloc(size_t count, size_t size) {
    return rcp11_test_in_child() ? NULL : calloc(count, size);
}

static inline void *rcp11_test_realloc(void *ptr, size_t size) {
    return rcp11_test_in_child() ? NULL : realloc(ptr, size);
}

#define malloc(size) rcp11_test_malloc(size)
#define calloc(count, size) rcp11_test_calloc(count, size)
#define realloc(ptr, size) rcp11_test_realloc(ptr, size)

#endif
