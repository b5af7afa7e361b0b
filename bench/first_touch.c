/*
 * How fast can fresh shared memory be filled from the page cache?
 *
 * Every page of a ringfeed ring is touched for the first time on the first
 * pass over its slots, so the loader's first batches (W x B samples before
 * the last rank has one) go at this rate, not at memcpy's. This measures it
 * several ways, filling 8 "slots" of 64 x 100 kB (51 MB) in a new file under
 * DIR (default /dev/shm) from a warm source file:
 *
 *   pread into mapping     what ringfeed does: read() straight into the slot
 *   pwrite through the fd  read into a buffer, pwrite into the shm file: no
 *                          page-table entries in the writer, no zeroing of
 *                          pages that are written whole
 *   fallocate ahead        one thread allocates slot s+1 while another reads
 *                          into slot s (ringfeed's claim allocates a slot
 *                          this way, one slot ahead of the reads)
 *   reads into touched     the same reads into pages already touched: the
 *                          steady state of a ring after its first pass
 *
 * Build and run (the source file is made once in /tmp):
 *   cc -O2 -pthread -o /tmp/first_touch bench/first_touch.c && /tmp/first_touch [DIR]
 *
 * Mount a tmpfs with huge=within_size (root) and pass it as DIR to see what
 * transparent huge pages change; or reserve huge pages and mount hugetlbfs
 * (echo 64 > /proc/sys/vm/nr_hugepages; mount -t hugetlbfs none DIR), which
 * has no write(): the pwrite rows are left out there. Figures on the 2-core test VM are in
 * bench/README.md; they move by +-20 % between runs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define SAMPLE 100000ul
#define PER_SLOT 64ul
#define SLOTS 8ul
/* A slot is a whole number of the file system's pages (4 KiB, or 2 MiB on
 * hugetlbfs, where a file's size must be a multiple of its page size). */
static unsigned long SLOT_BYTES, RING_BYTES;
#define SRC_BYTES (64ul << 20)

enum mode { PREAD_MAP, PWRITE_FD, FALLOC_AHEAD, TOUCHED };
static const char *NAMES[] = {"pread into mapping", "pwrite through the fd", "fallocate ahead + pread", "pread into touched pages"};

static int src_fd, shm_fd;
static char *map;
static enum mode mode;
static atomic_ulong next_slot, allocated;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void fill_slot(unsigned long s, char *buf) {
    char *dst = map + s * SLOT_BYTES;
    for (unsigned long i = 0; i < PER_SLOT; i++) {
        off_t in = (off_t)(((s * PER_SLOT + i) * SAMPLE) % (SRC_BYTES - SAMPLE));
        ssize_t n;
        if (mode == PWRITE_FD) {
            if (pread(src_fd, buf, SAMPLE, in) != (ssize_t)SAMPLE) die("pread");
            n = pwrite(shm_fd, buf, SAMPLE, (off_t)(s * SLOT_BYTES + i * SAMPLE));
        } else {
            n = pread(src_fd, dst + i * SAMPLE, SAMPLE, in);
        }
        if (n != (ssize_t)SAMPLE) die("read/write");
    }
}

static void *worker(void *arg) {
    long id = (long)arg;
    char *buf = malloc(SAMPLE);
    if (mode == FALLOC_AHEAD && id == 0) {
        for (unsigned long s = 0; s < SLOTS; s++) {
            if (fallocate(shm_fd, 0, (off_t)(s * SLOT_BYTES), SLOT_BYTES) != 0) die("fallocate");
            atomic_store(&allocated, s + 1);
        }
        free(buf);
        return NULL;
    }
    for (;;) {
        unsigned long s = atomic_fetch_add(&next_slot, 1);
        if (s >= SLOTS) break;
        if (mode == FALLOC_AHEAD)
            while (atomic_load(&allocated) <= s) sched_yield();
        fill_slot(s, buf);
    }
    free(buf);
    return NULL;
}

static double run(const char *path, enum mode m, int threads) {
    mode = m;
    unlink(path);
    shm_fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (shm_fd < 0) die(path);
    if (ftruncate(shm_fd, RING_BYTES) != 0) die("ftruncate");
    map = mmap(NULL, RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    if (map == MAP_FAILED) die("mmap");
    if (m == TOUCHED) memset(map, 0, RING_BYTES);
    atomic_store(&next_slot, 0);
    atomic_store(&allocated, 0);
    pthread_t th[4];
    double t = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    t = now() - t;
    munmap(map, RING_BYTES);
    close(shm_fd);
    unlink(path);
    return PER_SLOT * SLOTS * SAMPLE / t / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm";
    struct statfs fs;
    if (statfs(dir, &fs) != 0) die(dir);
    int hugetlbfs = fs.f_type == 0x958458f6; /* HUGETLBFS_MAGIC */
    unsigned long page = (unsigned long)fs.f_bsize < 4096 ? 4096 : (unsigned long)fs.f_bsize;
    SLOT_BYTES = (PER_SLOT * SAMPLE + page - 1) / page * page;
    RING_BYTES = SLOT_BYTES * SLOTS;
    char path[4096];
    snprintf(path, sizeof path, "%s/ringfeed-first-touch-%d", dir, (int)getpid());
    const char *src = "/tmp/ringfeed-first-touch.src";
    src_fd = open(src, O_RDONLY);
    if (src_fd < 0) {
        int fd = open(src, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) die(src);
        char *b = malloc(1 << 20);
        for (unsigned long i = 0; i < SRC_BYTES >> 20; i++) {
            for (int j = 0; j < 1 << 20; j++) b[j] = (char)(i * 31 + j);
            if (write(fd, b, 1 << 20) != 1 << 20) die("write");
        }
        free(b);
        close(fd);
        src_fd = open(src, O_RDONLY);
    }
    char *warm = malloc(SRC_BYTES);
    if (pread(src_fd, warm, SRC_BYTES, 0) != (ssize_t)SRC_BYTES) die("warm the source");
    free(warm);
    printf("filling %lu MB of fresh memory in %s from the page cache, %lu slots of %lu x %lu bytes; GB/s, median of 5\n",
           PER_SLOT * SLOTS * SAMPLE / 1000000, dir, SLOTS, PER_SLOT, SAMPLE);
    struct { enum mode m; int threads; } cases[] = {
        {PREAD_MAP, 1}, {PREAD_MAP, 2}, {PWRITE_FD, 1}, {PWRITE_FD, 2}, {FALLOC_AHEAD, 2}, {TOUCHED, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (hugetlbfs && cases[c].m == PWRITE_FD) continue;
        double r[5];
        for (int i = 0; i < 5; i++) r[i] = run(path, cases[c].m, cases[c].threads);
        qsort(r, 5, sizeof r[0], cmp);
        printf("  %-26s %d thread%s  %5.2f  (min %.2f, max %.2f)\n", NAMES[cases[c].m], cases[c].threads,
               cases[c].threads > 1 ? "s" : " ", r[2], r[0], r[4]);
    }
    return 0;
}
