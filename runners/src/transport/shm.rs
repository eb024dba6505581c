//! Shared memory, for ranks on one host: one POSIX shared-memory segment per run, holding a
//! small mailbox and a single-producer/single-consumer byte ring for every ordered pair of
//! ranks.
//!
//! Small messages are copied through shared memory (two copies, but no syscall on the hot path:
//! both ends spin on cache lines). Those up to about 1 KiB go in a slot of a small per-pair
//! mailbox whose first word is the message's sequence stamp (OpenMPI's fast boxes work the same
//! way): the receiver polls the line that carries the data itself, so an 8-byte message costs
//! one cache-line transfer instead of two (the ring's head, then its data). Larger messages,
//! and small ones while every slot is taken, go through a byte ring. On Linux, large messages
//! go with one copy instead: the sender puts only the address of its buffer in the ring and the
//! receiver pulls the bytes straight out of the sender's memory with process_vm_readv (cross-
//! memory attach, as MPI's shared-memory transports do), then acknowledges so the sender may
//! reuse the buffer. Where that is not permitted (ptrace restrictions), everything goes through
//! the ring.

use super::{
    Buffer, OpenPlan, Opened, Opening, Peers, RecvOp, SendOp, SharedRegion, Transport, Waiting,
};
use crate::session::{PeerName, RankInfo};
use anyhow::{anyhow, bail, Context, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub const MAX_RANKS: usize = 64;
/// How long a wait yields its core before it naps (see the wait loop in `exchange`).
const YIELD_BEFORE_NAPS: Duration = Duration::from_millis(2);
const RING: usize = 2 << 20;
const LINE: usize = 128;
const HDR: usize = 8;
/// Messages from this size up, in a buffer that is not shared, are read out of the sender's
/// memory with process_vm_readv (a system call each, so not for small ones).
const CMA_MIN: usize = 64 << 10;
/// Messages a mailbox slot cannot take, in a shared buffer ([`Buffer::shared`], what `alloc`
/// hands out from this size up), go by the mapped path: the receiver copies them straight out
/// of the sender's buffer. Through the ring a message is copied twice (into the ring, then
/// out of it, on different cores); mapped, once, with a one-line ack back, which was faster
/// from the first size past a slot up. Re-measure: `tbbench coll -t shm --op broadcast,all-reduce
/// --sizes 1536,8KiB,32KiB` on 2 and 4 ranks with this constant changed.
const MAPPED_MIN: usize = SLOT_MAX + 1;
const CMA_FLAG: u64 = 1 << 63;
/// The message waits in a shared region ([`Buffer::shared`]) the receiver maps and copies from.
const MAPPED_FLAG: u64 = 1 << 62;
/// Mappings of peers' regions kept open at most, in bytes and in number (least recently used
/// ones go first).
const MAP_CACHE_BYTES: usize = 1 << 30;
const MAP_CACHE_COUNT: usize = 256;

/// How one message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Copied into the ring and out again.
    Ring,
    /// The receiver reads the sender's memory with process_vm_readv.
    Cma,
    /// The receiver maps the sender's shared buffer and copies with memcpy.
    Mapped,
}

/// A peer's shared region, mapped here.
struct PeerMap {
    peer: usize,
    id: u64,
    base: *mut u8,
    len: usize,
    last_used: u64,
}
const MAGIC: u64 = 0x7462_6265_6e63_6801;

/// Header page: ranks meet here before any ring is used.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    size: AtomicU64,
    attached: AtomicU64,
    probed: AtomicU64,
    pids: [AtomicU32; MAX_RANKS],
    probe_addr: [AtomicU64; MAX_RANKS],
    /// 1 = this rank can read every peer's memory, 2 = it cannot.
    can_read: [AtomicU32; MAX_RANKS],
}

/// Control block of one ring: head and tail on their own cache lines so the two ends do not
/// bounce one line between cores.
#[repr(C)]
struct RingCtl {
    head: AtomicU64,
    _pad0: [u8; LINE - 8],
    tail: AtomicU64,
    _pad1: [u8; LINE - 8],
    /// One-copy messages the receiver has finished reading.
    acks: AtomicU64,
    _pad2: [u8; LINE - 8],
    /// Messages the receiver has taken in, by either path: slot k (of message k) is free again
    /// once this passes k + 1 - SLOTS.
    received: AtomicU64,
    _pad3: [u8; LINE - 8],
}

