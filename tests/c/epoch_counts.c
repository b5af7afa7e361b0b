/* A C evaluation loop over a loader started with `--tail keep`: every rank
 * takes the same number of steps an epoch (rf_get_epoch's steps_per_epoch),
 * the last steps' batches are short or empty (n_samples 0 to B), and the
 * state after an epoch's last step is the next epoch's start. Prints
 *   "epoch T S X N"       tail, steps per epoch, samples per epoch, dataset samples
 *   "batch E S N i i ..." one line per batch: epoch, step, n_samples, indices
 * and exits 0 at RF_END once every epoch had steps_per_epoch batches; 1 with
 * the code and rf_last_error() on a failure. Used by ffi/tests/c_consumer.rs. */
#include <stdio.h>
#include <stdlib.h>
#include "ringfeed.h"

#define MOST_EPOCHS 64

static int fail(const char *what, int rc) {
    fprintf(stderr, "%s: %d %s\n", what, rc, rf_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NAME RANK\n", argv[0]);
        return 2;
    }
    rf_feed *feed = NULL;
    int rc = rf_attach(argv[1], atoi(argv[2]), 30000, &feed);
    if (rc != RF_OK) return fail("rf_attach", rc);
    rf_info info;
    rf_job job;
    rf_epoch ep;
    if ((rc = rf_get_info(feed, &info)) != RF_OK) return fail("rf_get_info", rc);
    if ((rc = rf_get_job(feed, &job)) != RF_OK) return fail("rf_get_job", rc);
    if ((rc = rf_get_epoch(feed, &ep)) != RF_OK) return fail("rf_get_epoch", rc);
    printf("epoch %u %llu %llu %llu\n", ep.tail, (unsigned long long)ep.steps_per_epoch,
           (unsigned long long)ep.samples_per_epoch, (unsigned long long)ep.dataset_samples);
    /* The pure rule gives the same count from the same figures. */
    uint64_t per_step = (uint64_t)job.job_world_size * info.max_samples_per_slot, steps = 0;
    if ((rc = rf_epoch_steps(ep.dataset_samples, 0, per_step, ep.tail, &steps)) != RF_OK)
        return fail("rf_epoch_steps", rc);
    if (steps != ep.steps_per_epoch) {
        fprintf(stderr, "rf_epoch_steps says %llu steps, rf_get_epoch %llu\n", (unsigned long long)steps,
                (unsigned long long)ep.steps_per_epoch);
        return 1;
    }
    if (rf_epoch_steps(10, 0, 4, 7, &steps) != RF_E_INVALID) {
        fprintf(stderr, "rf_epoch_steps took tail 7\n");
        return 1;
    }
    uint64_t taken[MOST_EPOCHS] = {0};
    rf_batch b;
    while ((rc = rf_next(feed, &b, 60000)) == RF_OK) {
        if (b.epoch >= MOST_EPOCHS || b.n_samples > info.max_samples_per_slot) {
            fprintf(stderr, "batch of epoch %llu with %u samples\n", (unsigned long long)b.epoch, b.n_samples);
            return 1;
        }
        taken[b.epoch]++;
        printf("batch %llu %llu %u", (unsigned long long)b.epoch, (unsigned long long)b.step, b.n_samples);
        for (uint32_t i = 0; i < b.n_samples; i++) printf(" %llu", (unsigned long long)b.samples[i].index);
        printf("\n");
        uint64_t e = 0, s = 0;
        if ((rc = rf_resume_state(feed, &b, &e, &s)) != RF_OK) return fail("rf_resume_state", rc);
        /* The last step, short or empty, ends the epoch. */
        int last = b.step + 1 == ep.steps_per_epoch;
        if (last != (e == b.epoch + 1 && s == 0)) {
            fprintf(stderr, "step %llu of %llu: resume state %llu:%llu\n", (unsigned long long)b.step,
                    (unsigned long long)ep.steps_per_epoch, (unsigned long long)e, (unsigned long long)s);
            return 1;
        }
        if ((rc = rf_release(feed, &b)) != RF_OK) return fail("rf_release", rc);
    }
    if (rc != RF_END) return fail("rf_next", rc);
    for (int e = 0; e < MOST_EPOCHS && taken[e]; e++) {
        if (taken[e] != ep.steps_per_epoch) {
            fprintf(stderr, "epoch %d: %llu batches, not %llu\n", e, (unsigned long long)taken[e],
                    (unsigned long long)ep.steps_per_epoch);
            return 1;
        }
    }
    rf_detach(feed);
    return 0;
}
