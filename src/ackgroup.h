/* ackgroup.h -- the state of an acknowledged consumer group (ackgroup.c).
 *
 * docs/PROTOCOL.md ("Acknowledged groups") is the contract; the big comment
 * at the top of ackgroup.c draws the structure and the serialized format.
 * Both servers use this code: rcp11-server through cffi (rcp11/storage/ackgroups.py)
 * and the Redis module (src/module_ack.c), so the two keep one behaviour and
 * one blob format.
 *
 * Like macronode.h, the part between CDEF-BEGIN and CDEF-END is fed to
 * cffi's cdef() after macronode.h's (it uses mn_buf from there): plain
 * prototypes, integer #defines, opaque typedefs.
 */
#ifndef RCP11_ACKGROUP_H
#define RCP11_ACKGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "macronode.h"

/* CDEF-BEGIN */

/* Version byte of ag_serialize()'s blobs; ag_load() refuses others. */
#define AG_FORMAT_VERSION 1

/* A consumer name is at most this many bytes (a longer one is AG_ERR_ARG). */
#define AG_MAX_OWNER_BYTES 256

/* The longest lease a reader may ask for, in ms (2^31-1: about 24.8 days). */
#define AG_MAX_LEASE_MS 2147483647

/* ag_earliest_deadline() of a group with no lease that could run out. */
#define AG_NO_DEADLINE 9223372036854775807

/* Return codes: the storage core's values (MN_OK, MN_ERR_*). */
#define AG_OK 0
#define AG_ERR_NOMEM -1
#define AG_ERR_CORRUPT -4
#define AG_ERR_ARG -5

typedef struct ag_group ag_group;

/* One pending range, as ag_range_get() describes it. */
typedef struct ag_range_info {
    uint64_t start;      /* first offset */
    uint64_t count;      /* offsets in the range, >= 1 */
    int64_t deadline_ms; /* the lease ends at this unix ms */
    uint32_t deliveries; /* times delivered, >= 1 */
    uint32_t owner;      /* owner slot: ag_owner_name() */
} ag_range_info;

/* What a lease read delivers (ag_pick()). */
typedef struct ag_choice {
    uint64_t start;      /* first offset delivered (the group's next offset when none) */
    uint64_t count;      /* offsets delivered; 0: nothing to deliver now */
    uint32_t deliveries; /* their delivery count once delivered (0 when none) */
} ag_choice;

/* Totals since the group was created (persisted with it). */
typedef struct ag_totals {
    uint64_t delivered;   /* offsets leased, redeliveries included */
    uint64_t redelivered; /* offsets leased again after their lease ran out */
    uint64_t acked;       /* offsets acknowledged while pending */
    uint64_t dropped;     /* pending offsets dropped because they were evicted */
} ag_totals;

/* A new group of the stream named stream[0..stream_len) whose next offset
 * is `next` (<= AG_OFFSET_END). NULL when memory or the arguments fail. */
ag_group *ag_new(const char *stream, size_t stream_len, uint64_t next);
void ag_free(ag_group *g);
/* A deep copy (NULL when memory fails). */
ag_group *ag_copy(const ag_group *g);

/* The stream the group belongs to: its name and length. */
const char *ag_stream_name(const ag_group *g);
size_t ag_stream_name_len(const ag_group *g);
uint64_t ag_next(const ag_group *g);
/* Offsets pending (leased, not acknowledged) and the ranges holding them. */
uint64_t ag_pending(const ag_group *g);
uint64_t ag_num_ranges(const ag_group *g);
/* Bytes the group holds: its struct, tables and names. */
uint64_t ag_memory_bytes(const ag_group *g);
void ag_get_totals(const ag_group *g, ag_totals *out);

/* Drop the pending offsets below `floor` (evicted: counted as dropped) and
 * raise the next offset to `floor` if it is lower. Returns the offsets
 * dropped, or AG_ERR_ARG for a floor past AG_OFFSET_END. Never allocates. */
int64_t ag_floor(ag_group *g, uint64_t floor);