/// Mailbox slots per ordered pair. More messages than this sent ahead of their receives go
/// through the ring instead, so the slots never limit how far a sender may run ahead.
const SLOTS: usize = 32;
/// One slot: the stamp, the length, the payload; a whole number of 64-byte lines.
const SLOT: usize = 1088;
const SLOT_HDR: usize = 16;
/// Messages up to this size may take a slot.
const SLOT_MAX: usize = SLOT - SLOT_HDR;

/// A slot's first line. `stamp` is the message's sequence number plus one (zeroed memory is
/// never a match), stored last: once it reads k + 1, message k's length and payload are there.
#[repr(C)]
struct SlotHead {
    stamp: AtomicU64,
    len: AtomicU64,
}

const HEADER_BYTES: usize = 64 << 10;
const RING_STRIDE: usize = std::mem::size_of::<RingCtl>() + SLOTS * SLOT + RING;

/// The segment's name, derived from the session token so every rank finds it and no two runs
/// collide. Short enough for macOS's 31-character shm names.
pub fn segment_name(token: &[u8; 16]) -> String {
    let hex: String = token[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("/tbbench-{hex}")
}

fn segment_len(size: usize) -> usize {
    HEADER_BYTES + size * size * RING_STRIDE
}

/// Rank 0 creates the segment before it hands out the rank table, so it exists by the time any
/// other rank attaches.
pub fn create_segment(token: &[u8; 16], size: usize) -> Result<()> {
    if size > MAX_RANKS {
        bail!("shm supports at most {MAX_RANKS} ranks on one host, {size} asked for");
    }
    let name = std::ffi::CString::new(segment_name(token))?;
    // SAFETY: plain libc calls on a NUL-terminated name; the fd is closed below.
    unsafe {
        let fd = libc::shm_open(
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            0o600,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .context("cannot create the shared-memory segment");
        }
        let rc = libc::ftruncate(fd, segment_len(size) as libc::off_t);
        libc::close(fd);
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            libc::shm_unlink(name.as_ptr());
            return Err(e)
                .context("cannot size the shared-memory segment (is /dev/shm large enough?)");
        }
    }
    Ok(())
}

/// The segment rank 0 created and has not yet seen every rank attach to, for the SIGPIPE
/// handler: a leaked NUL-terminated name, or null. Read from a signal handler, so an atomic
/// pointer and nothing that allocates.
static PENDING_SEGMENT: std::sync::atomic::AtomicPtr<libc::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Remembers the segment as rank 0's to remove should it die of SIGPIPE before every rank
/// attached (see `driver`).
pub fn remember_pending(token: &[u8; 16]) {
    if let Ok(name) = std::ffi::CString::new(segment_name(token)) {
        PENDING_SEGMENT.store(name.into_raw(), std::sync::atomic::Ordering::SeqCst);
    }
}

/// Forgets it (every rank attached: the segment is unlinked already).
pub fn forget_pending() {
    PENDING_SEGMENT.store(std::ptr::null_mut(), std::sync::atomic::Ordering::SeqCst);
}

/// Async-signal-safe: unlinks the remembered segment, if any.
pub fn unlink_pending_from_signal() {
    let p = PENDING_SEGMENT.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: p is a leaked NUL-terminated name; shm_unlink is a plain system call.
        unsafe { libc::shm_unlink(p) };
    }
}

pub fn unlink_segment(token: &[u8; 16]) {
    if let Ok(name) = std::ffi::CString::new(segment_name(token)) {
        // SAFETY: NUL-terminated name; failure (already gone) is fine.
        unsafe { libc::shm_unlink(name.as_ptr()) };
    }
}

/// shm half open: on rank 0, the segment every rank attaches to once the rendezvous is done.
pub struct ShmOpening {
    /// Rank 0 created the segment and no rank has attached yet: dropped unconnected (the
    /// rendezvous failed), it removes the segment.
    created: Option<[u8; 16]>,
}

impl ShmOpening {
    pub fn prepare(plan: &OpenPlan) -> Result<Box<dyn Opening>> {
        let mut created = None;
        if plan.rank == 0 {
            let token = plan.token.0;
            create_segment(&token, plan.size)?;
            // Gone once every rank attached; this covers runs that fail before that.
            crate::abort::on_abort(move || unlink_segment(&token));
            remember_pending(&token);
            created = Some(token);
        }
        Ok(Box::new(ShmOpening { created }))
    }
}

impl Drop for ShmOpening {
    fn drop(&mut self) {
        if let Some(token) = self.created.take() {
            unlink_segment(&token);
        }
    }
}

impl Opening for ShmOpening {
    fn advertise(&self, _me: &mut RankInfo) {}

