/* tbbench coll's MPI peer: the MPI library's own collectives, timed the way tbbench times its
 * own: per iteration MPI_Barrier, the call, each rank's time; the slowest rank's time per
 * iteration; every output element checked. tbbench builds it with mpicc and starts it under
 * mpirun on the run's hosts (suites/coll/README.md).
 *
 *   mpi_coll DTYPE REDOP ROOT WARMUP ITERS OP:COUNT...
 *     DTYPE f32 | f64; REDOP sum | max | min; OP all-reduce | all-gather | reduce-scatter |
 *     broadcast | reduce | all-to-all | ping-pong; COUNT as tbbench counts elements (per rank for
 *     reduce-scatter and all-gather, the whole array otherwise)
 *
 * Rank 0 prints one JSON object per line: first {"version", "ranks"}, then per row
 * {"op", "count", "times_us": [...], "wrong"}. Inputs are small integers ((rank + i) % 5 + 1),
 * so every reduction is exact. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_n, g_redop; /* 0 sum, 1 max, 2 min */

static double input(int r, long i) { return (double)((r + i) % 5 + 1); }

static double reduced(long i) {
    double v = input(0, i);
    for (int r = 1; r < g_n; r++) {
        double x = input(r, i);
        v = g_redop == 0 ? v + x : g_redop == 1 ? (x > v ? x : v) : (x < v ? x : v);
    }
    return v;
}

static void put(void *buf, int f64, long i, double v) {
    if (f64) ((double *)buf)[i] = v; else ((float *)buf)[i] = (float)v;
}
static double get(const void *buf, int f64, long i) {
    return f64 ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_n);
    if (argc < 6) {
        if (g_rank == 0) fprintf(stderr, "usage: mpi_coll DTYPE REDOP ROOT WARMUP ITERS OP:COUNT...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int f64 = !strcmp(argv[1], "f64");
    MPI_Datatype type = f64 ? MPI_DOUBLE : MPI_FLOAT;
    size_t elt = f64 ? 8 : 4;
    g_redop = !strcmp(argv[2], "max") ? 1 : !strcmp(argv[2], "min") ? 2 : 0;
    MPI_Op mop = g_redop == 0 ? MPI_SUM : g_redop == 1 ? MPI_MAX : MPI_MIN;
    int root = atoi(argv[3]), warmup = atoi(argv[4]), iters = atoi(argv[5]);
    if (g_rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        /* The first line of the library's own description ("Open MPI v4.1.4, ..."), quotes
         * and backslashes left out so it is a JSON string as it stands. */
        char *end = strpbrk(version, ",\n");
        if (end) *end = 0;
        for (char *c = version; *c; c++) if (*c == '"' || *c == '\\') *c = ' ';
        printf("{\"version\": \"%s\", \"ranks\": %d}\n", version, g_n);
        fflush(stdout);
    }
    double *t = malloc(sizeof(double) * (iters > 0 ? iters : 1));
    double *tmax = malloc(sizeof(double) * (iters > 0 ? iters : 1));
    for (int a = 6; a < argc; a++) {
        char op[32];
        long count = 0;
        if (sscanf(argv[a], "%31[^:]:%ld", op, &count) != 2 || count < 1) {
            if (g_rank == 0) fprintf(stderr, "mpi_coll: bad row '%s'\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        int ar = !strcmp(op, "all-reduce"), ag = !strcmp(op, "all-gather"),
            rs = !strcmp(op, "reduce-scatter"), bc = !strcmp(op, "broadcast"),
            rd = !strcmp(op, "reduce"), aa = !strcmp(op, "all-to-all"),
            pp = !strcmp(op, "ping-pong");
        /* Ping-pong: ranks 2k and 2k+1, the lower sends rank 0's values and takes them back;
           a last rank of an odd count sits out. */
        int partner = g_rank ^ 1;
        long send_len = rs ? count * g_n : count;
        long recv_len = ag ? count * g_n : count;
        void *send = malloc(elt * send_len), *recv = malloc(elt * recv_len);
        if (!send || !recv) {
            fprintf(stderr, "mpi_coll: no memory for %s of %ld elements\n", op, count);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        for (long i = 0; i < send_len; i++) put(send, f64, i, input(pp ? 0 : g_rank, i));
        for (long i = 0; i < recv_len; i++) put(recv, f64, i, 0);
        /* Broadcast works in one buffer: the root's input, every other rank's output. */
        void *bbuf = g_rank == root ? send : recv;
        for (int it = -warmup; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (ar) MPI_Allreduce(send, recv, count, type, mop, MPI_COMM_WORLD);
            else if (ag) MPI_Allgather(send, count, type, recv, count, type, MPI_COMM_WORLD);
            else if (rs) MPI_Reduce_scatter_block(send, recv, count, type, mop, MPI_COMM_WORLD);
            else if (bc) MPI_Bcast(bbuf, count, type, root, MPI_COMM_WORLD);
            else if (rd) MPI_Reduce(send, recv, count, type, mop, root, MPI_COMM_WORLD);
            else if (aa) MPI_Alltoall(send, count / g_n, type, recv, count / g_n, type, MPI_COMM_WORLD);
            else if (pp && partner >= g_n) memcpy(recv, send, elt * count);
            else if (pp && g_rank % 2 == 0) {
                MPI_Send(send, count, type, partner, 7, MPI_COMM_WORLD);
                MPI_Recv(recv, count, type, partner, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (pp) {
                MPI_Recv(recv, count, type, partner, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(recv, count, type, partner, 7, MPI_COMM_WORLD);
            }
            else {
                if (g_rank == 0) fprintf(stderr, "mpi_coll: unknown op '%s'\n", op);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            double dt = MPI_Wtime() - t0;
            if (it >= 0) t[it] = dt * 1e6;
        }
        long wrong = 0;
        if (ar) { for (long i = 0; i < count; i++) wrong += get(recv, f64, i) != reduced(i); }
        else if (ag) { for (long i = 0; i < count * g_n; i++) wrong += get(recv, f64, i) != input((int)(i / count), i % count); }
        else if (rs) { for (long i = 0; i < count; i++) wrong += get(recv, f64, i) != reduced(g_rank * count + i); }
        else if (bc) { for (long i = 0; i < count; i++) wrong += get(bbuf, f64, i) != input(root, i); }
        else if (rd && g_rank == root) { for (long i = 0; i < count; i++) wrong += get(recv, f64, i) != reduced(i); }
        else if (pp) { for (long i = 0; i < count; i++) wrong += get(recv, f64, i) != input(0, i); }
        else if (aa) {
            long block = count / g_n;
            for (long i = 0; i < count; i++) wrong += get(recv, f64, i) != input((int)(i / block), g_rank * block + i % block);
        }
        long wrong_all = 0;
        MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (g_rank == 0) {
            printf("{\"op\": \"%s\", \"count\": %ld, \"times_us\": [", op, count);
            for (int i = 0; i < iters; i++) printf("%s%.3f", i ? ", " : "", tmax[i]);
            printf("], \"wrong\": %ld}\n", wrong_all);
            fflush(stdout);
        }
        free(send);
        free(recv);
    }
    free(t);
    free(tmax);
    MPI_Finalize();
    return 0;
}
