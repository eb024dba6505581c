//! One trait for every way ranks move bytes: tcp, shm, and RDMA verbs.
//!
//! The trait is shaped by what verbs needs, since that is the strictest backend: messages are
//! whole (a receive names its exact size, as a posted RECV does), memory for hot buffers comes
//! from [`Transport::alloc`] so a backend can register it once, and [`Transport::exchange`]
//! posts a whole window of sends and receives before waiting for any (osu_bw's window, a
//! bidirectional exchange, one ring step of an all-reduce) so no backend deadlocks on two ranks
//! sending to each other at once.

pub mod shm;
pub mod tcp;
#[cfg(test)]
mod tests;
pub mod verbs;

use crate::options::{RunOptions, TransportKind};
use crate::session::{PeerName, RankInfo, Token};
use anyhow::Result;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::net::IpAddr;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

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

/// How a wait for a message spends its core while nothing arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Waiting {
    /// Retry for a while before sleeping (each transport's own spin, shorter with more ranks
    /// than cores): an answer comes within microseconds and a woken thread takes tens of
    /// them, so a rank with nothing else to do waits fastest this way.
    #[default]
    Spin,
    /// Sleep at once (in poll, or in short naps where there is nothing to poll): for messages
    /// that travel on a helper thread while the rank computes on the cores it was given, as
    /// HPL's lookahead broadcast does. There every spin takes the core from the computation;
    /// on 2 ranks on 2 cores, a 1 ms spin per panel halved hpl's rate at N=1000.
    Beside,
}

/// Which way the next exchanges' messages go, for a transport that carries one-way traffic
/// differently (tcp: whether a pair's connections share a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Traffic {
    /// Ranks send and receive at once (all-reduce, all-gather, all-to-all, and anything not
    /// said otherwise).
    #[default]
    Both,
    /// Between each pair data flows one way: broadcast and reduce, from or towards a root.
    /// Both ends of a message must cut it alike, so every rank of a collective sets this
    /// around the same calls.
    OneWay,
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

    /// The longest wait with no progress before an operation fails.
    fn timeout(&self) -> std::time::Duration;

    /// Changes that limit, e.g. for a rank that waits out another pair's long measurement
    /// (the control channel's heartbeats still end the run if a rank dies meanwhile).
    fn set_timeout(&mut self, timeout: std::time::Duration) -> Result<()>;

    /// How this rank's waits spend the core while nothing arrives (the default
    /// [`Waiting::Spin`]); see [`Waiting`].
    fn set_waiting(&mut self, waiting: Waiting);

    /// Which way the next exchanges' messages go (the default [`Traffic::Both`]); see
    /// [`Traffic`]. Transports that carry both kinds alike ignore it.
    fn set_traffic(&mut self, _traffic: Traffic) {}

    /// The size in bytes a reduction step receives and adds at a time, where this transport
    /// gains by it; None: one message per step. A transport that buffers in the kernel (tcp)
    /// keeps the peer's sending going while a received segment is added in, and the segment
    /// is added while it is still in cache.
    fn reduce_segment(&self) -> Option<usize> {
        None
    }

    fn send(&mut self, peer: usize, buf: &[u8]) -> Result<()> {
        self.exchange(&[SendOp { peer, buf }], &mut [])
    }

    fn recv(&mut self, peer: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[], &mut [RecvOp { peer, buf }])
    }
}

/// What a rank knows when it starts opening its transport, before the rendezvous.
pub struct OpenPlan<'a> {
    pub rank: usize,
    pub size: usize,
    pub opts: &'a RunOptions,
    /// This rank's data address (from --iface, a subnet of --over, or where the launcher
    /// placed it); None lets the transport pick.
    pub data_ip: Option<IpAddr>,
    pub token: &'a Token,
}

/// What every rank published at the rendezvous, for connecting to them.
pub struct Peers<'a> {
    pub rank: usize,
    pub table: &'a [RankInfo],
    pub names: Vec<PeerName>,
    pub token: &'a Token,
    pub opts: &'a RunOptions,
    /// Over links: the cables each pair has (None: one network for every pair).
    pub cabling: Option<&'a crate::links::Cabling>,
    /// What every rank said in the rendezvous' second round ([`cabled_round`]), in rank order.
    pub cabled: Option<&'a [Option<String>]>,
}

/// A transport connected, and the network it runs on as the result file records it.
pub struct Opened {
    pub transport: Box<dyn Transport>,
    pub network: tbbench_schema::Network,
}

