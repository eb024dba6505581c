//! RDMA verbs: `--transport verbs`.
//!
//! Two profiles (see [`profile`]): macOS's Thunderbolt RDMA (UC queue pairs, SEND/RECV only,
//! path MTU 1024, IPv4-mapped GIDs) and Linux rdma-core (RC queue pairs, RDMA WRITE with
//! immediate), for InfiniBand and RoCE. The library is loaded at run time ([`ffi`]).
//!
//! Every peer gets two queue pairs: one for data and one for control. Before data moves, the
//! receiver posts its receives and then tells the sender, over the control queue pair, which
//! chunks it is ready for (size, and on Linux where they live). The sender sends a chunk only
//! against such a notice. This is what UC needs (a SEND that finds no posted RECV is dropped
//! without a trace, and a RECV must be exactly the SEND's size in frames) and what RDMA WRITE
//! needs (the target address); it also lets the sender name both sizes when a receive was
//! posted with the wrong one. Control receives all have one size (one frame), so their order
//! never matters and they can stay posted.
//!
//! Small messages (up to [`EAGER_MAX`] bytes, the latency path) skip the notice: the sender
//! copies them into one control SEND, which lands in a control receive the receiver keeps
//! posted, so a small message costs one SEND. The sender holds credits for those receives
//! (a share of them per peer) and spends one per message; the receiver returns credits in the
//! header of whatever control message it sends next, or in a credit message once half are
//! owed, so no eager SEND ever finds no receive posted. Every message carries its number in
//! the pair's order, so a receive whose size class differs from the message sent is caught.
//!
//! Liveness: UC reports nothing when the peer dies, it just stops delivering. The rendezvous's
//! TCP control channel and its heartbeats stay the liveness check for every transport; the
//! timeout here only bounds a wait on a peer that is alive but silent.
//!
//! On one network each rank opens one device (by name, mapped from `--iface`, or the first
//! listed) and uses port 1. Over links (`--over verbs:links`, a Thunderbolt mesh or ring) it
//! opens the device of each cable (the hostfile's `rdma`, else the cable's interface's) with a
//! completion queue each, puts each peer's queue pairs on its cable's device, registers every
//! buffer with every device, and polls every completion queue; the queue pair numbers travel in
//! the rendezvous' second round, once the cables are known. A peer with no cable gets no queue
//! pairs (the small collectives go along the cables: `comm::cables`). A pair with several
//! cables (two between neighbours) gets queue pairs on each cable's device, a lane each:
//! internally every lane is a peer of its own (a "channel"), and a message from
//! [`super::tcp::STRIPE_MIN`] bytes is cut into one piece per lane by the lanes' rates, timed
//! when the run opens (`VerbsTransport::weigh_lanes`), as jaccl-ring stripes over cables.
//!
//! Files: `opening.rs` which devices and queue pairs a rank makes and publishes; `resources.rs`
//! the verbs objects it holds; `wire.rs` the control messages' kinds and sizes; [`handshake`]
//! what travels at the rendezvous; [`profile`] the two platforms' rules; [`ffi`] the library;
//! this file the transport itself (connecting, exchanging, weighing lanes).

pub mod devices;
pub mod ffi;
pub mod handshake;
mod opening;
pub mod profile;
mod resources;
mod wire;

use super::{Buffer, OpenPlan, Opened, Opening, Peers, RecvOp, SendOp, Transport, Waiting};
use crate::netinfo;
use crate::session::{PeerName, RankInfo};
use anyhow::{anyhow, bail, Result};
use ffi::*;
use handshake::{Hello, PeerQps};
use profile::{DataOp, Local, Platform, Profile};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opening::*;
pub use opening::{prepare, PeerDevice, Prepared, VerbsOpening};
use resources::*;
pub use wire::EAGER_MAX;
use wire::*;

/// What the driver knows when it opens the transport.
#[derive(Debug, Clone, Default)]
pub struct VerbsOptions {
    /// `--rdma-device`.
    pub device: Option<String>,
    /// `--iface`: picks the device when none is named, and (macOS, RoCE) the GID.
    pub iface: Option<String>,
    /// This rank's data address, when it has a routable one.
    pub ip: Option<Ipv4Addr>,
    pub timeout: Duration,
    /// The verbs library; the platform's own when None.
    pub library: Option<String>,
    /// The run's secret and the address this rank listens on, for a library that takes them
    /// (the software device: see `Lib::join_run`). Hardware needs neither.
    pub run: Option<([u8; 16], Option<Ipv4Addr>)>,
    /// Per rank, the device its queue pairs go on (over links: its cable's); None puts every
    /// peer on the one device the options pick.
    pub per_peer: Option<Vec<PeerDevice>>,
    /// Over links, the further cables of pairs with several, in cable order: (rank, device).
    pub extra_lanes: Vec<(usize, PeerDevice)>,
}

/// What the result file records about the RDMA link.
#[derive(Debug, Clone)]
pub struct VerbsInfo {
    /// The device, or the devices joined by commas.
    pub device: String,
    /// Every device opened, in the order of the first peer on each.
    pub devices: Vec<String>,
    pub port: u8,
    pub iface: Option<String>,
    pub mtu_bytes: u32,
    pub link_layer: &'static str,
    pub profile: &'static str,
    /// The device is tbbench's software stand-in: its figures are never RDMA measurements.
    pub emulated: bool,
}

impl Prepared {
    /// The connection data to publish at the rendezvous.
    pub fn hello(&self) -> String {
        self.hello.encode()
    }

    pub fn info(&self) -> &VerbsInfo {
        &self.info
    }

