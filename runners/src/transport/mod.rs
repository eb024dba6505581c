//! One trait for every way ranks move bytes: tcp, shm, and (later) RDMA verbs.
//!
//! The trait is shaped by what verbs needs, since that is the strictest backend: messages are
//! whole (a receive names its exact size, as a posted RECV does), memory for hot buffers comes
//! from [`Transport::alloc`] so a backend can register it once, and [`Transport::exchange`]
//! posts a whole window of sends and receives before waiting for any (osu_bw's window, a
//! bidirectional exchange, one ring step of an all-reduce) so no backend deadlocks on two ranks
//! sending to each other at once.

pub mod shm;
pub mod tcp;

use anyhow::Result;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

/// One message to send: the bytes go to `peer` whole.
pub struct SendOp<'a> {
    pub peer: usize,
    pub buf: &'a [u8],
}

/// One message to receive from `peer`; the sender's message must be exactly `buf.len()` bytes.
pub struct RecvOp<'a> {
    pub peer: usize,
    pub buf: &'a mut [u8],
}

/// Who a rank is, for error messages: "rank 2 (mac3)".
#[derive(Debug, Clone)]
pub struct PeerName {
    pub rank: usize,
    pub host: String,
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} ({})", self.rank, self.host)
    }
}

pub trait Transport: Send {
    /// "tcp", "shm", "verbs".
    fn name(&self) -> &'static str;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Memory for messages. Page-aligned; a backend that must register memory with its device
    /// (verbs) registers it here once, so the timed path never registers. Backends without
    /// that need hand out plain aligned memory.
    fn alloc(&mut self, len: usize) -> Result<Buffer> {
        Ok(Buffer::new(len))
    }

    /// Posts every send and every receive, then waits until all have completed (or the
    /// transport's timeout passes with no progress). Messages between one ordered pair of ranks
    /// are matched in posting order. A receive whose size differs from the message sent is an
    /// error naming both sizes. Sending to oneself is not supported: collectives copy locally.
    fn exchange(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> Result<()>;

    fn send(&mut self, peer: usize, buf: &[u8]) -> Result<()> {
        self.exchange(&[SendOp { peer, buf }], &mut [])
    }

    fn recv(&mut self, peer: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[], &mut [RecvOp { peer, buf }])
    }
}

/// A page-aligned, zeroed byte buffer. Alignment keeps DMA and vector copies on their fast
/// paths and lets a verbs backend register whole pages.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// The buffer owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

const PAGE: usize = 4096;

impl Buffer {
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return Buffer {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, PAGE).expect("buffer size overflows");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buffer { ptr, len }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this exact layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, PAGE)) }
        }
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
