/* ackgroup_driver.c -- the acknowledged-group state (src/ackgroup.c) under
 * AddressSanitizer and UBSan, on the counting allocator of count_alloc.c
 * (run_sanitizers.sh builds it): random leases, acknowledgements, floors
 * and picks keep ag_memory_bytes() equal to the bytes the group holds;
 * every operation that may allocate, made to fail at each of its
 * allocations, leaves the group exactly as it was (same blob); damaged
 * and truncated blobs are refused without a finding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ackgroup.h"
#include "check.h"
#include "count_alloc.h"

static uint64_t rng_state = 88172645463325252ULL;

static uint64_t rnd(uint64_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? rng_state % n : 0;
}

/* The group's blob, for comparing states (the caller frees). */
static mn_buf blob_of(const ag_group *g) {
    mn_buf b;
    mn_buf_init(&b);
    CHECK(ag_serialize(g, &b) == AG_OK);
    return b;
}

static int same_blob(const mn_buf *a, const mn_buf *b) {
    return a->len == b->len && memcmp(a->data, b->data, a->len) == 0;
}

static const char *const owners[] = {"", "w1", "worker-2", "a-longer-consumer-name-3"};

static void random_op(ag_group *g, uint64_t *end, int64_t *now) {
    uint64_t op = rnd(10);
    if (op < 4) {
        *end += rnd(40);
        ag_choice c;
        uint64_t floor = rnd(*end + 1);
        ag_pick(g, *now, floor, *end, rnd(30), &c);
        if (c.count > 0) {
            CHECK(ag_floor(g, floor) >= 0);
            const char *o = owners[rnd(4)];
            int rc = ag_lease(g, c.start, c.count, *now + (int64_t)rnd(60) + 1, c.deliveries, o,
                              strlen(o));
            CHECK(rc == AG_OK || rc == AG_ERR_NOMEM);
        }
    } else if (op < 7) {
        int64_t rc = ag_ack(g, rnd(ag_next(g) + 5), rnd(50));
        CHECK(rc >= 0 || rc == AG_ERR_NOMEM);
    } else if (op < 8) {
        uint64_t f = rnd(ag_next(g) + 3);
        CHECK(ag_floor(g, f) >= 0);
        if (*end < f) *end = f;
    } else {
        *now += (int64_t)rnd(40);
    }
}

static void check_memory_accounting(void) {
    size_t before = count_alloc_live();
    ag_group *g = ag_new("jobs", 4, 0);
    CHECK(g != NULL);
    uint64_t end = 0;
    int64_t now = 1000;
    for (int i = 0; i < 5000; i++) {
        random_op(g, &end, &now);
        CHECK(ag_memory_bytes(g) == count_alloc_live() - before);
    }
    ag_free(g);
    CHECK(count_alloc_live() == before);
}

/* Each operation, its k-th allocation failing for every k until it
 * succeeds: on failure the group is unchanged. */
static void check_atomic_on_allocation_failure(void) {
    for (int round = 0; round < 300; round++) {
        ag_group *g = ag_new("s", 1, 0);
        CHECK(g != NULL);
        uint64_t end = 0;
        int64_t now = 1000;
        int steps = (int)rnd(60);
        for (int i = 0; i < steps; i++) random_op(g, &end, &now);
        mn_buf before = blob_of(g);
        int kind = (int)rnd(3);
        uint64_t start = rnd(ag_next(g) + 10), count = rnd(40) + 1;
        char name[16];
        snprintf(name, sizeof(name), "new-%d", round);
        for (long k = 0;; k++) {
            count_alloc_fail_after(k);
            int64_t rc;
            if (kind == 0) rc = ag_lease(g, start, count, now + 5, 1, name, strlen(name));
            else if (kind == 1) rc = ag_ack(g, start, count);
            else {
                ag_group *copy = ag_copy(g);
                rc = copy == NULL ? AG_ERR_NOMEM : AG_OK;
                ag_free(copy);
            }
            count_alloc_fail_after(-1);
            if (rc != AG_ERR_NOMEM) break;
            mn_buf after = blob_of(g);
            CHECK(same_blob(&before, &after));
            mn_buf_free(&after);
        }
        mn_buf_free(&before);
        ag_free(g);
    }
}

static void check_damaged_blobs(void) {
    ag_group *g = ag_new("stream", 6, 3);
    CHECK(g != NULL);
    for (int i = 0; i < 30; i++)
        CHECK(ag_lease(g, 3 + 9 * (uint64_t)i, 5, 100 + i, 1 + (uint32_t)(i % 3), owners[i % 4],
                       strlen(owners[i % 4])) == AG_OK);
    mn_buf b = blob_of(g);
    int err;
    for (size_t cut = 0; cut < b.len; cut++) {
        CHECK(ag_load(b.data, cut, &err) == NULL);
        CHECK(err == AG_ERR_CORRUPT);
    }
    for (int i = 0; i < 20000; i++) {
        char *copy = malloc(b.len);
        CHECK(copy != NULL);
        memcpy(copy, b.data, b.len);
        size_t at = rnd(b.len);
        copy[at] = (char)(copy[at] ^ (1 << rnd(8)));
        ag_group *loaded = ag_load(copy, b.len, &err);
        CHECK(loaded == NULL && err == AG_ERR_CORRUPT);
        free(copy);
    }
    ag_group *loaded = ag_load(b.data, b.len, &err);
    CHECK(loaded != NULL && err == AG_OK);
    mn_buf again = blob_of(loaded);
    CHECK(same_blob(&b, &again));
    mn_buf_free(&again);
    ag_free(loaded);
    mn_buf_free(&b);
    ag_free(g);
}

int main(void) {
    check_memory_accounting();
    check_atomic_on_allocation_failure();
    check_damaged_blobs();
    printf("ackgroup_driver: ok\n");
    return 0;
}