    fn connect(mut self: Box<Self>, p: &Peers) -> Result<Opened> {
        // Attaching (or failing to) is what removes the segment from here on.
        self.created = None;
        let first = &p.table[0];
        if let Some(other) = p
            .table
            .iter()
            .find(|i| i.hostname != first.hostname || i.boot_id != first.boot_id)
        {
            bail!(
                "--transport shm needs every rank on one host, but {} runs on {} and rank 0 on {}",
                p.names[other.rank],
                other.hostname,
                first.hostname
            );
        }
        let t = ShmTransport::attach(
            p.rank,
            p.table.len(),
            &p.token.0,
            p.names.clone(),
            p.opts.timeout,
        )?;
        Ok(Opened {
            transport: Box::new(t),
            network: tbbench_schema::Network {
                transport: "shm".into(),
                link_kind: "shm".into(),
                label: "shm".into(),
                ..Default::default()
            },
        })
    }
}

pub struct ShmTransport {
    rank: usize,
    size: usize,
    base: *mut u8,
    len: usize,
    names: Vec<PeerName>,
    timeout: Duration,
    one_copy: bool,
    /// One-copy sends issued to each peer so far; a send is complete when the peer's ack count
    /// reaches its number.
    cma_sent: Vec<u64>,
    /// Per peer, the consumer position last read from the ring this rank writes to it. The
    /// consumer only moves it forward, so the space it implies is never more than there is;
    /// it is read again only when a message does not fit. Reading the consumer's line on
    /// every send would pull it across cores each time (a cache miss per message).
    tail_seen: Vec<u64>,
    /// Per peer, messages sent to it so far (the next one's sequence number), and its
    /// `received` count last read: like `tail_seen`, read again only when a slot looks taken.
    sent: Vec<u64>,
    received_seen: Vec<u64>,
    /// Per peer, messages received from it so far.
    received: Vec<u64>,
    /// Bytes in flight on the probe, kept alive for the peers' probe reads.
    _probe: Box<u64>,
    /// Shared buffers this rank handed out, to recognise them when they are sent.
    regions: Vec<Weak<SharedRegion>>,
    maps: Vec<PeerMap>,
    map_clock: u64,
    /// Reused by every exchange, so the latency path allocates nothing.
    scratch: Scratch,
    /// Busy-wait tries before a wait starts yielding: none when this host runs more ranks
    /// than it has cores, where a spinning rank only delays the peer it waits for (256
    /// PAUSEs are about 15 µs on recent Intel cores).
    spins: u32,
    /// Beside a computation ([`Waiting::Beside`]) a wait neither spins nor yields: it naps.
    waiting: Waiting,
}

#[derive(Default)]
struct Scratch {
    out: Vec<Pending>,
    inc: Vec<Pending>,
    blocked: Vec<bool>,
}

// The mapping is owned by this transport; the rings are shared only through atomics.
unsafe impl Send for ShmTransport {}

