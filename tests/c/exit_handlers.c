/* ringfeed calls made while a thread or the process exits: from an atexit
 * handler, and from a thread-local (pthread key) destructor of the caller's.
 * Both run after the library's own thread-local storage is destroyed; a call
 * that failed earlier on the same thread had stored a message there, and any
 * later use of it aborted the process (SIGABRT). Each must still return its
 * code and a message.
 *
 * usage: exit_handlers NAME (a loader name nobody uses)
 * prints "thread-local destructor ok" and "atexit ok", exits 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ringfeed.h"

static const char *unused_name;
static pthread_key_t key;

static int check(const char *where) {
    const char *before = rf_last_error();
    if (before == NULL) {
        fprintf(stderr, "%s: rf_last_error() returned NULL\n", where);
        return 1;
    }
    rf_feed *feed = NULL;
    int rc = rf_attach("bad/name", 0, 0, &feed);
    const char *message = rf_last_error();
    if (rc != RF_E_INVALID || feed != NULL || message == NULL || strstr(message, "bad/name") == NULL) {
        fprintf(stderr, "%s: rf_attach(\"bad/name\") gave %d, message %s\n", where, rc, message ? message : "(NULL)");
        return 1;
    }
    printf("%s ok\n", where);
    fflush(stdout);
    return 0;
}

static void at_exit(void) {
    if (check("atexit")) _exit(1);
}

static void destructor(void *value) {
    (void)value;
    if (check("thread-local destructor")) _exit(1);
}

static void *worker(void *arg) {
    (void)arg;
    rf_feed *feed = NULL;
    /* A failure on this thread first: its message is stored. */
    if (rf_attach(unused_name, 0, 0, &feed) != RF_TIMEOUT) {
        fprintf(stderr, "worker: rf_attach of an unused name did not time out\n");
        _exit(1);
    }
    pthread_setspecific(key, (void *)1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: exit_handlers NAME\n");
        return 2;
    }
    unused_name = argv[1];
    if (atexit(at_exit) != 0 || pthread_key_create(&key, destructor) != 0) return 1;
    rf_feed *feed = NULL;
    if (rf_attach(unused_name, 0, 0, &feed) != RF_TIMEOUT) {
        fprintf(stderr, "main: rf_attach of an unused name did not time out\n");
        return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, NULL) != 0) return 1;
    return 0;
}
