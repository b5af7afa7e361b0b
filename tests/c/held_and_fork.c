/*
 * Two ways a C trainer can misuse a feed, and what it gets instead of a hang
 * or lost batches (prints "ok" when every check holds, else says which
 * failed and exits 1):
 *
 * - RF_E_HELD: with K = 2 slots, holding batches 0 and 1 and asking for
 *   batch 2 (whose slot still holds batch 0) returns RF_E_HELD at once, even
 *   with timeout -1, and takes nothing; after rf_release the call succeeds.
 * - RF_E_FORKED: a forked child's rf_next and rf_release are refused, its
 *   rf_detach gives nothing back, and the parent goes on with no batch seen
 *   twice or skipped and its held batch intact.
 *
 *   held_and_fork NAME     (a ring-test-producer: W=1, K=2, 6 batches of 4 x 64 B)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ringfeed.h"

static int failures = 0;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "held_and_fork: " __VA_ARGS__); \
            fprintf(stderr, " (%s)\n", rf_last_error());  \
            failures++;                                   \
        }                                                 \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Sample j of batch s (rank 0 of 1, 4 samples) has index s*4 + j; its byte p
 * is (index*7 + p) mod 251 (tests/README.md). */
static int batch_is_intact(const rf_batch *b, uint64_t step) {
    if (b->step != step || b->n_samples != 4) {
        return 0;
    }
    for (uint32_t j = 0; j < b->n_samples; j++) {
        uint64_t index = step * 4 + j;
        if (b->samples[j].index != index || b->samples[j].len != 64) {
            return 0;
        }
        const uint8_t *p = b->data + b->samples[j].offset;
        for (uint64_t k = 0; k < 64; k++) {
            if (p[k] != (uint8_t)((index * 7 + k) % 251)) {
                return 0;
            }
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s NAME\n", argv[0]);
        return 2;
    }
    rf_feed *feed = NULL;
    if (rf_attach(argv[1], 0, 10000, &feed) != RF_OK) {
        fprintf(stderr, "held_and_fork: attach: %s\n", rf_last_error());
        return 1;
    }
    rf_batch b0, b1, b2;
    CHECK(rf_next(feed, &b0, 10000) == RF_OK && batch_is_intact(&b0, 0), "batch 0");
    CHECK(rf_next(feed, &b1, 10000) == RF_OK && batch_is_intact(&b1, 1), "batch 1");

    double start = now_ms();
    int rc = rf_next(feed, &b2, -1);
    CHECK(rc == RF_E_HELD, "rf_next with both slots held returned %d, expected RF_E_HELD", rc);
    CHECK(now_ms() - start < 1000.0, "RF_E_HELD took %.0f ms", now_ms() - start);
    CHECK(strstr(rf_last_error(), "step 0") != NULL, "the RF_E_HELD message does not name batch 0");
    CHECK(rf_release(feed, &b0) == RF_OK, "release batch 0");
    CHECK(rf_next(feed, &b2, 10000) == RF_OK && batch_is_intact(&b2, 2), "batch 2 after the release");

    pid_t pid = fork();
    if (pid == 0) {
        rf_batch x;
        int bad = 0;
        if (rf_next(feed, &x, 1000) != RF_E_FORKED || strstr(rf_last_error(), "fork") == NULL) {
            fprintf(stderr, "held_and_fork: the child's rf_next was not refused with RF_E_FORKED (%s)\n", rf_last_error());
            bad = 1;
        }
        if (rf_release(feed, &b1) != RF_E_FORKED) {
            fprintf(stderr, "held_and_fork: the child's rf_release was not refused with RF_E_FORKED\n");
            bad = 1;
        }
        rf_detach(feed);
        _exit(bad);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child failed");
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL); /* a wrongful give-back by the child would let the loader overwrite batch 1 now */
    CHECK(batch_is_intact(&b1, 1), "batch 1 changed under the parent after the child detached");
    CHECK(rf_release(feed, &b1) == RF_OK, "release batch 1");
    CHECK(rf_release(feed, &b2) == RF_OK, "release batch 2");
    uint64_t want = 3;
    rf_batch b;
    while ((rc = rf_next(feed, &b, 10000)) == RF_OK) {
        CHECK(batch_is_intact(&b, want), "batch %llu after the fork", (unsigned long long)want);
        CHECK(rf_release(feed, &b) == RF_OK, "release batch %llu", (unsigned long long)want);
        want++;
    }
    CHECK(rc == RF_END && want == 6, "the run ended with rc %d after batch %llu, expected RF_END after 5", rc, (unsigned long long)want - 1);
    rf_detach(feed);
    if (failures) {
        return 1;
    }
    printf("ok\n");
    return 0;
}