    /// Brings every queue pair to RTS against the peers' published data, posts the control
    /// receives, and waits until every peer has done the same.
    pub fn connect(
        self,
        hellos: &[Option<String>],
        names: Vec<PeerName>,
    ) -> Result<VerbsTransport> {
        let Prepared {
            rank,
            size,
            profile,
            chunk_limit: my_chunk_limit,
            qps,
            chan_rank,
            hello: _,
            mut info,
            timeout,
            ports,
        } = self;
        let chans = qps.len();
        // Each peer's published data, read once.
        let mut theirs: Vec<Option<Hello>> = Vec::with_capacity(size);
        for p in 0..size {
            if qps[p].is_none() {
                theirs.push(None);
                continue;
            }
            let text = hellos.get(p).cloned().flatten().ok_or_else(|| {
                anyhow!("transport verbs: {} published no RDMA connection data (its device did not open)", names[p])
            })?;
            let h = Hello::decode(&text, size).map_err(|e| {
                anyhow!(
                    "transport verbs: bad RDMA connection data from {}: {e}",
                    names[p]
                )
            })?;
            if h.platform != profile.platform {
                bail!("transport verbs: {} runs the other platform's RDMA profile; macOS and Linux ranks cannot share a verbs run", names[p]);
            }
            let mine = chan_rank.iter().filter(|&&r| r == p).count();
            // Striping cuts a message by the lanes both ends have: they must have the same.
            if (h.lanes_for(rank) > 1 || mine > 1) && h.lanes_for(rank) != mine {
                bail!(
                    "transport verbs: {} made queue pairs on {} cable(s) to rank {rank}, this rank on {mine}: the two ends read the cabling differently",
                    names[p],
                    h.lanes_for(rank)
                );
            }
            theirs.push(Some(h));
        }
        // A further cable's channel is named after its rank and the cable.
        let mut names = names;
        for ch in size..chans {
            let p = chan_rank[ch];
            let host = format!("{}, cable {}", names[p].host, lane_of(&chan_rank, ch) + 1);
            names.push(PeerName { rank: p, host });
        }
        let mut chunk_limit = vec![my_chunk_limit; chans];
        let mut mtus: Vec<u32> = Vec::new();
        let mut remotes = Vec::with_capacity(chans);
        for ch in 0..chans {
            let Some((_, _, at)) = qps[ch] else {
                remotes.push(None);
                continue;
            };
            let h = theirs[chan_rank[ch]].as_ref().expect("read above");
            let lane = lane_of(&chan_rank, ch);
            let (d, c) = h.remotes_for(rank, lane).ok_or_else(|| {
                anyhow!(
                    "transport verbs: {} published no queue pair for rank {rank}",
                    names[ch]
                )
            })?;
            chunk_limit[ch] = chunk_limit[ch].min(h.max_chunk as usize);
            let their_mtu = h.mtu_for(rank, lane).unwrap_or(h.mtu);
            let mtu = profile::path_mtu(&profile, ports[at].mtu, their_mtu);
            mtus.push(mtu);
            remotes.push(Some((d, c, mtu)));
        }
        for (p, r) in remotes.iter().enumerate() {
            let (Some((rd, rc, mtu)), Some((d, c, at))) = (r, qps[p]) else {
                continue;
            };
            let port = &ports[at];
            for (qp, remote) in [(d, rd), (c, rc)] {
                let local = Local {
                    port: port.port,
                    gid_index: port.gid_index,
                    psn: qp.psn,
                };
                let (mut a, m) = profile::rtr_attr(&profile, &local, remote, *mtu);
                modify(&port.dev.lib, qp.raw, &mut a, m, "RTR", &port.dev.name)?;
                let (mut a, m) = profile::rts_attr(&profile, &local);
                modify(&port.dev.lib, qp.raw, &mut a, m, "RTS", &port.dev.name)?;
            }
        }
        let recv_slots = qps
            .iter()
            .flatten()
            .map(|(_, c, _)| c.recv_depth)
            .min()
            .unwrap_or(CTL_RECV_SLOTS)
            .clamp(CTL_SPARE + CREDIT_MSGS + 2, CTL_RECV_SLOTS) as usize;
        // The control receives for one peer hold its notices, its eager messages, its credit
        // messages and greetings: each gets its own share, so none can find them all taken.
        // Both ends compute the same shares, as the notices always assumed: one kind of device
        // grants every rank the same depth (a rank's cables' devices are of one kind too).
        let eager_credits = (recv_slots as u32 - CTL_SPARE - CREDIT_MSGS) / 2;
        let notices = recv_slots as u32 - CTL_SPARE - CREDIT_MSGS - eager_credits;
        let per_peer = (recv_slots + CTL_SEND_SLOTS) * CTL_SLOT;
        let mut ctl_buf = Buffer::new(per_peer * chans);
        let devs: Vec<Arc<Device>> = ports.iter().map(|p| p.dev.clone()).collect();
        let ctl_mrs = register_on_all(
            &devs,
            ctl_buf.as_mut_ptr(),
            ctl_buf.len(),
            IBV_ACCESS_LOCAL_WRITE,
        )?;
        if let Some(mtu) = mtus.iter().min() {
            info.mtu_bytes = profile::mtu_bytes(*mtu);
        }
        let peers = (0..chans)
            .map(|p| {
                qps[p].map(|(d, c, at)| Peer {
                    data: d.raw,
                    ctl: c.raw,
                    dev: at,
                    chunk_limit: chunk_limit[p],
                    sq_free: d.send_depth,
                    rq_free: d.recv_depth,
                    rq_chunks_free: notices,
                    eager_credits,
                    credits_owed: 0,
                    eager_in: VecDeque::new(),
                    send_seq: 0,
                    recv_seq: 0,
                    ctl_send_free: (0..CTL_SEND_SLOTS.min(c.send_depth as usize)).collect(),
                    ctl_send_slots: CTL_SEND_SLOTS.min(c.send_depth as usize),
                    ready: VecDeque::new(),
                    pending_ready: Vec::new(),
                    hello_reply: false,
                    seen_theirs: false,
                    they_saw_mine: false,
                })
            })
            .collect();
        let lib = ports[0].dev.lib.clone();
        let mut lanes: Vec<Vec<usize>> = vec![Vec::new(); size];
        for (ch, q) in qps.iter().enumerate() {
            if q.is_some() {
                lanes[chan_rank[ch]].push(ch);
            }
        }
        let mut t = VerbsTransport {
            rank,
            size,
            lanes,
            weights: vec![Vec::new(); size],
            profile,
            names,
            timeout,
            info,
            peers,
            recv_slots,
            per_peer,
            credit_batch: eager_credits.div_ceil(2),
            queues: ports.into_iter().map(|p| p.queues).collect(),
            ctl_mrs,
            ctl_buf,
            staging: None,
            registry: Arc::new(Mutex::new(Vec::new())),
            wcs: vec![IbvWc::default(); 64],
            waiting: Waiting::Spin,
            devs,
            lib,
        };
        // Receives only now, with every queue pair in RTS: Apple's stack drops receives posted
        // earlier.
        for p in 0..chans {
            if t.peers[p].is_some() {
                for s in 0..recv_slots {
                    t.post_ctl_recv(p, s)?;
                }
            }
        }
        t.greet()?;
        t.weigh_lanes()?;
        Ok(t)
    }
}

/// One receive chunk a peer was told about: where it may land and the whole message's size.
#[derive(Debug, Clone, Copy)]
struct ReadyEntry {
    addr: u64,
    rkey: u32,
    len: u32,
    msg_len: u64,
    /// The message's number in this pair's order.
    seq: u64,
}

/// A small message that arrived in a control receive, held there until a receive takes it.
#[derive(Debug, Clone, Copy)]
struct EagerIn {
    slot: usize,
    len: usize,
    seq: u64,
}

struct Peer {
    data: *mut IbvQp,
    ctl: *mut IbvQp,
    /// The device (index into the transport's `devs`) its queue pairs are on.
    dev: usize,
    /// Both ends cut messages at this size.
    chunk_limit: usize,
    /// Data queue depth left, in the profile's cost units.
    sq_free: u32,
    rq_free: u32,
    /// Data receives that may still be announced: each announcement may sit in one of the
    /// peer's control receives until it polls, so their number is bounded by those.
    rq_chunks_free: u32,
    ctl_send_free: VecDeque<usize>,
    /// Control send slots in all: every one is free again once all sends have completed.
    ctl_send_slots: usize,
    /// Receive chunks the peer announced and this rank has not used yet. They may belong to a
    /// later exchange: a receiver can be ahead.
    ready: VecDeque<ReadyEntry>,
    /// Posted here, not yet announced.
    pending_ready: Vec<ReadyEntry>,
    hello_reply: bool,
    seen_theirs: bool,
    they_saw_mine: bool,
    /// Eager messages this rank may still send: control receives the peer holds for them.
    eager_credits: u32,
    /// Eager messages taken here whose receive is posted again, not yet told to the peer.
    credits_owed: u32,
    /// Eager messages arrived and not yet taken, in order.
    eager_in: VecDeque<EagerIn>,
    /// Numbers of the next message sent to and received from the peer.
    send_seq: u64,
    recv_seq: u64,
}

