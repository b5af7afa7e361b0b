/* A C trainer for the end-to-end tests: attaches to a ringfeed loader and
 * prints one line per sample, "epoch step index len crc32", so the test can
 * compare every sample's bytes with its file. Exits 0 at RF_END. */
#include <stdio.h>
#include <stdlib.h>
#include "ringfeed.h"

/* CRC-32 as zlib computes it (polynomial 0xEDB88320), so Python's
 * zlib.crc32 gives the same value for the file. */
static uint64_t crc32_of(const uint8_t *p, uint64_t n) {
    static uint32_t table[256];
    if (table[1] == 0) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    }
    uint32_t c = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NAME RANK\n", argv[0]);
        return 2;
    }
    rf_feed *feed = NULL;
    int rc = rf_attach(argv[1], atoi(argv[2]), 30000, &feed);
    if (rc != RF_OK) {
        fprintf(stderr, "rf_attach: %d %s\n", rc, rf_last_error());
        return 1;
    }
    rf_batch b;
    while ((rc = rf_next(feed, &b, 60000)) == RF_OK) {
        for (uint32_t i = 0; i < b.n_samples; i++) {
            const rf_sample *s = &b.samples[i];
            printf("%llu %llu %llu %llu %llu\n", (unsigned long long)b.epoch, (unsigned long long)b.step,
                   (unsigned long long)s->index, (unsigned long long)s->len,
                   (unsigned long long)crc32_of(b.data + s->offset, s->len));
        }
        if ((rc = rf_release(feed, &b)) != RF_OK) {
            fprintf(stderr, "rf_release: %d %s\n", rc, rf_last_error());
            return 1;
        }
    }
    if (rc != RF_END) {
        fprintf(stderr, "rf_next: %d %s\n", rc, rf_last_error());
        return 1;
    }
    rf_detach(feed);
    return 0;
}