/* What a lease read at now_ms of at most `count` offsets delivers from a
 * stream whose readable offsets are floor..end-1: the lowest pending range
 * whose lease ran out (deadline <= now_ms) and that holds offsets in
 * floor..end-1, from its first such offset; else the offsets from the
 * larger of the group's next offset and `floor`. Changes nothing but a
 * cached bound: the caller then applies ag_floor(floor) and ag_lease(). */
void ag_pick(ag_group *g, int64_t now_ms, uint64_t floor, uint64_t end, uint64_t count,
             ag_choice *out);

/* A lease read's delivery in one call: ag_pick(); then, when it found
 * something, ag_floor(floor) and ag_lease() of it to `owner` until
 * now_ms + lease_ms (*deadline_ms set; 0 when nothing was delivered, and
 * then nothing changed). AG_OK, or ag_lease()'s errors (then the evicted
 * part may have been dropped, nothing else changed). */
int ag_take(ag_group *g, int64_t now_ms, uint64_t floor, uint64_t end, uint64_t count,
            int64_t lease_ms, const char *owner, size_t owner_len, ag_choice *out,
            int64_t *deadline_ms);

/* Lease offsets start..start+count-1 to `owner` until deadline_ms with the
 * delivery count `deliveries` (>= 1), replacing whatever pending state they
 * had, and raise the next offset past them. count 0 changes nothing.
 * AG_OK, AG_ERR_ARG (owner too long, deliveries 0, past AG_OFFSET_END) or
 * AG_ERR_NOMEM; nothing changes on an error. */
int ag_lease(ag_group *g, uint64_t start, uint64_t count, int64_t deadline_ms,
             uint32_t deliveries, const char *owner, size_t owner_len);

/* Acknowledge offsets start..start+count-1: they stop being pending.
 * Returns how many were pending (>= 0), or AG_ERR_NOMEM when a range had
 * to be split and memory failed (nothing changed). */
int64_t ag_ack(ag_group *g, uint64_t start, uint64_t count);

/* The earliest lease deadline among the pending ranges holding offsets in
 * floor..end-1 (AG_NO_DEADLINE when there is none): when a blocked reader
 * must look again. */
int64_t ag_earliest_deadline(const ag_group *g, uint64_t floor, uint64_t end);

/* Pending offsets at or above `floor` (evicted ones left out): returns
 * their number and sets *expired (of those, the ones whose lease ran out
 * at now_ms) and *ranges (ranges holding them). */
uint64_t ag_pending_from(const ag_group *g, uint64_t floor, int64_t now_ms, uint64_t *expired,
                         uint64_t *ranges);

/* The index of the first range that ends after `offset` (ag_num_ranges()
 * when none does), and range i. ag_range_get() returns AG_ERR_ARG for an
 * index past the end. */
uint64_t ag_range_index(const ag_group *g, uint64_t offset);
int ag_range_get(const ag_group *g, uint64_t i, ag_range_info *out);

/* Owner slots: ag_num_owners() of them; a slot in use has a name (NULL for
 * a free slot), *len set to its length. */
uint32_t ag_num_owners(const ag_group *g);
const char *ag_owner_name(const ag_group *g, uint32_t slot, size_t *len);
/* Per owner slot, over the offsets at or above `floor`: pending offsets,
 * expired ones at now_ms, and the latest lease deadline (0 for none). Each
 * array has ag_num_owners() elements. */
void ag_owner_stats(const ag_group *g, uint64_t floor, int64_t now_ms, uint64_t *pending,
                    uint64_t *expired, int64_t *latest_deadline);

/* The blob format drawn in ackgroup.c, appended to out. AG_OK or
 * AG_ERR_NOMEM. */
int ag_serialize(const ag_group *g, mn_buf *out);
/* A group from a blob, every field checked before it is trusted: NULL with
 * *err set to AG_ERR_CORRUPT (or AG_ERR_NOMEM). */
ag_group *ag_load(const char *blob, size_t len, int *err);

/* CDEF-END */

/* The largest next offset a group can hold: 2^63, one past the largest
 * message offset (outside the cdef: no int64 holds it). */
#define AG_OFFSET_END ((uint64_t)1 << 63)

#endif