struct Staging {
    /// One registration per device, in the transport's device order.
    mrs: Vec<Mr>,
    buf: Buffer,
}

pub struct VerbsTransport {
    rank: usize,
    size: usize,
    /// Per rank, its channels (indices into `peers`) in cable order: one for a pair with one
    /// cable, none for itself or a rank with no cable.
    lanes: Vec<Vec<usize>>,
    /// Per rank with several lanes, each lane's share of a striped message (its measured rate,
    /// kB/s); empty: equal shares.
    weights: Vec<Vec<u64>>,
    profile: Profile,
    names: Vec<PeerName>,
    timeout: Duration,
    info: VerbsInfo,
    /// Per channel: each rank's first cable in rank order, then further cables.
    peers: Vec<Option<Peer>>,
    recv_slots: usize,
    per_peer: usize,
    /// Owed credits worth a message of their own.
    credit_batch: u32,
    // Dropped in this order: queue pairs before the memory they used, all before the devices.
    /// Per device: its completion queue and the queue pairs on it.
    queues: Vec<Queues>,
    /// The control buffer's registration on each device.
    ctl_mrs: Vec<Mr>,
    ctl_buf: Buffer,
    staging: Option<Staging>,
    registry: Registry,
    wcs: Vec<IbvWc>,
    /// Beside a computation ([`Waiting::Beside`]) an idle poll naps at once.
    waiting: Waiting,
    /// The devices: one, or one per cable the rank's peers are on.
    devs: Vec<Arc<Device>>,
    lib: Arc<Lib>,
}

// Raw verbs handles, used only through &mut self.
unsafe impl Send for VerbsTransport {}

/// How long a closing transport waits for its last control sends to leave.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

