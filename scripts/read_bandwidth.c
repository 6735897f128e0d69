/* STREAM-style read bandwidth: how fast THREADS threads can read a 1 GiB array from memory,
 * the ceiling a decode step that streams every weight once cannot pass. Each thread sums its
 * half (its own pages: first touch by the same static schedule) with eight independent
 * accumulators, so the loop is bound by loads, not by the add chain. Prints one JSON line:
 * every repetition's GB/s (1e9 bytes per second) and the median.
 *   build: cc -O3 -march=native -fopenmp read_bandwidth.c -o read-bandwidth
 *   usage: read-bandwidth [threads=2] [repetitions=15] [MiB=1024] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 15;
    size_t mib = argc > 3 ? (size_t)atol(argv[3]) : 1024;
    if (threads < 1 || reps < 1 || reps > 1000 || mib < 1) {
        fprintf(stderr, "usage: read-bandwidth [threads] [repetitions] [MiB]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *a = aligned_alloc(64, n * sizeof(uint64_t));
    if (!a) {
        fprintf(stderr, "read-bandwidth: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    omp_set_num_threads(threads);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;
    double *gbs = malloc(sizeof(double) * reps);
    uint64_t check = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t total = 0;
        double t = now();
#pragma omp parallel for schedule(static) reduction(+ : total)
        for (size_t i = 0; i < n; i += 8) {
            total += a[i] + a[i + 1] + a[i + 2] + a[i + 3] + a[i + 4] + a[i + 5] + a[i + 6] + a[i + 7];
        }
        gbs[r] = n * sizeof(uint64_t) / (now() - t) / 1e9;
        check += total;
    }
    double sorted[1000];
    for (int r = 0; r < reps; r++) sorted[r] = gbs[r];
    qsort(sorted, reps, sizeof(double), by_value);
    printf("{\"threads\": %d, \"mib\": %zu, \"median_gb_s\": %.2f, \"max_gb_s\": %.2f, \"gb_s\": [", threads, mib,
           sorted[reps / 2], sorted[reps - 1]);
    for (int r = 0; r < reps; r++) printf("%s%.2f", r ? ", " : "", gbs[r]);
    /* the sum is printed so the compiler cannot drop the reads */
    printf("], \"checksum\": %llu}\n", (unsigned long long)check);
    free(gbs);
    free(a);
    return 0;
}
