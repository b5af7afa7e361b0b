/* A C trainer for the keys and class names tests: attaches to rank RANK of
 * loader NAME, prints the class names ("class I NAME", rf_get_class_name
 * until RF_END), then one line per sample, "key EPOCH INDEX RECORD KEY"
 * (RECORD: the record's index in its object, or "-"; KEY: rf_batch_key's
 * bytes, pointers into the slot). Checks a key read after its batch's
 * release is RF_E_STALE and a sample past the batch RF_E_INVALID. Exits 0
 * at RF_END. */
#include <stdio.h>
#include <stdlib.h>
#include "ringfeed.h"

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
    uint32_t count = 0;
    if (rf_get_class_count(feed, &count) != RF_OK) {
        fprintf(stderr, "rf_get_class_count: %s\n", rf_last_error());
        return 1;
    }
    const uint8_t *name = NULL;
    uint64_t name_len = 0;
    uint32_t c = 0;
    while ((rc = rf_get_class_name(feed, c, &name, &name_len)) == RF_OK) {
        printf("class %u %.*s\n", c, (int)name_len, (const char *)name);
        c++;
    }
    if (rc != RF_END || c != count) {
        fprintf(stderr, "rf_get_class_name: %d after %u of %u: %s\n", rc, c, count, rf_last_error());
        return 1;
    }
    rf_batch b;
    while ((rc = rf_next(feed, &b, 60000)) == RF_OK) {
        rf_key k;
        for (uint32_t i = 0; i < b.n_samples; i++) {
            int krc = rf_batch_key(feed, &b, i, &k);
            if (krc != RF_OK) {
                fprintf(stderr, "rf_batch_key: %d %s\n", krc, rf_last_error());
                return 1;
            }
            printf("key %llu %llu ", (unsigned long long)b.epoch, (unsigned long long)b.samples[i].index);
            if (k.record == UINT64_MAX) printf("- ");
            else printf("%llu ", (unsigned long long)k.record);
            printf("%.*s\n", (int)k.len, (const char *)k.key);
        }
        if (rf_batch_key(feed, &b, b.n_samples, &k) != RF_E_INVALID) {
            fprintf(stderr, "a sample past the batch is not RF_E_INVALID\n");
            return 1;
        }
        if (rf_release(feed, &b) != RF_OK) {
            fprintf(stderr, "rf_release: %s\n", rf_last_error());
            return 1;
        }
        if (rf_batch_key(feed, &b, 0, &k) != RF_E_STALE) {
            fprintf(stderr, "a key of a released batch is not RF_E_STALE\n");
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