impl ShmTransport {
    /// Maps the segment rank 0 created, waits until every rank has, and works out whether the
    /// one-copy path is allowed. Rank 0 removes the name once all are attached, so nothing is
    /// left in /dev/shm even if a rank is killed later.
    pub fn attach(
        rank: usize,
        size: usize,
        token: &[u8; 16],
        names: Vec<PeerName>,
        timeout: Duration,
    ) -> Result<Self> {
        let name = std::ffi::CString::new(segment_name(token))?;
        let len = segment_len(size);
        // SAFETY: standard shm_open + mmap of a segment sized by create_segment.
        let base = unsafe {
            let fd = libc::shm_open(name.as_ptr(), libc::O_RDWR, 0o600);
            if fd < 0 {
                return Err(std::io::Error::last_os_error())
                    .context("cannot open the shared-memory segment (are all ranks on one host?)");
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error())
                    .context("cannot map the shared-memory segment");
            }
            p as *mut u8
        };
        #[cfg(target_os = "linux")]
        // SAFETY: allows peers to read this process's memory with process_vm_readv under Yama.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
        }
        let probe = Box::new(0x5eed_u64 + rank as u64);
        let mut t = ShmTransport {
            rank,
            size,
            base,
            len,
            names,
            timeout,
            one_copy: false,
            cma_sent: vec![0; size],
            tail_seen: vec![0; size],
            sent: vec![0; size],
            received_seen: vec![0; size],
            received: vec![0; size],
            _probe: probe,
            regions: Vec::new(),
            maps: Vec::new(),
            map_clock: 0,
            scratch: Scratch::default(),
            spins: if size > std::thread::available_parallelism().map_or(1, |n| n.get()) {
                0
            } else {
                256
            },
            waiting: Waiting::Spin,
        };
        let h = t.header();
        if rank == 0 {
            h.magic.store(MAGIC, Ordering::Release);
            h.size.store(size as u64, Ordering::Release);
        }
        h.pids[rank].store(std::process::id(), Ordering::Release);
        h.probe_addr[rank].store(&*t._probe as *const u64 as u64, Ordering::Release);
        h.attached.fetch_add(1, Ordering::AcqRel);
        let waited = t.wait_count(&t.header().attached, size as u64, "attach to shared memory");
        if rank == 0 {
            unlink_segment(token);
            forget_pending();
        }
        waited?;
        let ok = t.probe_peers();
        h.can_read[rank].store(if ok { 1 } else { 2 }, Ordering::Release);
        h.probed.fetch_add(1, Ordering::AcqRel);
        t.wait_count(
            &t.header().probed,
            size as u64,
            "check shared memory access",
        )?;
        t.one_copy = (0..size).all(|r| h.can_read[r].load(Ordering::Acquire) == 1);
        Ok(t)
    }

    /// Whether large messages move with one copy or through the rings.
    pub fn one_copy(&self) -> bool {
        self.one_copy
    }

    /// The shared region holding `buf`, as (id, fd, offset), if this rank allocated it.
    /// It runs on every send past a mailbox slot, so pruning freed regions is left to `alloc`.
    fn region_of(&self, buf: &[u8]) -> Option<(u64, i32, usize)> {
        let at = buf.as_ptr() as usize;
        self.regions
            .iter()
            .filter_map(|w| w.upgrade())
            .find(|r| at >= r.start && at + buf.len() <= r.start + r.len)
            .map(|r| (r.id, r.fd, at - r.start))
    }

    /// Maps a peer's shared region (opened through /proc/PID/fd, which the ptrace permission
    /// granted at attach allows), or finds it mapped already. Returns its base address.
    fn map_peer_region(&mut self, peer: usize, id: u64, fd: i32, need: usize) -> Result<*const u8> {
        self.map_clock += 1;
        if let Some(m) = self.maps.iter_mut().find(|m| m.peer == peer && m.id == id) {
            m.last_used = self.map_clock;
            if need > m.len {
                bail!(
                    "{} sent a message beyond the end of its shared buffer",
                    self.names[peer]
                );
            }
            return Ok(m.base);
        }
        let pid = self.header().pids[peer].load(Ordering::Acquire);
        let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}"))?;
        // SAFETY: open/fstat/mmap/close on a path we built; failures are reported.
        let (base, len) = unsafe {
            let f = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if f < 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("cannot open {}'s shared buffer", self.names[peer]));
            }
            let mut st: libc::stat = std::mem::zeroed();
            let len = if libc::fstat(f, &mut st) == 0 {
                st.st_size as usize
            } else {
                0
            };
            #[cfg(target_os = "linux")]
            let flags = libc::MAP_SHARED | libc::MAP_POPULATE;
            #[cfg(not(target_os = "linux"))]
            let flags = libc::MAP_SHARED;
            let p = if len >= need {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, flags, f, 0)
            } else {
                libc::MAP_FAILED
            };
            libc::close(f);
            if p == libc::MAP_FAILED {
                bail!(
                    "cannot map {}'s shared buffer ({len} bytes, {need} needed)",
                    self.names[peer]
                );
            }
            (p as *mut u8, len)
        };
        self.maps.push(PeerMap {
            peer,
            id,
            base,
            len,
            last_used: self.map_clock,
        });
        // Keep the cache bounded: a peer's freed buffers stay alive while mapped here.
        while (self.maps.len() > MAP_CACHE_COUNT
            || self.maps.iter().map(|m| m.len).sum::<usize>() > MAP_CACHE_BYTES)
            && self.maps.len() > 1
        {
            let (i, _) = self
                .maps
                .iter()
                .enumerate()
                .min_by_key(|(_, m)| m.last_used)
                .unwrap_or((0, &self.maps[0]));
            let old = self.maps.swap_remove(i);
            // SAFETY: unmaps a mapping made above.
            unsafe { libc::munmap(old.base as *mut _, old.len) };
        }
        Ok(base)
    }

    /// How many peers' regions this rank has mapped now.
    #[cfg(all(test, target_os = "linux"))]
    pub(super) fn mapped_regions(&self) -> usize {
        self.maps.len()
    }

    fn header(&self) -> &'static Header {
        // SAFETY: the header lives at the start of the mapping for the transport's lifetime;
        // 'static is a white lie confined to this module (the mapping outlives every use).
        unsafe { &*(self.base as *const Header) }
    }

    fn ring(&self, from: usize, to: usize) -> (&'static RingCtl, *mut u8) {
        let off = HEADER_BYTES + (from * self.size + to) * RING_STRIDE;
        // SAFETY: in bounds by segment_len; RingCtl is all atomics and padding.
        unsafe {
            let ctl = &*(self.base.add(off) as *const RingCtl);
            let ring = std::mem::size_of::<RingCtl>() + SLOTS * SLOT;
            (ctl, self.base.add(off + ring))
        }
    }

    /// The mailbox slot message `seq` from `from` to `to` uses: its head and its payload.
    fn slot(&self, from: usize, to: usize, seq: u64) -> (&'static SlotHead, *mut u8) {
        let off = HEADER_BYTES
            + (from * self.size + to) * RING_STRIDE
            + std::mem::size_of::<RingCtl>()
            + (seq as usize % SLOTS) * SLOT;
        // SAFETY: in bounds by segment_len; the head is two atomics, 64-byte aligned.
        unsafe {
            let at = self.base.add(off);
            (&*(at as *const SlotHead), at.add(SLOT_HDR))
        }
    }

    /// Counts a message from `peer` as received, which frees its slot for the sender.
    fn took_message(&mut self, ctl: &RingCtl, peer: usize) {
        self.received[peer] += 1;
        ctl.received.store(self.received[peer], Ordering::Release);
    }

    fn size_mismatch(&self, peer: usize, sent: u64, expected: usize) -> anyhow::Error {
        anyhow!(
            "message size mismatch from {}: it sent {sent} bytes, {expected} were expected",
            self.names[peer]
        )
    }

    /// Puts message `buf` in its slot to `peer` if the slot is free, and says whether it did.
    fn try_slot_send(&mut self, peer: usize, buf: &[u8]) -> bool {
        let seq = self.sent[peer];
        // Slot seq % SLOTS last carried message seq - SLOTS at the latest.
        let free = |received: u64| seq < received + SLOTS as u64;
        if !free(self.received_seen[peer]) {
            let (ctl, _) = self.ring(self.rank, peer);
            self.received_seen[peer] = ctl.received.load(Ordering::Acquire);
            if !free(self.received_seen[peer]) {
                return false;
            }
        }
        let (head, data) = self.slot(self.rank, peer, seq);
        // SAFETY: the slot is free (the receiver is done with its last message) and holds
        // SLOT_MAX payload bytes; the stamp, stored last, hands it over.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), data, buf.len()) };
        head.len.store(buf.len() as u64, Ordering::Relaxed);
        head.stamp.store(seq + 1, Ordering::Release);
        self.sent[peer] = seq + 1;
        true
    }

    fn wait_count(&self, counter: &AtomicU64, want: u64, what: &str) -> Result<()> {
        let start = Instant::now();
        while counter.load(Ordering::Acquire) < want {
            crate::abort::check_abort()?;
            if start.elapsed() > self.timeout {
                bail!(
                    "timed out after {:.0} s waiting for every rank to {what}",
                    self.timeout.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn probe_peers(&self) -> bool {
        let h = self.header();
        (0..self.size).filter(|p| *p != self.rank).all(|p| {
            let mut v = 0u64;
            let pid = h.pids[p].load(Ordering::Acquire) as libc::pid_t;
            let addr = h.probe_addr[p].load(Ordering::Acquire);
            cma_read(
                pid,
                addr,
                std::slice::from_mut(&mut v).as_mut_ptr() as *mut u8,
                8,
            )
            .is_ok()
                && v == 0x5eed + p as u64
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn probe_peers(&self) -> bool {
        false
    }

    fn peer_gone(&self, peer: usize) -> bool {
        let pid = self.header().pids[peer].load(Ordering::Acquire) as libc::pid_t;
        // SAFETY: signal 0 only checks that the process exists.
        pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

#[cfg(target_os = "linux")]
fn cma_read(pid: libc::pid_t, remote: u64, local: *mut u8, len: usize) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: unsafe { local.add(done) } as *mut _,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut _,
            iov_len: len - done,
        };
        // SAFETY: local points at an exclusive buffer of len bytes; the kernel checks remote.
        let n = unsafe { libc::process_vm_readv(pid, &l, 1, &r, 1, 0) };
        if n <= 0 {
            return Err(if n == 0 {
                std::io::ErrorKind::UnexpectedEof.into()
            } else {
                std::io::Error::last_os_error()
            });
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn cma_read(_pid: libc::pid_t, _remote: u64, _local: *mut u8, _len: usize) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what attach and map_peer_region mapped.
        unsafe {
            for m in &self.maps {
                libc::munmap(m.base as *mut _, m.len);
            }
            libc::munmap(self.base as *mut _, self.len)
        };
    }
}

/// Copies bytes into a ring at stream position `pos`, wrapping at the end.
fn ring_write(data: *mut u8, pos: u64, src: &[u8]) {
    let at = (pos as usize) % RING;
    let first = src.len().min(RING - at);
    // SAFETY: both ranges lie inside the ring; the producer owns [head, tail+RING).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
        std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
    }
}

fn ring_read(data: *mut u8, pos: u64, dst: &mut [u8]) {
    let at = (pos as usize) % RING;
    let first = dst.len().min(RING - at);
    // SAFETY: the consumer owns [tail, head) of the ring.
    unsafe {
        std::ptr::copy_nonoverlapping(data.add(at), dst.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
    }
}

/// Progress of one message through a ring: the record header (length word, and the buffer's
/// address for one-copy messages), then the payload.
struct Pending {
    op: usize,
    peer: usize,
    prefix: [u8; 32],
    prefix_len: usize,
    /// Bytes of prefix + payload moved so far (ring path), or prefix only (one-copy paths).
    done: usize,
    path: Path,
    /// For a one-copy send: the ack count that marks it complete.
    ack_at: u64,
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.timeout = timeout;
        Ok(())
    }

    fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
    }

    /// Buffers beyond a mailbox slot live in shared memory, so a peer copies them out with
    /// one memcpy.
    fn alloc(&mut self, len: usize) -> Result<Buffer> {
        if self.one_copy && len >= MAPPED_MIN {
            if let Ok(b) = Buffer::shared(len) {
                if let Some(r) = b.region() {
                    self.regions.retain(|w| w.strong_count() > 0);
                    self.regions.push(Arc::downgrade(r));
                }
                return Ok(b);
            }
        }
        Ok(Buffer::new(len))
    }

    fn exchange(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.exchange_with(&mut scratch, sends, recvs);
        self.scratch = scratch;
        result
    }
}

impl ShmTransport {
    fn exchange_with(
        &mut self,
        scratch: &mut Scratch,
        sends: &[SendOp],
        recvs: &mut [RecvOp],
    ) -> Result<()> {
        let Scratch { out, inc, blocked } = scratch;
        out.clear();
        inc.clear();
        // Per peer: an earlier message to (or from) it is still entering (leaving) the ring.
        blocked.clear();
        blocked.resize(self.size, false);
        for (i, op) in sends.iter().enumerate() {
            if op.peer >= self.size || op.peer == self.rank {
                bail!("rank {} cannot send to rank {}", self.rank, op.peer);
            }
            let len = op.buf.len();
            let region = if self.one_copy && len >= MAPPED_MIN {
                self.region_of(op.buf)
            } else {
                None
            };
            let mut prefix = [0u8; 32];
            let (path, flag, prefix_len) = match region {
                Some((id, fd, offset)) => {
                    prefix[8..16].copy_from_slice(&id.to_le_bytes());
                    prefix[16..24].copy_from_slice(&(fd as u64).to_le_bytes());
                    prefix[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
                    (Path::Mapped, MAPPED_FLAG, 32)
                }
                None if self.one_copy && len >= CMA_MIN => {
                    prefix[8..16].copy_from_slice(&(op.buf.as_ptr() as u64).to_le_bytes());
                    (Path::Cma, CMA_FLAG, 16)
                }
                None => (Path::Ring, 0, HDR),
            };
            prefix[..8].copy_from_slice(&(op.buf.len() as u64 | flag).to_le_bytes());
            let mut ack_at = 0;
            if path != Path::Ring {
                self.cma_sent[op.peer] += 1;
                ack_at = self.cma_sent[op.peer];
            }
            out.push(Pending {
                op: i,
                peer: op.peer,
                prefix,
                prefix_len,
                done: 0,
                path,
                ack_at,
            });
        }
        for (i, op) in recvs.iter().enumerate() {
            if op.peer >= self.size || op.peer == self.rank {
                bail!("rank {} cannot receive from rank {}", self.rank, op.peer);
            }
            inc.push(Pending {
                op: i,
                peer: op.peer,
                prefix: [0; 32],
                prefix_len: HDR,
                done: 0,
                path: Path::Ring,
                ack_at: 0,
            });
        }
        // Messages to one peer must enter its ring in order; `out`/`inc` are in posting order,
        // so only the first unfinished entry per peer may move.
        // When the wait with no progress began, for the yield/nap phases and the timeout:
        // read only once the busy-wait tries are spent, so the latency path never reads the
        // clock (a few tens of nanoseconds per read, against a 250 ns exchange).
        let mut idle_since: Option<Instant> = None;
        let mut idle_spins = 0u32;
        loop {
            let mut progressed = false;
            let mut all_done = true;
            blocked.fill(false);
            for p in out.iter_mut() {
                if p.done == usize::MAX {
                    continue;
                }
                all_done = false;
                let (ctl, data) = self.ring(self.rank, p.peer);
                let payload: &[u8] = if p.path == Path::Ring {
                    sends[p.op].buf
                } else {
                    &[]
                };
                let total = p.prefix_len + payload.len();
                if p.done < total {
                    // A later message to this peer may not enter the ring before this one.
                    if blocked[p.peer] {
                        continue;
                    }
                    blocked[p.peer] = true;
                    if p.done == 0
                        && p.path == Path::Ring
                        && payload.len() <= SLOT_MAX
                        && self.try_slot_send(p.peer, payload)
                    {
                        blocked[p.peer] = false;
                        p.done = usize::MAX;
                        progressed = true;
                        continue;
                    }
                    let head = ctl.head.load(Ordering::Relaxed);
                    let mut space = RING - (head - self.tail_seen[p.peer]) as usize;
                    if space < total - p.done {
                        let tail = ctl.tail.load(Ordering::Acquire);
                        self.tail_seen[p.peer] = tail;
                        space = RING - (head - tail) as usize;
                    }
                    let n = space.min(total - p.done);
                    if n > 0 {
                        if p.done == 0 {
                            // It takes the ring: that is where the receiver will find it.
                            self.sent[p.peer] += 1;
                        }
                        let mut pos = head;
                        let mut moved = 0;
                        if p.done < p.prefix_len {
                            let m = n.min(p.prefix_len - p.done);
                            ring_write(data, pos, &p.prefix[p.done..p.done + m]);
                            pos += m as u64;
                            moved += m;
                        }
                        if moved < n {
                            let from = p.done + moved - p.prefix_len;
                            ring_write(data, pos, &payload[from..from + (n - moved)]);
                        }
                        ctl.head.store(head + n as u64, Ordering::Release);
                        p.done += n;
                        progressed = true;
                    }
                    if p.done == total {
                        blocked[p.peer] = false;
                    }
                }
                if p.done >= total
                    && (p.path == Path::Ring || ctl.acks.load(Ordering::Acquire) >= p.ack_at)
                {
                    p.done = usize::MAX;
                    progressed = true;
                }
            }
            blocked.fill(false);
            for p in inc.iter_mut() {
                if p.done == usize::MAX {
                    continue;
                }
                all_done = false;
                if blocked[p.peer] {
                    continue;
                }
                blocked[p.peer] = true;
                let (ctl, data) = self.ring(p.peer, self.rank);
                let buf = &mut *recvs[p.op].buf;
                let tail = ctl.tail.load(Ordering::Relaxed);
                let head = ctl.head.load(Ordering::Acquire);
                let mut avail = (head - tail) as usize;
                if p.done == 0 {
                    // Message `seq` is in its slot or in the ring. The head is read first: the
                    // sender stamps a slot before it starts any later message, so if the ring
                    // holds bytes and the slot no stamp, those bytes are this message.
                    let seq = self.received[p.peer];
                    let (slot, payload) = self.slot(p.peer, self.rank, seq);
                    if slot.stamp.load(Ordering::Acquire) == seq + 1 {
                        let len = slot.len.load(Ordering::Relaxed);
                        if len > SLOT_MAX as u64 {
                            bail!(
                                "{} left a mailbox slot claiming {len} bytes, more than a slot \
                                 holds: the shared-memory segment is corrupt",
                                self.names[p.peer]
                            );
                        }
                        if len != buf.len() as u64 {
                            return Err(self.size_mismatch(p.peer, len, buf.len()));
                        }
                        // SAFETY: the stamp says the sender wrote len <= SLOT_MAX bytes here;
                        // it does not touch the slot again until `received` passes seq.
                        buf.copy_from_slice(unsafe {
                            std::slice::from_raw_parts(payload, buf.len())
                        });
                        self.took_message(ctl, p.peer);
                        p.done = usize::MAX;
                        blocked[p.peer] = false;
                        progressed = true;
                        continue;
                    }
                }
                if avail == 0 {
                    continue;
                }
                let mut pos = tail;
                while p.done < p.prefix_len && avail > 0 {
                    let m = avail.min(p.prefix_len - p.done);
                    ring_read(data, pos, &mut p.prefix[p.done..p.done + m]);
                    pos += m as u64;
                    avail -= m;
                    p.done += m;
                    if p.done == HDR && p.prefix_len == HDR {
                        // The length word is in: it says how the rest travels.
                        let word = u64::from_le_bytes(p.prefix[..8].try_into().unwrap_or_default());
                        let len = word & !(CMA_FLAG | MAPPED_FLAG);
                        if len != buf.len() as u64 {
                            return Err(self.size_mismatch(p.peer, len, buf.len()));
                        }
                        (p.path, p.prefix_len) = if word & MAPPED_FLAG != 0 {
                            (Path::Mapped, 32)
                        } else if word & CMA_FLAG != 0 {
                            (Path::Cma, 16)
                        } else {
                            (Path::Ring, HDR)
                        };
                    }
                }
                if p.done >= p.prefix_len && p.path == Path::Ring {
                    let from = p.done - p.prefix_len;
                    let m = avail.min(buf.len() - from);
                    ring_read(data, pos, &mut buf[from..from + m]);
                    pos += m as u64;
                    p.done += m;
                }
                ctl.tail.store(pos, Ordering::Release);
                progressed = true;
                let word = |i: usize| {
                    u64::from_le_bytes(p.prefix[i..i + 8].try_into().unwrap_or_default())
                };
                if p.done >= p.prefix_len && p.path != Path::Ring {
                    if p.path == Path::Mapped {
                        let (id, fd, offset) = (word(8), word(16) as i32, word(24) as usize);
                        let src = self.map_peer_region(p.peer, id, fd, offset + buf.len())?;
                        // SAFETY: the mapping covers offset + len bytes (checked when mapped);
                        // the sender does not touch the buffer until our ack.
                        buf.copy_from_slice(unsafe {
                            std::slice::from_raw_parts(src.add(offset), buf.len())
                        });
                    } else {
                        let pid = self.header().pids[p.peer].load(Ordering::Acquire) as libc::pid_t;
                        cma_read(pid, word(8), buf.as_mut_ptr(), buf.len()).map_err(|e| {
                            anyhow!(
                                "cannot read {}'s message from its memory: {e}",
                                self.names[p.peer]
                            )
                        })?;
                    }
                    ctl.acks.fetch_add(1, Ordering::AcqRel);
                    self.took_message(ctl, p.peer);
                    p.done = usize::MAX;
                    blocked[p.peer] = false;
                } else if p.done == p.prefix_len + buf.len() {
                    self.took_message(ctl, p.peer);
                    p.done = usize::MAX;
                    blocked[p.peer] = false;
                }
            }
            if all_done {
                return Ok(());
            }
            if progressed {
                idle_since = None;
                idle_spins = 0;
                continue;
            }
            idle_spins += 1;
            // Spin briefly (the latency path), then yield so oversubscribed ranks still run,
            // then, once a wait has lasted a couple of milliseconds (another rank computing,
            // a barrier), sleep in short naps so idle ranks stop taking cores from busy ones.
            // The yield phase is measured in time, not tries: with more ranks than cores a
            // try can take a whole time slice, and a count would send a rank to sleep while
            // its peer is a microsecond from answering.
            let beside = self.waiting == Waiting::Beside;
            if idle_spins < self.spins && !beside {
                std::hint::spin_loop();
                continue;
            }
            let last_progress = *idle_since.get_or_insert_with(Instant::now);
            if !beside && last_progress.elapsed() < YIELD_BEFORE_NAPS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            if idle_spins.is_multiple_of(1024) {
                let waited = last_progress.elapsed();
                let waiting_on: Vec<usize> = out
                    .iter()
                    .chain(inc.iter())
                    .filter(|p| p.done != usize::MAX)
                    .map(|p| p.peer)
                    .collect();
                if let Some(&dead) = waiting_on.iter().find(|p| self.peer_gone(**p)) {
                    bail!("{} exited while this rank waited for it", self.names[dead]);
                }
                crate::abort::check_abort()?;
                if waited > self.timeout {
                    let mut who: Vec<String> = waiting_on
                        .iter()
                        .map(|p| self.names[*p].to_string())
                        .collect();
                    who.dedup();
                    bail!(
                        "timed out after {:.0} s waiting for {}",
                        self.timeout.as_secs_f64(),
                        who.join(", ")
                    );
                }
            }
        }
    }
}