impl Drop for VerbsTransport {
    /// A device flushes, unsent, the work still queued on a queue pair it destroys. An eager
    /// message is done for the exchange once copied into its control frame, so the last one
    /// of a run (a barrier's) may still be queued here while its peer waits for it: the
    /// control sends' completions are awaited before the queue pairs go.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.timeout.min(CLOSE_DRAIN);
        let mut data = Vec::new();
        while self
            .peers
            .iter()
            .flatten()
            .any(|x| x.ctl_send_free.len() < x.ctl_send_slots)
            && Instant::now() < deadline
        {
            data.clear();
            match self.poll(&mut data) {
                Ok(0) => std::thread::sleep(Duration::from_micros(50)),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}

/// Where one message's bytes are for the device.
#[derive(Clone, Copy)]
struct Mem {
    addr: u64,
    lkey: u32,
    rkey: u32,
}

/// Where one message's bytes go through.
enum Place {
    /// In a control message, copied.
    Eager,
    /// In place: registered memory.
    Registered(Mem),
    /// Through the staging buffer, at this offset.
    Staged(usize),
}

struct SendMsg {
    addr: u64,
    lkey: u32,
    len: usize,
    off: usize,
    seq: u64,
    /// Sent in one control message (the bytes are copied from `addr` when posted).
    eager: bool,
}

#[derive(Clone, Copy)]
struct RecvChunk {
    addr: u64,
    lkey: u32,
    rkey: u32,
    len: usize,
    msg_len: usize,
    seq: u64,
}

/// A small receive, filled from an eager message.
struct EagerRecv {
    addr: *mut u8,
    len: usize,
    seq: u64,
}

impl VerbsTransport {
    pub fn info(&self) -> &VerbsInfo {
        &self.info
    }

    fn peer(&mut self, p: usize) -> &mut Peer {
        self.peers[p].as_mut().expect("a peer other than self")
    }

    /// The device (index into `devs`) peer `p`'s queue pairs are on.
    fn dev_of(&self, p: usize) -> usize {
        self.peers[p].as_ref().map_or(0, |x| x.dev)
    }

    fn ctl_addr(&self, p: usize, slot: usize) -> u64 {
        self.ctl_buf.as_ptr() as u64 + (p * self.per_peer + slot * CTL_SLOT) as u64
    }

    fn post_ctl_recv(&mut self, p: usize, slot: usize) -> Result<()> {
        let mut sge = IbvSge {
            addr: self.ctl_addr(p, slot),
            length: CTL_SLOT as u32,
            lkey: self.ctl_mrs[self.dev_of(p)].lkey(),
        };
        let mut wr = IbvRecvWr {
            wr_id: wr_id(K_CTL_RECV, p, slot as u64),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let qp = self.peer(p).ctl;
        // SAFETY: the slot lies in the registered control buffer, alive as long as self.
        let rc = unsafe { post_recv(qp, &mut wr) };
        if rc != 0 {
            bail!(
                "transport verbs: cannot post a control receive for {}: {}",
                self.names[p],
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(())
    }

    /// Sends one control message (the header, then the pieces of `body`) if a send slot is
    /// free. Every one returns the credits owed to the peer.
    fn post_ctl_send(&mut self, p: usize, kind: u32, arg: u32, body: &[&[u8]]) -> Result<bool> {
        let Some(slot) = self.peer(p).ctl_send_free.pop_front() else {
            return Ok(false);
        };
        let credits = std::mem::take(&mut self.peer(p).credits_owed);
        let addr = self.ctl_addr(p, self.recv_slots + slot);
        let len = CTL_HDR + body.iter().map(|b| b.len()).sum::<usize>();
        debug_assert!(len <= CTL_SLOT);
        // SAFETY: the slot is CTL_SLOT bytes of the control buffer, not in flight (it was free).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(addr as *mut u8, len);
            dst[0..4].copy_from_slice(&kind.to_le_bytes());
            dst[4..8].copy_from_slice(&arg.to_le_bytes());
            dst[8..12].copy_from_slice(&credits.to_le_bytes());
            dst[12..16].fill(0);
            let mut at = CTL_HDR;
            for piece in body {
                dst[at..at + piece.len()].copy_from_slice(piece);
                at += piece.len();
            }
        }
        let mut sge = IbvSge {
            addr,
            length: len as u32,
            lkey: self.ctl_mrs[self.dev_of(p)].lkey(),
        };
        let mut wr = IbvSendWr::zeroed();
        wr.wr_id = wr_id(K_CTL_SEND, p, slot as u64);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        let qp = self.peer(p).ctl;
        // SAFETY: as in post_ctl_recv.
        let rc = unsafe { post_send(qp, &mut wr) };
        if rc != 0 {
            bail!(
                "transport verbs: cannot post a control send to {}: {}",
                self.names[p],
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(true)
    }

    /// Announces posted receive chunks and answers greetings, as far as send slots allow.
    fn flush_ctl(&mut self, p: usize) -> Result<bool> {
        let mut did = false;
        if self.peer(p).hello_reply {
            let arg = if self.peer(p).they_saw_mine {
                HELLO_DONE
            } else {
                HELLO_SEEN
            };
            if !self.post_ctl_send(p, MSG_HELLO, arg, &[])? {
                return Ok(did);
            }
            self.peer(p).hello_reply = false;
            did = true;
        }
        while !self.peer(p).pending_ready.is_empty() {
            let n = self.peer(p).pending_ready.len().min(READY_MAX);
            let mut body = Vec::with_capacity(n * READY_ENTRY);
            for e in &self.peer(p).pending_ready[..n] {
                body.extend_from_slice(&e.addr.to_le_bytes());
                body.extend_from_slice(&e.rkey.to_le_bytes());
                body.extend_from_slice(&e.len.to_le_bytes());
                body.extend_from_slice(&e.msg_len.to_le_bytes());
                body.extend_from_slice(&e.seq.to_le_bytes());
            }
            if !self.post_ctl_send(p, MSG_READY, n as u32, &[&body])? {
                break;
            }
            self.peer(p).pending_ready.drain(..n);
            did = true;
        }
        // Credits nobody's message carried back: once half are owed, a message of their own,
        // so a sender streaming small messages never waits on them.
        if self.peer(p).credits_owed >= self.credit_batch
            && self.post_ctl_send(p, MSG_CREDIT, 0, &[])?
        {
            did = true;
        }
        Ok(did)
    }

    /// Reads one control message that arrived in `slot`, then posts the slot again.
    fn on_ctl_recv(&mut self, p: usize, slot: usize, byte_len: usize) -> Result<()> {
        let addr = self.ctl_addr(p, slot);
        // SAFETY: the completion says the device is done writing the slot.
        let msg = unsafe { std::slice::from_raw_parts(addr as *const u8, byte_len.min(CTL_SLOT)) };
        if msg.len() < CTL_HDR {
            bail!(
                "transport verbs: a control message of {} bytes from {}",
                msg.len(),
                self.names[p]
            );
        }
        let kind = u32::from_le_bytes(msg[0..4].try_into().expect("4 bytes"));
        let arg = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes"));
        let credits = u32::from_le_bytes(msg[8..12].try_into().expect("4 bytes"));
        self.peer(p).eager_credits += credits;
        match kind {
            MSG_READY => {
                let n = arg as usize;
                if msg.len() < CTL_HDR + n * READY_ENTRY {
                    bail!(
                        "transport verbs: a truncated ready notice from {}",
                        self.names[p]
                    );
                }
                let mut entries = Vec::with_capacity(n);
                for i in 0..n {
                    let e = &msg[CTL_HDR + i * READY_ENTRY..CTL_HDR + (i + 1) * READY_ENTRY];
                    entries.push(ReadyEntry {
                        addr: u64::from_le_bytes(e[0..8].try_into().expect("8 bytes")),
                        rkey: u32::from_le_bytes(e[8..12].try_into().expect("4 bytes")),
                        len: u32::from_le_bytes(e[12..16].try_into().expect("4 bytes")),
                        msg_len: u64::from_le_bytes(e[16..24].try_into().expect("8 bytes")),
                        seq: u64::from_le_bytes(e[24..32].try_into().expect("8 bytes")),
                    });
                }
                self.peer(p).ready.extend(entries);
            }
            MSG_EAGER => {
                let len = arg as usize;
                if len > EAGER_MAX || msg.len() != CTL_HDR + 8 + len {
                    bail!(
                        "transport verbs: a small message of {} bytes saying {len} from {}",
                        msg.len(),
                        self.names[p]
                    );
                }
                let seq = u64::from_le_bytes(msg[CTL_HDR..CTL_HDR + 8].try_into().expect("8"));
                // The bytes stay in the slot until a receive takes them; the slot is posted
                // again then.
                self.peer(p).eager_in.push_back(EagerIn { slot, len, seq });
                return Ok(());
            }
            MSG_CREDIT => {}
            MSG_HELLO => {
                let peer = self.peer(p);
                peer.seen_theirs = true;
                if arg >= HELLO_SEEN {
                    peer.they_saw_mine = true;
                }
                if arg < HELLO_DONE {
                    peer.hello_reply = true;
                }
            }
            other => bail!(
                "transport verbs: an unknown control message ({other}) from {}",
                self.names[p]
            ),
        }
        self.post_ctl_recv(p, slot)
    }

    /// Polls once. Control completions are handled here; data completions are returned as
    /// (kind, peer, cost, wc) for the exchange in progress.
    fn poll(&mut self, data: &mut Vec<(u64, usize, u64, IbvWc)>) -> Result<usize> {
        let mut total = 0;
        for d in 0..self.queues.len() {
            total += self.poll_one(d, data)?;
        }
        Ok(total)
    }

    /// Polls device `d`'s completion queue once.
    fn poll_one(&mut self, d: usize, data: &mut Vec<(u64, usize, u64, IbvWc)>) -> Result<usize> {
        let mut wcs = std::mem::take(&mut self.wcs);
        // SAFETY: the CQ is live; wcs has room for its length.
        let n = unsafe { poll_cq(self.queues[d].cq, &mut wcs) };
        if n < 0 {
            self.wcs = wcs;
            bail!(
                "transport verbs: polling the completion queue of {} failed ({n})",
                self.devs[d].name
            );
        }
        let mut result = Ok(n as usize);
        for wc in &wcs[..n as usize] {
            let (kind, p, low) = split_wr_id(wc.wr_id);
            if self.peers.get(p).is_none_or(|x| x.is_none()) {
                result = Err(anyhow!(
                    "transport verbs: a completion for an unknown queue pair"
                ));
                break;
            }
            if wc.status != IBV_WC_SUCCESS {
                let what = match kind {
                    K_DATA_SEND => "sending data to",
                    K_DATA_RECV => "receiving data from",
                    K_CTL_SEND => "sending a control message to",
                    _ => "receiving a control message from",
                };
                result = Err(anyhow!(
                    "transport verbs: {what} {} failed: {} (vendor error {:#x})",
                    self.names[p],
                    self.lib.status_str(wc.status),
                    wc.vendor_err
                ));
                break;
            }
            let r = match kind {
                K_CTL_SEND => {
                    self.peer(p).ctl_send_free.push_back(low as usize);
                    Ok(())
                }
                K_CTL_RECV => self.on_ctl_recv(p, low as usize, wc.byte_len as usize),
                K_DATA_SEND => {
                    self.peer(p).sq_free += low as u32;
                    data.push((kind, p, low, *wc));
                    Ok(())
                }
                _ => {
                    let peer = self.peer(p);
                    peer.rq_free += low as u32;
                    peer.rq_chunks_free += 1;
                    data.push((kind, p, low, *wc));
                    Ok(())
                }
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        self.wcs = wcs;
        result
    }

    /// Waits until every peer has its control receives posted and knows this rank has too.
    /// Until then a notice could reach a peer with nothing posted, which UC would drop.
    fn greet(&mut self) -> Result<()> {
        let start = Instant::now();
        let mut last_sent: Option<Instant> = None;
        let mut data = Vec::new();
        loop {
            let waiting: Vec<usize> = (0..self.peers.len())
                .filter(|p| self.peers[*p].as_ref().is_some_and(|x| !x.they_saw_mine))
                .collect();
            if waiting.is_empty() {
                // Answer anyone who has not heard that this rank saw them; later answers go
                // out from exchange.
                for p in 0..self.peers.len() {
                    if self.peers[p].is_some() {
                        self.flush_ctl(p)?;
                    }
                }
                return Ok(());
            }
            if !matches!(last_sent, Some(t) if t.elapsed() <= Duration::from_millis(5)) {
                for &p in &waiting {
                    let seen = if self.peer(p).seen_theirs {
                        HELLO_SEEN
                    } else {
                        HELLO_UNSEEN
                    };
                    // A greeting answers one received, too.
                    if self.post_ctl_send(p, MSG_HELLO, seen, &[])? {
                        self.peer(p).hello_reply = false;
                    }
                }
                last_sent = Some(Instant::now());
            }
            for p in 0..self.peers.len() {
                if self.peers[p].is_some() {
                    self.flush_ctl(p)?;
                }
            }
            let n = self.poll(&mut data)?;
            if !data.is_empty() {
                bail!("transport verbs: data arrived before the queue pairs were connected");
            }
            if n == 0 {
                // Greetings go out every 5 ms; nothing to spin for in between.
                std::thread::sleep(Duration::from_micros(100));
            }
            crate::abort::check_abort()?;
            if start.elapsed() > self.timeout {
                let who: Vec<String> = waiting.iter().map(|p| self.names[*p].to_string()).collect();
                bail!(
                    "transport verbs: no answer over RDMA from {} within {:.0} s on {} (are both ends on the same link? is the Thunderbolt Bridge off?)",
                    who.join(", "),
                    self.timeout.as_secs_f64(),
                    self.info.device
                );
            }
        }
    }

    /// The keys on device `dev` of registered memory holding `ptr..ptr+len`.
    fn lookup(&self, ptr: *const u8, len: usize, dev: usize) -> Option<Mem> {
        let start = ptr as usize;
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.iter()
            .find(|x| x.start <= start && start + len <= x.end)
            .map(|x| Mem {
                addr: start as u64,
                lkey: x.keys[dev].0,
                rkey: x.keys[dev].1,
            })
    }

    /// Registered memory of at least `len` bytes for messages in unregistered memory. Grows
    /// by doubling, so a run settles on one registration.
    fn ensure_staging(&mut self, len: usize) -> Result<()> {
        if len == 0 || self.staging.as_ref().is_some_and(|s| s.buf.len() >= len) {
            return Ok(());
        }
        self.staging = None;
        let mut buf = Buffer::new(len.next_power_of_two());
        let mrs = register_on_all(
            &self.devs,
            buf.as_mut_ptr(),
            buf.len(),
            self.profile.mr_access,
        )?;
        self.staging = Some(Staging { mrs, buf });
        Ok(())
    }
}

/// Polls spent spinning before a waiting rank gives up its core.
const SPIN_POLLS: u32 = 2048;

/// How a rank waits once nothing has completed for a while: it spins first (an answer over
/// RDMA comes within microseconds), then yields the core, and after a millisecond without
/// progress (a peer computing, or gone) sleeps briefly between polls, so a rank that waits
/// uses a fraction of a core instead of all of it, and the threads of a software device
/// sharing the cores get to run. Beside a computation ([`Waiting::Beside`]) it naps from the
/// first idle poll.
fn idle_wait(idle_polls: u32, last_progress: Instant, waiting: Waiting) {
    let beside = waiting == Waiting::Beside;
    if idle_polls < SPIN_POLLS && !beside {
        return;
    }
    if beside || last_progress.elapsed() > Duration::from_millis(1) {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        std::thread::yield_now();
    }
}

fn align64(x: usize) -> usize {
    (x + 63) & !63
}

impl Transport for VerbsTransport {
    fn name(&self) -> &'static str {
        "verbs"
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

    /// Registers the memory once, here, so the timed path never registers.
    fn alloc(&mut self, len: usize) -> Result<Buffer> {
        let mut buf = Buffer::new(len);
        if len == 0 {
            return Ok(buf);
        }
        let mrs = register_on_all(&self.devs, buf.as_mut_ptr(), len, self.profile.mr_access)?;
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Reg {
                start: buf.as_ptr() as usize,
                end: buf.as_ptr() as usize + len,
                keys: mrs.iter().map(|m| (m.lkey(), m.rkey())).collect(),
                id: mrs[0].raw as usize,
            });
        Ok(buf.with_guard(Box::new(MrGuard {
            mrs,
            registry: self.registry.clone(),
        })))
    }

    /// Checks the ranks, cuts each message to a rank with several cables into a piece per
    /// lane, and moves the pieces as messages of the lanes' channels.
    fn exchange(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> Result<()> {
        for p in sends
            .iter()
            .map(|o| o.peer)
            .chain(recvs.iter().map(|o| o.peer))
        {
            if p >= self.size || p == self.rank {
                bail!("rank {} cannot exchange with rank {p}", self.rank);
            }
            if self.peers[p].is_none() {
                bail!(
                    "transport verbs: rank {} has no cable to {}, so no queue pairs to it",
                    self.rank,
                    self.names[p]
                );
            }
        }
        if sends.iter().all(|o| self.lanes[o.peer].len() < 2)
            && recvs.iter().all(|o| self.lanes[o.peer].len() < 2)
        {
            return self.exchange_channels(sends, recvs);
        }
        let mut on_lanes: Vec<SendOp> = Vec::with_capacity(sends.len() * 2);
        for op in sends {
            for (lane, lo, n) in self.stripes(op.peer, op.buf.len()) {
                on_lanes.push(SendOp {
                    peer: self.lanes[op.peer][lane],
                    buf: &op.buf[lo..lo + n],
                });
            }
        }
        let mut into_lanes: Vec<RecvOp> = Vec::with_capacity(recvs.len() * 2);
        for op in recvs.iter_mut() {
            let cuts: Vec<(usize, usize, usize)> = self.stripes(op.peer, op.buf.len()).collect();
            let mut rest: &mut [u8] = &mut op.buf[..];
            for (lane, _, n) in cuts {
                let (piece, after) = rest.split_at_mut(n);
                into_lanes.push(RecvOp {
                    peer: self.lanes[op.peer][lane],
                    buf: piece,
                });
                rest = after;
            }
        }
        self.exchange_channels(&on_lanes, &mut into_lanes)
    }
}

impl VerbsTransport {
    /// The pieces of a `len`-byte message to `peer`, as (lane, offset, length): one below
    /// [`super::tcp::STRIPE_MIN`] or on one cable, else one per lane by the lanes' weights.
    /// Both ends compute the same.
    fn stripes(&self, peer: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        super::tcp::stripes(len, self.lanes[peer].len().max(1), &self.weights[peer])
    }

    /// Times each lane of every pair with several and stripes the pair's messages by the rates
    /// found, as the tcp transport weighs a pair's cables: the lower rank sends
    /// [`super::tcp::WEIGH_BYTES`] twice down each lane, timing the second until the higher
    /// rank's 8-byte answer on the same lane, then tells it the weights (kB/s per lane). Pairs go
    /// in one order on every rank (lowest pair first), so no two ranks wait on each other.
    fn weigh_lanes(&mut self) -> Result<()> {
        let me = self.rank;
        let mut order: Vec<usize> = (0..self.size)
            .filter(|&p| self.lanes[p].len() > 1)
            .collect();
        if order.is_empty() {
            return Ok(());
        }
        order.sort_by_key(|&p| (me.min(p), me.max(p)));
        let mut data = self.alloc(super::tcp::WEIGH_BYTES)?;
        let mut ack = [0u8; 8];
        for peer in order {
            let lanes = self.lanes[peer].clone();
            let name = self.names[peer].to_string();
            let ctx = |e: anyhow::Error| anyhow!("timing the cables to {name}: {e}");
            let mut weights = vec![0u64; lanes.len()];
            if me < peer {
                for (w, &ch) in weights.iter_mut().zip(&lanes) {
                    let mut took = 0.0;
                    for _ in 0..2 {
                        let t = Instant::now();
                        self.exchange_channels(
                            &[SendOp {
                                peer: ch,
                                buf: &data,
                            }],
                            &mut [],
                        )
                        .map_err(ctx)?;
                        self.exchange_channels(
                            &[],
                            &mut [RecvOp {
                                peer: ch,
                                buf: &mut ack,
                            }],
                        )
                        .map_err(ctx)?;
                        took = t.elapsed().as_secs_f64();
                    }
                    *w = ((super::tcp::WEIGH_BYTES as f64 / took.max(1e-9) / 1e3) as u64).max(1);
                }
                let msg: Vec<u8> = weights.iter().flat_map(|w| w.to_le_bytes()).collect();
                self.exchange_channels(
                    &[SendOp {
                        peer: lanes[0],
                        buf: &msg,
                    }],
                    &mut [],
                )
                .map_err(ctx)?;
            } else {
                for &ch in &lanes {
                    for _ in 0..2 {
                        self.exchange_channels(
                            &[],
                            &mut [RecvOp {
                                peer: ch,
                                buf: &mut data,
                            }],
                        )
                        .map_err(ctx)?;
                        self.exchange_channels(
                            &[SendOp {
                                peer: ch,
                                buf: &ack,
                            }],
                            &mut [],
                        )
                        .map_err(ctx)?;
                    }
                }
                let mut msg = vec![0u8; 8 * lanes.len()];
                self.exchange_channels(
                    &[],
                    &mut [RecvOp {
                        peer: lanes[0],
                        buf: &mut msg,
                    }],
                )
                .map_err(ctx)?;
                for (w, b) in weights.iter_mut().zip(msg.chunks_exact(8)) {
                    *w = u64::from_le_bytes(b.try_into().expect("8 bytes")).max(1);
                }
            }
            self.weights[peer] = weights;
        }
        Ok(())
    }

    /// Each lane's share of a striped message to `peer` (kB/s as timed), where it has several.
    pub fn lane_weights(&self, peer: usize) -> &[u64] {
        &self.weights[peer]
    }

    /// Moves messages between this rank and channels (a rank's first cable, or a further one).
    fn exchange_channels(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> Result<()> {
        let chans = self.peers.len();
        // Small messages go eagerly, copied straight between the caller's buffer and a control
        // frame. Larger ones use registered buffers in place; anything else goes through
        // staging.
        let mut staged = 0usize;
        let mut place = |len: usize, mem: Option<Mem>| -> Place {
            if len <= EAGER_MAX {
                return Place::Eager;
            }
            match mem {
                Some(m) => Place::Registered(m),
                None => {
                    let at = staged;
                    staged = align64(staged + len);
                    Place::Staged(at)
                }
            }
        };
        let send_at: Vec<Place> = sends
            .iter()
            .map(|op| {
                let mem = (op.buf.len() > EAGER_MAX)
                    .then(|| self.lookup(op.buf.as_ptr(), op.buf.len(), self.dev_of(op.peer)))
                    .flatten();
                place(op.buf.len(), mem)
            })
            .collect();
        let recv_at: Vec<Place> = recvs
            .iter()
            .map(|op| {
                let mem = (op.buf.len() > EAGER_MAX)
                    .then(|| self.lookup(op.buf.as_ptr(), op.buf.len(), self.dev_of(op.peer)))
                    .flatten();
                place(op.buf.len(), mem)
            })
            .collect();
        self.ensure_staging(staged)?;
        let stage_mem = |at: usize, s: &Option<Staging>, dev: usize| -> Mem {
            let s = s.as_ref().expect("staging sized above");
            Mem {
                addr: s.buf.as_ptr() as u64 + at as u64,
                lkey: s.mrs[dev].lkey(),
                rkey: s.mrs[dev].rkey(),
            }
        };
        let mut send_q: Vec<VecDeque<SendMsg>> = (0..chans).map(|_| VecDeque::new()).collect();
        for (op, at) in sends.iter().zip(&send_at) {
            let mem = match at {
                Place::Eager => Mem {
                    addr: op.buf.as_ptr() as u64,
                    lkey: 0,
                    rkey: 0,
                },
                Place::Registered(m) => *m,
                Place::Staged(off) => {
                    let m = stage_mem(*off, &self.staging, self.dev_of(op.peer));
                    // SAFETY: staging holds `staged` bytes, this op's share starts at off.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            op.buf.as_ptr(),
                            m.addr as *mut u8,
                            op.buf.len(),
                        )
                    };
                    m
                }
            };
            let peer = self.peer(op.peer);
            let seq = peer.send_seq;
            peer.send_seq += 1;
            send_q[op.peer].push_back(SendMsg {
                addr: mem.addr,
                lkey: mem.lkey,
                len: op.buf.len(),
                off: 0,
                seq,
                eager: matches!(at, Place::Eager),
            });
        }
        let mut recv_todo: Vec<VecDeque<RecvChunk>> = (0..chans).map(|_| VecDeque::new()).collect();
        let mut eager_todo: Vec<VecDeque<EagerRecv>> =
            (0..chans).map(|_| VecDeque::new()).collect();
        let mut left_chunks = 0usize;
        for (op, at) in recvs.iter_mut().zip(&recv_at) {
            let peer = self.peer(op.peer);
            let seq = peer.recv_seq;
            peer.recv_seq += 1;
            let limit = peer.chunk_limit;
            let mem = match at {
                Place::Eager => {
                    eager_todo[op.peer].push_back(EagerRecv {
                        addr: op.buf.as_mut_ptr(),
                        len: op.buf.len(),
                        seq,
                    });
                    left_chunks += 1;
                    continue;
                }
                Place::Registered(m) => *m,
                Place::Staged(off) => stage_mem(*off, &self.staging, self.dev_of(op.peer)),
            };
            for (off, len) in profile::chunks(op.buf.len(), limit, self.profile.frame) {
                recv_todo[op.peer].push_back(RecvChunk {
                    addr: mem.addr + off as u64,
                    lkey: mem.lkey,
                    rkey: mem.rkey,
                    len,
                    msg_len: op.buf.len(),
                    seq,
                });
                left_chunks += 1;
            }
        }
        let mut inflight: Vec<VecDeque<RecvChunk>> = (0..chans).map(|_| VecDeque::new()).collect();
        let mut sends_out = 0usize;
        let mut data = Vec::new();
        let mut last_progress = Instant::now();
        let mut idle_polls = 0u32;
        loop {
            let mut progress = false;
            for p in 0..chans {
                if self.peers[p].is_none() {
                    continue;
                }
                progress |= self.post_recvs(p, &mut recv_todo[p], &mut inflight[p])?;
                // The oldest large receive still open: an eager message with its number means
                // the sender sent small what this rank receives large.
                let large = inflight[p]
                    .front()
                    .or(recv_todo[p].front())
                    .map(|c| (c.seq, c.msg_len));
                let taken = self.take_eager(p, &mut eager_todo[p], large)?;
                left_chunks -= taken;
                progress |= taken > 0;
                progress |= self.flush_ctl(p)?;
                progress |= self.post_sends(p, &mut send_q[p], &mut sends_out)?;
            }
            data.clear();
            let n = self.poll(&mut data)?;
            for (kind, p, _, wc) in &data {
                if *kind == K_DATA_SEND {
                    sends_out -= 1;
                    continue;
                }
                let c = inflight[*p].pop_front().ok_or_else(|| {
                    anyhow!(
                        "transport verbs: data from {} that nothing was posted for",
                        self.names[*p]
                    )
                })?;
                let got = if self.profile.data_op == DataOp::WriteImm
                    && wc.wc_flags & IBV_WC_WITH_IMM != 0
                {
                    u32::from_be(wc.imm_data) as usize
                } else {
                    wc.byte_len as usize
                };
                if got != c.len {
                    bail!(
                        "message size mismatch from {}: a chunk of {got} bytes arrived where {} were expected (of a {}-byte message)",
                        self.names[*p],
                        c.len,
                        c.msg_len
                    );
                }
                left_chunks -= 1;
            }
            if left_chunks == 0 && sends_out == 0 && send_q.iter().all(|q| q.is_empty()) {
                break;
            }
            if n > 0 || progress {
                last_progress = Instant::now();
                idle_polls = 0;
                continue;
            }
            idle_polls += 1;
            if idle_polls & 1023 == 0 {
                crate::abort::check_abort()?;
            }
            if idle_polls & 1023 == 0 && last_progress.elapsed() > self.timeout {
                let mut waits: Vec<String> = Vec::new();
                for p in 0..chans {
                    let r = recv_todo[p].len() + inflight[p].len() + eager_todo[p].len();
                    let s = send_q[p].len();
                    if r + s > 0 {
                        waits.push(format!(
                            "{} ({r} receive chunk(s) not arrived, {s} message(s) it has not said it is ready for)",
                            self.names[p]
                        ));
                    }
                }
                if waits.is_empty() {
                    waits.push(format!("{sends_out} send completion(s)"));
                }
                bail!(
                    "timed out after {:.0} s waiting for {}",
                    self.timeout.as_secs_f64(),
                    waits.join(", ")
                );
            }
            idle_wait(idle_polls, last_progress, self.waiting);
        }
        for (op, at) in recvs.iter_mut().zip(&recv_at) {
            if let Place::Staged(off) = at {
                let s = self.staging.as_ref().expect("staging sized above");
                // SAFETY: every chunk of this message has completed into staging.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.buf.as_ptr().add(*off),
                        op.buf.as_mut_ptr(),
                        op.buf.len(),
                    )
                };
            }
        }
        Ok(())
    }
}

impl VerbsTransport {
    fn post_recvs(
        &mut self,
        p: usize,
        todo: &mut VecDeque<RecvChunk>,
        inflight: &mut VecDeque<RecvChunk>,
    ) -> Result<bool> {
        let mut did = false;
        let op = self.profile.data_op;
        while let Some(c) = todo.front().copied() {
            let cost = match op {
                DataOp::Send => self.profile.cost(c.len),
                DataOp::WriteImm => 1,
            };
            let data_qp = {
                let peer = self.peer(p);
                if peer.rq_free < cost || peer.rq_chunks_free == 0 {
                    break;
                }
                peer.data
            };
            let mut sge = IbvSge {
                addr: c.addr,
                length: c.len as u32,
                lkey: c.lkey,
            };
            // A written chunk needs only a receive to carry its immediate, without memory.
            let with_memory = op == DataOp::Send && c.len > 0;
            let mut wr = IbvRecvWr {
                wr_id: wr_id(K_DATA_RECV, p, cost as u64),
                next: std::ptr::null_mut(),
                sg_list: if with_memory {
                    &mut sge
                } else {
                    std::ptr::null_mut()
                },
                num_sge: with_memory as i32,
            };
            // SAFETY: the chunk lies in registered memory the caller lent for this exchange,
            // which does not return before the chunk completes.
            let rc = unsafe { post_recv(data_qp, &mut wr) };
            if rc != 0 {
                bail!(
                    "transport verbs: cannot post a receive for {}: {}",
                    self.names[p],
                    std::io::Error::from_raw_os_error(rc)
                );
            }
            let peer = self.peer(p);
            peer.rq_free -= cost;
            peer.rq_chunks_free -= 1;
            peer.pending_ready.push(ReadyEntry {
                addr: c.addr,
                rkey: c.rkey,
                len: c.len as u32,
                msg_len: c.msg_len as u64,
                seq: c.seq,
            });
            inflight.push_back(c);
            todo.pop_front();
            did = true;
        }
        Ok(did)
    }

    /// Fills small receives from the eager messages that arrived, in order; the number taken.
    fn take_eager(
        &mut self,
        p: usize,
        todo: &mut VecDeque<EagerRecv>,
        large: Option<(u64, usize)>,
    ) -> Result<usize> {
        if let (Some(m), Some((seq, len))) = (self.peer(p).eager_in.front().copied(), large) {
            if m.seq == seq {
                bail!(
                    "message size mismatch from {}: a {}-byte message arrived where {len} were expected",
                    self.names[p],
                    m.len
                );
            }
        }
        let mut taken = 0;
        while let Some(r) = todo.front() {
            let Some(m) = self.peer(p).eager_in.front().copied() else {
                break;
            };
            if m.seq != r.seq || m.len != r.len {
                let what = if m.seq > r.seq {
                    format!("it sent more than {EAGER_MAX} bytes")
                } else if m.seq < r.seq {
                    format!(
                        "a {}-byte message arrived where more than {EAGER_MAX} were expected",
                        m.len
                    )
                } else {
                    format!(
                        "a {}-byte message arrived where {} were expected",
                        m.len, r.len
                    )
                };
                bail!("message size mismatch from {}: {what}", self.names[p]);
            }
            // SAFETY: the completion says the device is done with the slot, which holds the
            // header, the number and `len` bytes; the receive buffer is the caller's, alive and
            // exclusively ours for the exchange.
            unsafe {
                let from = self.ctl_addr(p, m.slot) as *const u8;
                std::ptr::copy_nonoverlapping(from.add(CTL_HDR + 8), r.addr, r.len);
            }
            let peer = self.peer(p);
            peer.eager_in.pop_front();
            peer.credits_owed += 1;
            self.post_ctl_recv(p, m.slot)?;
            todo.pop_front();
            taken += 1;
        }
        Ok(taken)
    }

    fn post_sends(
        &mut self,
        p: usize,
        queue: &mut VecDeque<SendMsg>,
        out: &mut usize,
    ) -> Result<bool> {
        let mut did = false;
        let op = self.profile.data_op;
        while let Some(msg) = queue.front_mut() {
            if msg.eager {
                if self.peer(p).eager_credits == 0 {
                    break;
                }
                let seq = msg.seq.to_le_bytes();
                // SAFETY: the caller's send buffer, alive for the whole exchange.
                let bytes = unsafe { std::slice::from_raw_parts(msg.addr as *const u8, msg.len) };
                if !self.post_ctl_send(p, MSG_EAGER, msg.len as u32, &[&seq, bytes])? {
                    break;
                }
                // Copied into the control frame: nothing of the caller's is in flight.
                self.peer(p).eager_credits -= 1;
                queue.pop_front();
                did = true;
                continue;
            }
            let (entry, data_qp) = {
                let profile_cost = |len: usize| match op {
                    DataOp::Send => self.profile.cost(len),
                    DataOp::WriteImm => 1,
                };
                let Some(peer) = self.peers[p].as_ref() else {
                    break;
                };
                let Some(entry) = peer.ready.front().copied() else {
                    break;
                };
                if peer.sq_free < profile_cost(entry.len as usize) {
                    break;
                }
                (entry, peer.data)
            };
            if msg.off == 0 && entry.seq > msg.seq {
                bail!(
                    "message size mismatch with {}: this rank sends {} bytes where it receives at most {EAGER_MAX}",
                    self.names[p],
                    msg.len
                );
            }
            if entry.seq < msg.seq {
                bail!(
                    "message size mismatch with {}: it receives {} bytes where this rank sent at most {EAGER_MAX}",
                    self.names[p],
                    entry.msg_len
                );
            }
            if msg.off == 0 && entry.msg_len as usize != msg.len {
                bail!(
                    "message size mismatch with {}: it receives {} bytes, this rank sends {}",
                    self.names[p],
                    entry.msg_len,
                    msg.len
                );
            }
            let len = entry.len as usize;
            if msg.off + len > msg.len || (len == 0 && msg.len > 0) {
                bail!(
                    "transport verbs: {} asked for a chunk of {len} bytes at {} of a {}-byte message",
                    self.names[p],
                    msg.off,
                    msg.len
                );
            }
            let cost = match op {
                DataOp::Send => self.profile.cost(len),
                DataOp::WriteImm => 1,
            };
            let mut sge = IbvSge {
                addr: msg.addr + msg.off as u64,
                length: len as u32,
                lkey: msg.lkey,
            };
            let mut wr = IbvSendWr::zeroed();
            wr.wr_id = wr_id(K_DATA_SEND, p, cost as u64);
            wr.sg_list = if len > 0 {
                &mut sge
            } else {
                std::ptr::null_mut()
            };
            wr.num_sge = (len > 0) as i32;
            wr.send_flags = IBV_SEND_SIGNALED;
            match op {
                DataOp::Send => wr.opcode = IBV_WR_SEND,
                DataOp::WriteImm => {
                    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                    wr.imm_data = (len as u32).to_be();
                    wr.remote_addr = entry.addr;
                    wr.rkey = entry.rkey;
                }
            }
            // SAFETY: the chunk lies in registered memory lent for this exchange; its
            // completion is awaited before exchange returns.
            let rc = unsafe { post_send(data_qp, &mut wr) };
            if rc != 0 {
                bail!(
                    "transport verbs: cannot post a send to {}: {}",
                    self.names[p],
                    std::io::Error::from_raw_os_error(rc)
                );
            }
            let peer = self.peer(p);
            peer.sq_free -= cost;
            peer.ready.pop_front();
            *out += 1;
            did = true;
            msg.off += len;
            if msg.off >= msg.len {
                queue.pop_front();
            }
        }
        Ok(did)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 1 of three: two cables to rank 0 (jaccl-ring's second cable between neighbours),
    /// one to rank 2 named by the hostfile: rank 0's first cable is a channel in rank order,
    /// its second a further lane; rank 2 is reached on its named device.
    #[test]
    fn a_pair_with_two_cables_gets_a_lane_on_each_cables_device() {
        use tbbench_schema::{Link, LinkEnd, Topology};
        let end = |iface: &str, rdma: Option<&str>| LinkEnd {
            interface: iface.into(),
            link_kind: "thunderbolt-ip".into(),
            rdma_device: rdma.map(str::to_string),
            ..Default::default()
        };
        let link = |ranks: [usize; 2], cable, ends: [LinkEnd; 2]| Link {
            ranks,
            cable,
            ends,
            ..Default::default()
        };
        let cabling = crate::links::Cabling {
            links: vec![
                link([0, 1], 0, [end("en2", None), end("en2", None)]),
                link([0, 1], 1, [end("en3", None), end("en3", None)]),
                link([1, 2], 0, [end("en4", Some("rdma_en4")), end("en2", None)]),
            ],
            topology: Topology::default(),
        };
        let (first, extra) = devices_on_cables(1, 3, &cabling);
        assert_eq!(
            first,
            [
                PeerDevice::OnInterface("en2".into()),
                PeerDevice::Nothing,
                PeerDevice::Named("rdma_en4".into()),
            ]
        );
        assert_eq!(extra, [(0, PeerDevice::OnInterface("en3".into()))]);
        // Channels: ranks 0..3, then rank 0's second cable, its lane 1.
        let chan_rank = [0, 1, 2, 0];
        assert_eq!(
            (0..4).map(|c| lane_of(&chan_rank, c)).collect::<Vec<_>>(),
            [0, 0, 0, 1]
        );
    }

    #[test]
    fn wr_ids_round_trip() {
        for (k, p, low) in [
            (K_DATA_SEND, 0, 0),
            (K_CTL_RECV, 7, 127),
            (K_DATA_RECV, 0xffff, 0xff_ffff_ffff),
        ] {
            assert_eq!(split_wr_id(wr_id(k, p, low)), (k, p, low));
        }
    }

    #[test]
    fn ready_notices_fit_one_control_frame() {
        const { assert!(CTL_HDR + READY_MAX * READY_ENTRY <= CTL_SLOT) };
        // A whole osu_bw window of one-chunk messages fits one notice.
        const { assert!(READY_MAX >= 64) };
    }

    #[test]
    fn missing_library_is_the_no_device_line() {
        let opts = VerbsOptions {
            library: Some("/nonexistent/libibverbs.so.1".into()),
            timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let e = match prepare(0, 2, &opts) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("a missing library cannot give a device"),
        };
        assert!(
            e.starts_with("transport verbs: no RDMA device on this host (cannot load /nonexistent/libibverbs.so.1"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn this_host_without_a_device_says_so_in_one_line() {
        // Meaningful only where no RDMA device exists (this project's build machines).
        let has_devices = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.count() > 0)
            .unwrap_or(false);
        if has_devices || cfg!(target_vendor = "apple") {
            println!("skipped: this host may have an RDMA device");
            return;
        }
        let e = match prepare(0, 2, &VerbsOptions::default()) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("no device here, yet one opened"),
        };
        assert!(
            e.starts_with("transport verbs: no RDMA device on this host ("),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains("/sys/class/infiniband"),
            "says what sysfs shows: {e}"
        );
        // With the library installed the reason is the device list; without it, the load.
        assert!(
            e.contains("ibv_get_device_list") || e.contains("cannot load libibverbs.so.1"),
            "{e}"
        );
    }
}
