//! The six collectives and the ping-pong, each a small implementation of [`Collective`]: its buffers, how it
//! runs in and out of place, and the value every checked element must hold. The sweep, the
//! timing and the table are the harness's (as nccl-tests' common.cu is).
//!
//! Out of place, the input is copied into the output buffer first and the collective then
//! runs in place there (as OpenMPI's ring all-reduce does): the copy is part of the time.

use crate::input::Input;
use anyhow::Result;
use tbbench_runners::comm::{Algo, CollOp, Comm, Element, Group, ReduceOp};

/// What one row runs with.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub algo: Algo,
    pub redop: ReduceOp,
    pub root: usize,
    pub in_place: bool,
}

pub trait Collective {
    const OP: CollOp;

    /// Send and receive buffer lengths in elements on each rank for nccl-tests' `count`
    /// (elements per rank for reduce-scatter and all-gather: their size S is the whole
    /// array, count × ranks).
    fn lengths(count: usize, n: usize) -> (usize, usize);

    /// The elements of `recv` this rank checks, and what each must hold.
    fn checked(rank: usize, n: usize, count: usize, call: &Call) -> std::ops::Range<usize>;
    fn expected(input: &Input, rank: usize, n: usize, count: usize, call: &Call, i: usize) -> f64;

    /// This rank's input, written where the op reads it: `send` out of place, the op's place
    /// in `recv` in place.
    fn fill<T: Element>(
        input: &Input,
        rank: usize,
        count: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) {
        let _ = count;
        let target = if call.in_place { recv } else { send };
        fill_from(input, rank, 0, target);
    }

    fn run<T: Element>(
        comm: &mut Comm,
        count: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo>;
}

fn fill_from<T: Element>(input: &Input, rank: usize, offset: usize, out: &mut [T]) {
    for (i, x) in out.iter_mut().enumerate() {
        *x = T::from_f64(input.value(rank, offset + i));
    }
}

pub struct AllReduce;
impl Collective for AllReduce {
    const OP: CollOp = CollOp::AllReduce;
    fn lengths(count: usize, _n: usize) -> (usize, usize) {
        (count, count)
    }
    fn checked(_: usize, _: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        0..count
    }
    fn expected(input: &Input, _: usize, _: usize, _: usize, call: &Call, i: usize) -> f64 {
        input.reduced(call.redop, i)
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            return comm.all_reduce(recv, call.redop, call.algo);
        }
        comm.all_reduce_from(Group::All, send, recv, call.redop, call.algo)
    }
}

pub struct ReduceScatter;
impl Collective for ReduceScatter {
    const OP: CollOp = CollOp::ReduceScatter;
    /// The whole array in and, as nccl-tests lays reduce-scatter out in place, the rank's own
    /// block of it out: the receive buffer holds all n blocks and the result lands in block
    /// `rank`.
    fn lengths(count: usize, n: usize) -> (usize, usize) {
        (count * n, count * n)
    }
    fn checked(rank: usize, _: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        rank * count..(rank + 1) * count
    }
    fn expected(input: &Input, _: usize, _: usize, _: usize, call: &Call, i: usize) -> f64 {
        input.reduced(call.redop, i)
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            return comm.reduce_scatter_in(Group::All, recv, call.redop, call.algo);
        }
        comm.reduce_scatter_from(Group::All, send, recv, call.redop, call.algo)
    }
}

pub struct AllGather;
impl Collective for AllGather {
    const OP: CollOp = CollOp::AllGather;
    fn lengths(count: usize, n: usize) -> (usize, usize) {
        (count, count * n)
    }
    fn checked(_: usize, n: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        0..count * n
    }
    /// Block j holds rank j's input.
    fn expected(input: &Input, _: usize, _: usize, count: usize, _: &Call, i: usize) -> f64 {
        input.value(i / count, i % count)
    }
    fn fill<T: Element>(
        input: &Input,
        rank: usize,
        count: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) {
        if call.in_place {
            fill_from(input, rank, 0, &mut recv[rank * count..(rank + 1) * count]);
        } else {
            fill_from(input, rank, 0, send);
        }
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            return comm.all_gather_in(Group::All, recv, call.algo);
        }
        comm.all_gather_from(Group::All, send, recv, call.algo)
    }
}

