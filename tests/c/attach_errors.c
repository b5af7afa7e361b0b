/*
 * Attach errors seen from C: a loader that never appears gives RF_TIMEOUT
 * after the timeout, with a message naming it; a negative rank gives
 * RF_E_RANK; NULL or invalid names give RF_E_INVALID. Prints "ok" when
 * every check holds, else says which failed and exits 1.
 *
 *   attach_errors NAME      (NAME must never appear as a loader)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ringfeed.h"

static int failures = 0;

static void expect(const char *what, int rc, int want) {
    if (rc != want) {
        fprintf(stderr, "attach_errors: %s: rc %d, expected %d (%s)\n", what, rc, want, rf_last_error());
        failures++;
    }
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s NAME\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    rf_feed *feed = NULL;

    double start = now_ms();
    expect("attach to a loader that never appears", rf_attach(name, 0, 200, &feed), RF_TIMEOUT);
    double waited = now_ms() - start;
    if (strstr(rf_last_error(), name) == NULL) {
        fprintf(stderr, "attach_errors: the timeout message does not name %s: %s\n", name, rf_last_error());
        failures++;
    }
    if (waited < 190.0 || waited > 5000.0) {
        fprintf(stderr, "attach_errors: a 200 ms attach timeout returned after %.1f ms\n", waited);
        failures++;
    }
    expect("negative rank", rf_attach(name, -1, 0, &feed), RF_E_RANK);
    if (rf_last_error()[0] == '\0') {
        fprintf(stderr, "attach_errors: RF_E_RANK without a message\n");
        failures++;
    }
    expect("NULL name", rf_attach(NULL, 0, 0, &feed), RF_E_INVALID);
    expect("NULL out", rf_attach(name, 0, 0, NULL), RF_E_INVALID);
    expect("name with a slash", rf_attach("a/b", 0, 0, &feed), RF_E_INVALID);
    expect("rf_next on NULL", rf_next(NULL, NULL, 0), RF_E_INVALID);
    rf_detach(NULL); /* ignored */
    if (feed != NULL) {
        fprintf(stderr, "attach_errors: a failed attach wrote *out\n");
        failures++;
    }
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
