/* The peer's side of scripts/bench-coll.sh: OpenMPI's own collectives timed the way
 * tbbench coll times its own (osu-style): per iteration a barrier, the call, each rank's
 * time; the slowest rank's time per iteration; the median over iterations.
 *
 *   osu_coll OP ITERS WARMUP SIZE...   (OP: allreduce, allgather, bcast; sizes in bytes,
 *                                       the whole array, f32 elements, sum)
 * prints one line per size: "OP SIZE_BYTES MEDIAN_US". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 5) {
        if (rank == 0) fprintf(stderr, "usage: osu_coll OP ITERS WARMUP SIZE...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *op = argv[1];
    int iters = atoi(argv[2]), warmup = atoi(argv[3]);
    double *t = malloc(sizeof(double) * iters), *tmax = malloc(sizeof(double) * iters);
    for (int a = 4; a < argc; a++) {
        long size = atol(argv[a]);
        long count = size / 4;
        if (!strcmp(op, "allgather")) count = count / n; /* per rank; the array is count*n */
        if (count < 1) continue;
        long total = !strcmp(op, "allgather") ? count * n : count;
        float *send = malloc(sizeof(float) * total), *recv = malloc(sizeof(float) * total);
        for (long i = 0; i < total; i++) send[i] = (float)((rank + i) % 5), recv[i] = 0;
        for (int it = -warmup; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (!strcmp(op, "allreduce"))
                MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (!strcmp(op, "allgather"))
                MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
            else
                MPI_Bcast(send, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            if (it >= 0) t[it] = dt * 1e6;
        }
        MPI_Allreduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(tmax, iters, sizeof(double), cmp);
        double median = iters % 2 ? tmax[iters / 2] : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
        if (rank == 0) printf("%s %ld %.3f\n", op, total * 4, median);
        free(send);
        free(recv);
    }
    free(t);
    free(tmax);
    MPI_Finalize();
    return 0;
}
