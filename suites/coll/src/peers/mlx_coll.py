"""tbbench coll's MLX peer: MLX's own collectives (mx.distributed), timed the way tbbench
times its own: per iteration a barrier, the call (evaluated), each rank's time; the slowest
rank's time per iteration; every output element checked.

tbbench starts one of these per rank with MLX's own environment (MLX_RANK, MLX_HOSTFILE for
the ring backend; MLX_IBV_DEVICES and MLX_JACCL_COORDINATOR for jaccl), as mlx.launch would,
and the job as JSON in TBBENCH_PEER_JOB:

  {"backend": "ring", "ranks": 2, "dtype": "f32", "redop": "sum", "warmup": 5,
   "iters": 20, "rows": [{"op": "all-reduce", "count": 1024}, ...]}

Rank 0 prints one JSON object per line: first {"version", "backend", "ranks"}, then per row
{"op", "count", "times_us": [...], "wrong"} or {"op", "count", "skipped": why}. Counts are
tbbench's: elements per rank for reduce-scatter and all-gather, as nccl-tests counts them.
Inputs are small integers, so every sum is exact in every element type.
"""
import json
import os
import sys
import time

import mlx.core as mx

DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16, "f64": mx.float64}


RANK0 = [True]


def emit(obj):
    """One line on rank 0's stdout, the one tbbench reads."""
    if RANK0[0]:
        print(json.dumps(obj), flush=True)


def main():
    job = json.loads(os.environ["TBBENCH_PEER_JOB"])
    # One rank has no hostfile (as mlx.launch gives it none): MLX's group of one.
    group = mx.distributed.init(strict=job["ranks"] > 1, backend=job["backend"])
    rank, n = group.rank(), group.size()
    RANK0[0] = rank == 0
    # MLX's CPU stream: the collectives run there whatever the default device is.
    cpu = mx.cpu
    dtype = DTYPES[job["dtype"]]
    redop = job["redop"]
    emit({"version": mx.__version__, "backend": job["backend"], "ranks": n})

    def barrier():
        mx.eval(mx.distributed.all_sum(mx.zeros((1,), dtype=mx.float32), stream=cpu))

    def reduce_fn():
        return {"sum": mx.distributed.all_sum, "max": mx.distributed.all_max,
                "min": mx.distributed.all_min}[redop]

    def inputs(r, total):
        # Element i on rank r: (r + i) % 5 + 1, so a sum over 8 ranks is at most 40.
        return ((mx.arange(total, dtype=mx.int32) + r) % 5 + 1).astype(dtype)

    def reduced(total):
        parts = [inputs(r, total) for r in range(n)]
        out = parts[0]
        for p in parts[1:]:
            out = {"sum": mx.add, "max": mx.maximum, "min": mx.minimum}[redop](out, p)
        return out

    for row in job["rows"]:
        op, count = row["op"], row["count"]
        if op == "all-reduce":
            x = inputs(rank, count)
            call = lambda: reduce_fn()(x, stream=cpu)
            expect = reduced(count)
        elif op == "all-gather":
            x = inputs(rank, count)
            call = lambda: mx.distributed.all_gather(x, stream=cpu)
            expect = mx.concatenate([inputs(r, count) for r in range(n)])
        elif op == "ping-pong":
            # Ranks 2k and 2k+1: the lower sends rank 0's values and takes the echo back, the
            # upper receives and sends them back; a last rank of an odd count sits out.
            x = inputs(0, count)
            expect = x
            partner = rank ^ 1
            if partner >= n:
                call = lambda: x
            elif rank % 2 == 0:
                def call(x=x, partner=partner):
                    mx.eval(mx.distributed.send(x, partner, stream=cpu))
                    return mx.distributed.recv_like(x, partner, stream=cpu)
            else:
                def call(x=x, partner=partner):
                    y = mx.distributed.recv_like(x, partner, stream=cpu)
                    mx.eval(y)
                    mx.eval(mx.distributed.send(y, partner, stream=cpu))
                    return y
        elif op == "reduce-scatter":
            if redop != "sum":
                emit({"op": op, "count": count, "skipped": f"MLX's reduce-scatter (sum_scatter) only sums, not {redop}"})
                continue
            x = inputs(rank, count * n)
            call = lambda: mx.distributed.sum_scatter(x, stream=cpu)
            expect = reduced(count * n)[rank * count:(rank + 1) * count]
        else:
            emit({"op": op, "count": count, "skipped": f"MLX has no {op}"})
            continue
        try:
            mx.eval(x, expect)
            for _ in range(job["warmup"]):
                mx.eval(call())
            times = []
            for _ in range(job["iters"]):
                barrier()
                t = time.perf_counter()
                y = call()
                mx.eval(y)
                times.append((time.perf_counter() - t) * 1e6)
            wrong = mx.sum(y != expect).astype(mx.float32).reshape((1,))
            # The slowest rank's time per iteration; the wrong elements of every rank.
            slowest = mx.distributed.all_gather(mx.array(times, dtype=mx.float32), stream=cpu)
            slowest = slowest.reshape((n, len(times))).max(axis=0)
            wrong = mx.distributed.all_sum(wrong, stream=cpu)
            mx.eval(slowest, wrong)
        except RuntimeError as e:
            # One backend lacks an op (a message MLX raises alike on every rank).
            emit({"op": op, "count": count, "skipped": f"MLX ({job['backend']}): {e}"})
            continue
        emit({"op": op, "count": count, "times_us": slowest.tolist(), "wrong": int(wrong.item())})


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for tbbench to show, not a traceback
        print(f"mlx peer: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
