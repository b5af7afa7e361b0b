/* A C trainer for the tar-shard tests: attaches to a loader serving tar
 * shards and prints one line per field of every sample, "epoch index key ext
 * len crc32", walking each sample's members with rf_tar_field_next (pointers
 * into the slot: no copy). Exits 0 at RF_END. */
#include <stdio.h>
#include <stdlib.h>
#include "ringfeed.h"

static uint32_t crc32_of(const uint8_t *p, uint64_t n) {
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

/* The key: the full name (prefix "/" name) up to the '.' before ext. */
static void print_key(const rf_tar_field *f) {
    if (f->name_prefix_len > 0) printf("%.*s/", (int)f->name_prefix_len, (const char *)f->name_prefix);
    uint64_t key_len = f->ext_len > 0 ? (uint64_t)(f->ext - f->name) - 1 : f->name_len;
    printf("%.*s", (int)key_len, (const char *)f->name);
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
            const uint8_t *sample = b.data + b.samples[i].offset;
            uint64_t len = b.samples[i].len, cursor = 0;
            rf_tar_field f;
            int frc;
            while ((frc = rf_tar_field_next(sample, len, &cursor, &f)) == RF_OK) {
                if (f.data < sample || f.data + f.len > sample + len) {
                    fprintf(stderr, "field outside its sample\n");
                    return 1;
                }
                printf("%llu %llu ", (unsigned long long)b.epoch, (unsigned long long)b.samples[i].index);
                print_key(&f);
                printf(" %.*s %llu %lu\n", (int)f.ext_len, (const char *)f.ext, (unsigned long long)f.len,
                       (unsigned long)crc32_of(f.data, f.len));
            }
            if (frc != RF_END) {
                fprintf(stderr, "rf_tar_field_next: %d %s\n", frc, rf_last_error());
                return 1;
            }
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