/// A transport half open: what the peers need to reach it exists (a listener bound, queue
/// pairs made, a segment created) and travels with the rendezvous; then it connects. Each
/// transport brings its own, so the driver opens any of them the same way.
pub trait Opening {
    /// Puts what the peers need into this rank's rendezvous entry (a port, queue pair numbers).
    fn advertise(&self, me: &mut RankInfo);
    /// For a transport that can say how to reach it only once the cables are known
    /// ([`cabled_round`]): what goes to every rank in the rendezvous' second round.
    fn advertise_cabled(&mut self, _cabling: &crate::links::Cabling) -> Result<Option<String>> {
        Ok(None)
    }
    /// Connects to every peer and describes the network from what the OS says about it.
    fn connect(self: Box<Self>, peers: &Peers) -> Result<Opened>;
}

/// Whether the run needs the rendezvous' second round: verbs over links puts each peer's queue
/// pairs on the device of its cable, which only the table of every rank's cables says.
pub fn cabled_round(opts: &RunOptions) -> bool {
    opts.net.links && opts.net.transport == TransportKind::Verbs
}

/// Starts opening the transport the options name. The one place a transport kind picks its
/// implementation.
pub fn prepare(plan: &OpenPlan) -> Result<Box<dyn Opening>> {
    match plan.opts.net.transport {
        TransportKind::Tcp => tcp::TcpOpening::prepare(plan),
        TransportKind::Shm => shm::ShmOpening::prepare(plan),
        TransportKind::Verbs => verbs::VerbsOpening::prepare(plan),
    }
}

/// The data addresses every rank published, in rank order ("" where none).
fn published_addresses(table: &[RankInfo]) -> Vec<String> {
    table
        .iter()
        .map(|i| i.data_ip.clone().unwrap_or_default())
        .collect()
}

/// A page-aligned, zeroed byte buffer. Alignment keeps DMA and vector copies on their fast
/// paths and lets a verbs backend register whole pages. A buffer may instead live in a shared
/// memory object ([`Buffer::shared`]) that a same-host peer can map and copy from directly.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    region: Option<Arc<SharedRegion>>,
    /// Released before the memory is freed: a verbs memory registration must never outlive
    /// the pages it pins, or a later allocation at the same address would be matched to it.
    guard: Option<Box<dyn Send + Sync>>,
}

// The buffer owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

const PAGE: usize = 4096;

/// A memory object other processes on this host can map: a Linux memfd. Unmapped and closed
/// when the last buffer using it goes.
pub struct SharedRegion {
    pub fd: i32,
    /// Unique within this process, so a peer never mistakes a recycled fd number for an old
    /// region it has mapped.
    pub id: u64,
    pub start: usize,
    pub len: usize,
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: exactly what Buffer::shared mapped and opened.
        unsafe {
            libc::munmap(self.start as *mut _, self.len);
            libc::close(self.fd);
        }
    }
}

impl Buffer {
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return Buffer {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
                region: None,
                guard: None,
            };
        }
        let layout = Layout::from_size_align(len, PAGE).expect("buffer size overflows");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buffer {
            ptr,
            len,
            region: None,
            guard: None,
        }
    }

    /// Ties `guard` (a registration of this memory) to the buffer: dropped just before the
    /// memory is freed.
    pub fn with_guard(mut self, guard: Box<dyn Send + Sync>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// A buffer in a memfd, so a peer on this host can map it and copy out of it with one
    /// user-space memcpy (see the shm transport). Linux only; elsewhere a plain buffer.
    #[cfg(target_os = "linux")]
    pub fn shared(len: usize) -> Result<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        if len == 0 {
            return Ok(Buffer::new(0));
        }
        // SAFETY: plain syscalls; every failure path closes what it opened.
        unsafe {
            let fd = libc::memfd_create(c"tbbench-buffer".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(e.into());
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(e.into());
            }
            let region = SharedRegion {
                fd,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                start: p as usize,
                len,
            };
            Ok(Buffer {
                ptr: p as *mut u8,
                len,
                region: Some(Arc::new(region)),
                guard: None,
            })
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn shared(len: usize) -> Result<Self> {
        Ok(Buffer::new(len))
    }

    /// The shared region this buffer lives in, if any.
    pub fn region(&self) -> Option<&Arc<SharedRegion>> {
        self.region.as_ref()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        drop(self.guard.take());
        if self.len > 0 && self.region.is_none() {
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
