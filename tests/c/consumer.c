/*
 * A trainer written in C against include/ringfeed.h only: attaches to one
 * rank of a `ringfeed ring-test-producer`, takes every batch, checks it byte
 * by byte against the test pattern (tests/README.md), releases it, and
 * prints "ok N" at the end of the run. Any error exits non-zero with
 * rf_last_error().
 *
 *   consumer NAME RANK WORLD_SIZE BATCH_SIZE SAMPLE_BYTES [EXPECT_BATCHES]
 *
 * Pattern: batch `step` of rank r holds B samples; sample j has index
 * (step*W + r)*B + j, lies at offset j*L, and its byte p is (index*7 + p) % 251.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ringfeed.h"

#define PAGE_BYTES 4096u
/* Bounds every wait, so a broken loader fails this program instead of hanging it. */
#define NEXT_TIMEOUT_MS 20000

static int fail(const char *what, int rc) {
    fprintf(stderr, "consumer: %s: rc %d: %s\n", what, rc, rf_last_error());
    return 1;
}

static int failf(const char *what, uint64_t got, uint64_t want) {
    fprintf(stderr, "consumer: %s: got %" PRIu64 ", expected %" PRIu64 "\n", what, got, want);
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '\0' || s[0] == '-' || *end != '\0') {
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

/* Checks rf_info: the shape the loader announced and a page-aligned payload region. */
static int check_info(const rf_info *info, uint32_t rank, uint64_t world, uint64_t expect) {
    if (info->world_size != world) return failf("rf_info.world_size", info->world_size, world);
    if (info->rank != rank) return failf("rf_info.rank", info->rank, rank);
    if ((uintptr_t)info->payload_region % PAGE_BYTES != 0) return failf("payload_region % 4096", (uintptr_t)info->payload_region % PAGE_BYTES, 0);
    if (info->slot_payload_bytes == 0 || info->slot_payload_bytes % PAGE_BYTES != 0) return failf("slot_payload_bytes % 4096", info->slot_payload_bytes % PAGE_BYTES, 0);
    uint64_t slots = (uint64_t)info->world_size * info->slots_per_rank;
    if (info->payload_region_bytes != slots * info->slot_payload_bytes)
        return failf("payload_region_bytes", info->payload_region_bytes, slots * info->slot_payload_bytes);
    if (expect != UINT64_MAX && info->batches_expected != expect) return failf("rf_info.batches_expected", info->batches_expected, expect);
    return 0;
}

/* Checks one batch: where it lies, what it says, and every byte of every sample. */
static int check_batch(const rf_info *info, const rf_batch *b, uint64_t n, uint64_t rank, uint64_t world, uint64_t bsize, uint64_t len) {
    const uint8_t *region = info->payload_region;
    uintptr_t data = (uintptr_t)b->data, start = (uintptr_t)region;
    if (data % PAGE_BYTES != 0) return failf("batch.data % 4096", data % PAGE_BYTES, 0);
    if (data < start || data - start + info->slot_payload_bytes > info->payload_region_bytes)
        return failf("batch.data offset in the payload region", data - start, info->payload_region_bytes);
    if ((data - start) % info->slot_payload_bytes != 0) return failf("batch.data offset % slot size", (data - start) % info->slot_payload_bytes, 0);
    if (b->data_len > info->slot_payload_bytes) return failf("batch.data_len", b->data_len, info->slot_payload_bytes);
    if (b->step != n) return failf("batch.step (batches are delivered in order)", b->step, n);
    if (b->epoch != 0) return failf("batch.epoch", b->epoch, 0);
    if (b->n_samples != bsize) return failf("batch.n_samples", b->n_samples, bsize);
    for (uint64_t j = 0; j < bsize; j++) {
        const rf_sample *s = &b->samples[j];
        uint64_t index = (b->step * world + rank) * bsize + j;
        if (s->index != index) return failf("sample.index", s->index, index);
        if (s->len != len) return failf("sample.len", s->len, len);
        if (s->offset != j * len) return failf("sample.offset", s->offset, j * len);
        if (s->offset + s->len > b->data_len) return failf("sample end beyond data_len", s->offset + s->len, b->data_len);
        const uint8_t *p = b->data + s->offset;
        for (uint64_t q = 0; q < len; q++) {
            uint8_t want = (uint8_t)((index * 7 + q) % 251);
            if (p[q] != want) {
                fprintf(stderr, "consumer: sample %" PRIu64 " byte %" PRIu64 " is %u, expected %u\n", index, q, p[q], want);
                return 1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    uint64_t rank, world, bsize, len, expect = UINT64_MAX;
    if (argc < 6 || argc > 7 || !parse_u64(argv[2], &rank) || !parse_u64(argv[3], &world) || !parse_u64(argv[4], &bsize) ||
        !parse_u64(argv[5], &len) || (argc == 7 && !parse_u64(argv[6], &expect))) {
        fprintf(stderr, "usage: %s NAME RANK WORLD_SIZE BATCH_SIZE SAMPLE_BYTES [EXPECT_BATCHES]\n", argv[0]);
        return 2;
    }
    if (rf_abi_version() != 1) return failf("rf_abi_version", rf_abi_version(), 1);
    rf_feed *feed = NULL;
    int rc = rf_attach(argv[1], (int32_t)rank, 10000, &feed);
    if (rc != RF_OK) return fail("rf_attach", rc);
    rf_info info;
    rc = rf_get_info(feed, &info);
    if (rc != RF_OK) return fail("rf_get_info", rc);
    if (check_info(&info, (uint32_t)rank, world, expect)) return 1;
    /* A loader on one machine: its ranks are the whole job. */
    rf_job job = {UINT32_MAX, 0, 0};
    rc = rf_get_job(feed, &job);
    if (rc != RF_OK) return fail("rf_get_job", rc);
    if (job.first_rank != 0) return failf("rf_get_job first_rank", job.first_rank, 0);
    if (job.job_world_size != world) return failf("rf_get_job job_world_size", job.job_world_size, world);
    rc = rf_get_job(feed, NULL);
    if (rc != RF_E_INVALID) return fail("rf_get_job with NULL (expected RF_E_INVALID)", rc);

    /* The test producer records no order: refused as an older loader's would be. */
    uint64_t seed = 0;
    uint32_t shuffled = 0;
    rc = rf_get_order(feed, &seed, NULL);
    if (rc != RF_E_INVALID) return fail("rf_get_order with NULL (expected RF_E_INVALID)", rc);
    rc = rf_get_order(feed, &seed, &shuffled);
    if (rc != RF_E_VERSION) return fail("rf_get_order of a test producer (expected RF_E_VERSION)", rc);
    if (strstr(rf_last_error(), "--seed") == NULL) return fail("rf_get_order's message names --seed", rc);
    uint32_t block_samples = 0, window_blocks = 0;
    rc = rf_get_order_block(feed, NULL, &window_blocks);
    if (rc != RF_E_INVALID) return fail("rf_get_order_block with NULL (expected RF_E_INVALID)", rc);
    rc = rf_get_order_block(feed, &block_samples, &window_blocks);
    if (rc != RF_E_VERSION) return fail("rf_get_order_block of a test producer (expected RF_E_VERSION)", rc);

    uint64_t n = 0, taken = UINT64_MAX;
    rf_batch b;
    rc = rf_get_taken(feed, NULL);
    if (rc != RF_E_INVALID) return fail("rf_get_taken with NULL (expected RF_E_INVALID)", rc);
    while ((rc = rf_next(feed, &b, NEXT_TIMEOUT_MS)) == RF_OK) {
        /* The batches this rank has taken, this one included. */
        rc = rf_get_taken(feed, &taken);
        if (rc != RF_OK) return fail("rf_get_taken", rc);
        if (taken != n + 1) return failf("rf_get_taken after a batch", taken, n + 1);
        if (check_batch(&info, &b, n, rank, world, bsize, len)) {
            fprintf(stderr, "consumer: in batch %" PRIu64 " of rank %" PRIu64 "\n", n, rank);
            return 1;
        }
        rc = rf_release(feed, &b);
        if (rc != RF_OK) return fail("rf_release", rc);
        /* A second release of the same batch is refused, never double-counted. */
        rc = rf_release(feed, &b);
        if (rc != RF_E_STALE) return fail("second rf_release of one batch (expected RF_E_STALE)", rc);
        if (rf_last_error()[0] == '\0') return fail("RF_E_STALE without a message", rc);
        n++;
    }
    if (rc != RF_END) return fail(rc == RF_TIMEOUT ? "rf_next timed out" : "rf_next", rc);
    if (expect != UINT64_MAX && n != expect) return failf("batches before RF_END", n, expect);
    /* END stays END. */
    rc = rf_next(feed, &b, 0);
    if (rc != RF_END) return fail("rf_next after RF_END", rc);
    rf_detach(feed);
    printf("ok %" PRIu64 "\n", n);
    return 0;
}