pub struct Broadcast;
impl Collective for Broadcast {
    const OP: CollOp = CollOp::Broadcast;
    fn lengths(count: usize, _n: usize) -> (usize, usize) {
        (count, count)
    }
    fn checked(_: usize, _: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        0..count
    }
    fn expected(input: &Input, _: usize, _: usize, _: usize, call: &Call, i: usize) -> f64 {
        input.value(call.root, i)
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if comm.rank() == call.root && !call.in_place {
            // The root sends from its input, which it only reads, and fills its output after:
            // the others then read lines the root has not just written (over shared memory a
            // copy out of another core's freshly written cache lines costs twice as long).
            let algo = comm.broadcast_in(Group::All, call.root, send, call.algo)?;
            recv.copy_from_slice(send);
            return Ok(algo);
        }
        comm.broadcast_in(Group::All, call.root, recv, call.algo)
    }
}

pub struct Reduce;
impl Collective for Reduce {
    const OP: CollOp = CollOp::Reduce;
    fn lengths(count: usize, _n: usize) -> (usize, usize) {
        (count, count)
    }
    /// Only the root's output is defined.
    fn checked(rank: usize, _: usize, count: usize, call: &Call) -> std::ops::Range<usize> {
        if rank == call.root {
            0..count
        } else {
            0..0
        }
    }
    fn expected(input: &Input, _: usize, _: usize, _: usize, call: &Call, i: usize) -> f64 {
        input.reduced(call.redop, i)
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            return comm.reduce_in(Group::All, call.root, recv, call.redop, call.algo);
        }
        comm.reduce_from(Group::All, call.root, send, recv, call.redop, call.algo)
    }
}

pub struct AllToAll;
impl Collective for AllToAll {
    const OP: CollOp = CollOp::AllToAll;
    /// n blocks of `count / n` each way (nccl-tests' alltoall: count is the whole buffer).
    fn lengths(count: usize, n: usize) -> (usize, usize) {
        let block = count / n;
        (block * n, block * n)
    }
    fn checked(_: usize, n: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        0..count / n * n
    }
    /// Block j comes from rank j: its block `rank`.
    fn expected(input: &Input, rank: usize, n: usize, count: usize, _: &Call, i: usize) -> f64 {
        let block = count / n;
        input.value(i / block, rank * block + i % block)
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            // In place, the input sits in `recv`; it goes out from a copy in the send buffer.
            send.copy_from_slice(recv);
        }
        comm.all_to_all_in(Group::All, send, recv, call.algo)
    }
}

pub struct PingPong;
impl Collective for PingPong {
    const OP: CollOp = CollOp::PingPong;
    fn lengths(count: usize, _n: usize) -> (usize, usize) {
        (count, count)
    }
    fn checked(_: usize, _: usize, count: usize, _: &Call) -> std::ops::Range<usize> {
        0..count
    }
    /// Every rank sends rank 0's values, so what comes back (or across) is the same whichever
    /// member of a pair a rank is: the cables' order, not the rank, decides the pairs.
    fn expected(input: &Input, _: usize, _: usize, _: usize, _: &Call, i: usize) -> f64 {
        input.value(0, i)
    }
    fn fill<T: Element>(
        input: &Input,
        _rank: usize,
        _count: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) {
        let target = if call.in_place { recv } else { send };
        fill_from(input, 0, 0, target);
    }
    fn run<T: Element>(
        comm: &mut Comm,
        _: usize,
        call: &Call,
        send: &mut [T],
        recv: &mut [T],
    ) -> Result<Algo> {
        if call.in_place {
            return comm.ping_pong_in(Group::All, None, recv, call.algo);
        }
        comm.ping_pong_in(Group::All, Some(send), recv, call.algo)
    }
}
