//! What each platform's verbs stack accepts, and the pure decisions that follow from it:
//! which device an interface maps to, which GID to use, how a message is cut into chunks, and
//! the attributes of each queue-pair state transition. Kept free of FFI calls so all of it is
//! unit-tested on hosts without a device.

use super::ffi::*;
use std::net::Ipv4Addr;

/// Apple's verbs stack over Thunderbolt (macOS 26.2+) versus rdma-core on Linux.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    MacOs,
    Linux,
}

impl Platform {
    pub fn this_host() -> Platform {
        if cfg!(target_vendor = "apple") {
            Platform::MacOs
        } else {
            Platform::Linux
        }
    }
}

/// How data moves once a receiver has said where it wants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOp {
    /// SEND into a posted RECV of the same size.
    Send,
    /// RDMA WRITE with immediate into the receiver's registered buffer; a zero-length RECV
    /// consumes the immediate, so the receiver still learns of each arrival.
    WriteImm,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub platform: Platform,
    /// IBV_QPT_UC or IBV_QPT_RC.
    pub qp_type: u32,
    pub data_op: DataOp,
    /// A fixed path MTU (an `IBV_MTU_*` value); None: the ports' active MTU, the smaller of
    /// both ends.
    pub fixed_mtu: Option<u32>,
    /// The GID must be the IPv4-mapped address of the interface: Apple's stack addresses
    /// Thunderbolt peers only that way.
    pub gid_must_be_ipv4: bool,
    /// The unit a SEND and its RECV must agree on: on macOS both must span the same number of
    /// these, which exact-size chunks on both sides guarantee.
    pub frame: usize,
    /// Whether frames, not work requests, use up a queue's depth: on macOS the depth bounds
    /// the largest message (depth × frame).
    pub depth_counts_frames: bool,
    /// Largest chunk when depth does not bound it.
    pub max_chunk: usize,
    /// Per-device limits the stack enforces, checked up front for a clear message.
    pub max_mrs: Option<usize>,
    pub max_qps: Option<usize>,
    /// Queue depth asked for; the granted one is read back with ibv_query_qp.
    pub want_depth: u32,
    /// Memory region access.
    pub mr_access: i32,
}

impl Profile {
    pub fn for_platform(p: Platform) -> Profile {
        match p {
            Platform::MacOs => Profile {
                platform: p,
                // UC is what Apple's stack accepts; it does not report a dead peer, so the TCP
                // control channel's heartbeats stay the liveness check.
                qp_type: IBV_QPT_UC,
                data_op: DataOp::Send,
                fixed_mtu: Some(IBV_MTU_1024),
                gid_must_be_ipv4: true,
                frame: 4096,
                depth_counts_frames: true,
                max_chunk: usize::MAX,
                max_mrs: Some(100),
                max_qps: Some(10),
                want_depth: 256,
                mr_access: IBV_ACCESS_LOCAL_WRITE,
            },
            Platform::Linux => Profile {
                platform: p,
                qp_type: IBV_QPT_RC,
                data_op: DataOp::WriteImm,
                fixed_mtu: None,
                gid_must_be_ipv4: false,
                frame: 4096,
                depth_counts_frames: false,
                // Below the 2 GiB most HCAs allow per work request, and a power of two.
                max_chunk: 1 << 30,
                max_mrs: None,
                max_qps: None,
                want_depth: 512,
                mr_access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
            },
        }
    }

    pub fn name(&self) -> &'static str {
        match self.platform {
            Platform::MacOs => "macOS (UC, SEND/RECV, MTU 1024)",
            Platform::Linux => "Linux (RC, RDMA WRITE with immediate)",
        }
    }

    /// The largest chunk for a granted depth, and how much of the depth one chunk of `len`
    /// bytes uses. Half the depth per chunk keeps two chunks in flight.
    pub fn chunk_limit(&self, depth: u32) -> usize {
        if self.depth_counts_frames {
            (depth as usize / 2).max(1) * self.frame
        } else {
            self.max_chunk
        }
    }

    pub fn cost(&self, len: usize) -> u32 {
        if self.depth_counts_frames {
            frames(len, self.frame).max(1) as u32
        } else {
            1
        }
    }
}

/// The 4 KiB frames `len` bytes span.
pub fn frames(len: usize, frame: usize) -> usize {
    len.div_ceil(frame)
}

/// Cuts a `len`-byte message into (offset, length) chunks of at most `limit` bytes (a whole
/// number of frames). Both ends compute the same cut from the same length, so each SEND meets
/// a RECV of exactly its size. An empty message is one empty chunk: it is still a message.
pub fn chunks(len: usize, limit: usize, frame: usize) -> Vec<(usize, usize)> {
    let step = (limit / frame).max(1) * frame;
    if len == 0 {
        return vec![(0, 0)];
    }
    (0..len)
        .step_by(step)
        .map(|off| (off, step.min(len - off)))
        .collect()
}

/// The bytes an `IBV_MTU_*` value stands for.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// `::ffff:a.b.c.d`, the GID a RoCE v2 or Thunderbolt port carries for an IPv4 address.
pub fn ipv4_mapped(ip: Ipv4Addr) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

fn is_usable(g: &Gid) -> bool {
    let zero = g.iter().all(|b| *b == 0);
    let link_local = g[0] == 0xfe && (g[1] & 0xc0) == 0x80;
    !zero && !link_local
}

fn as_ipv4(g: &Gid) -> Option<Ipv4Addr> {
    (g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff)
        .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
}

/// Picks the GID table entry to use. With an address, the entry that is its IPv4-mapped form;
/// without one, the first IPv4-mapped entry. Empty and link-local (fe80::/10) entries are
/// never chosen: they do not route between hosts. The error lists what the table holds.
pub fn select_gid(table: &[Gid], want: Option<Ipv4Addr>) -> Result<usize, String> {
    let usable = |i: &usize| is_usable(&table[*i]);
    let found = match want {
        Some(ip) => (0..table.len())
            .filter(usable)
            .find(|i| table[*i] == ipv4_mapped(ip)),
        None => (0..table.len())
            .filter(usable)
            .find(|i| as_ipv4(&table[*i]).is_some()),
    };
    found.ok_or_else(|| {
        let held: Vec<String> = table
            .iter()
            .enumerate()
            .filter(|(_, g)| is_usable(g))
            .map(|(i, g)| format!("{i}: {}", std::net::Ipv6Addr::from(*g)))
            .collect();
        let what = match want {
            Some(ip) => format!("no GID maps to {ip} (::ffff:{ip})"),
            None => "no GID holds an IPv4-mapped address".to_string(),
        };
        if held.is_empty() {
            format!("{what}; the GID table has no usable entry (is the interface up with an IPv4 address?)")
        } else {
            format!("{what}; the table holds {}", held.join(", "))
        }
    })
}

/// The rules a device of tbbench's software RDMA library follows, from its name:
/// `softrdma_apple0` and the per-interface `rdma_en3` Apple's, `softrdma_linux0` (and any
/// other) rdma-core's.
pub fn platform_of_emulated(device: &str) -> Platform {
    if device.starts_with("softrdma_apple") || device.starts_with("rdma_") {
        Platform::MacOs
    } else {
        Platform::Linux
    }
}

/// The RDMA device that serves `iface`. On macOS each Thunderbolt port `enX` is `rdma_enX`;
/// on Linux sysfs links a network interface to the device of the same PCI function.
pub fn device_for_iface(platform: Platform, iface: &str) -> Option<String> {
    match platform {
        Platform::MacOs => Some(format!("rdma_{iface}")),
        Platform::Linux => {
            let dir = format!("/sys/class/net/{iface}/device/infiniband");
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.into_iter().next()
        }
    }
}

/// The interface a macOS device name stands for (`rdma_en3` → `en3`), to find its address.
pub fn iface_for_device(platform: Platform, device: &str) -> Option<String> {
    match platform {
        Platform::MacOs => device.strip_prefix("rdma_").map(str::to_string),
        Platform::Linux => {
            let dir = format!("/sys/class/infiniband/{device}/device/net");
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.into_iter().next()
        }
    }
}

/// The far end of one queue pair, as the handshake carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

/// This end's addressing, fixed when the device is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    pub port: u8,
    /// None where no GID is needed (InfiniBand with a LID: no global route header).
    pub gid_index: Option<u8>,
    pub psn: u32,
}

/// RESET → INIT.
pub fn init_attr(profile: &Profile, local: &Local) -> (IbvQpAttr, i32) {
    let attr = IbvQpAttr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: local.port,
        qp_access_flags: profile.mr_access as u32,
        ..Default::default()
    };
    let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    (attr, mask)
}

/// INIT → RTR: where the peer is and how it numbers its packets.
pub fn rtr_attr(profile: &Profile, local: &Local, remote: &Remote, mtu: u32) -> (IbvQpAttr, i32) {
    let mut attr = IbvQpAttr {
        qp_state: IBV_QPS_RTR,
        path_mtu: profile.fixed_mtu.unwrap_or(mtu),
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        ..Default::default()
    };
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.port_num = local.port;
    if let Some(index) = local.gid_index {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = IbvGid(remote.gid);
        attr.ah_attr.grh.sgid_index = index;
        // Routed RoCE v2 needs more than the one hop the default allows.
        attr.ah_attr.grh.hop_limit = 64;
    }
    let mut mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if profile.qp_type == IBV_QPT_RC {
        attr.max_dest_rd_atomic = 1;
        // 0.64 ms before a receiver-not-ready retry.
        attr.min_rnr_timer = 12;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    (attr, mask)
}

/// RTR → RTS.
pub fn rts_attr(profile: &Profile, local: &Local) -> (IbvQpAttr, i32) {
    let mut attr = IbvQpAttr {
        qp_state: IBV_QPS_RTS,
        sq_psn: local.psn,
        ..Default::default()
    };
    let mut mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if profile.qp_type == IBV_QPT_RC {
        // About 67 ms per ack timeout, 7 retries; receiver-not-ready retried forever (7),
        // since a receiver posts late only while it is busy, not gone.
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 1;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    (attr, mask)
}

/// The path MTU both ends can use.
pub fn path_mtu(profile: &Profile, local_active: u32, remote_active: u32) -> u32 {
    profile.fixed_mtu.unwrap_or_else(|| {
        local_active
            .min(remote_active)
            .clamp(IBV_MTU_256, IBV_MTU_4096)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: usize = 4096;

    #[test]
    fn chunks_cover_every_byte_once_in_whole_frames() {
        let limit = 4 * FRAME;
        for len in [
            0usize,
            1,
            4095,
            4096,
            4097,
            16384,
            16385,
            1 << 20,
            (1 << 20) + 3,
        ] {
            let c = chunks(len, limit, FRAME);
            assert!(!c.is_empty(), "{len}: at least one chunk");
            let mut next = 0;
            for (i, &(off, n)) in c.iter().enumerate() {
                assert_eq!(off, next, "{len}: chunks are contiguous");
                assert!(n <= limit, "{len}: chunk {i} of {n} exceeds {limit}");
                if i + 1 < c.len() {
                    assert_eq!(
                        n % FRAME,
                        0,
                        "{len}: every chunk but the last is whole frames"
                    );
                    assert_eq!(n, limit, "{len}: every chunk but the last is full");
                }
                next += n;
            }
            assert_eq!(next, len, "{len}: the chunks add up to the message");
        }
    }

    #[test]
    fn chunk_counts_and_sizes_for_edge_lengths() {
        let limit = 4 * FRAME;
        assert_eq!(chunks(0, limit, FRAME), vec![(0, 0)]);
        assert_eq!(chunks(1, limit, FRAME), vec![(0, 1)]);
        assert_eq!(chunks(4096, limit, FRAME), vec![(0, 4096)]);
        assert_eq!(chunks(4097, limit, FRAME), vec![(0, 4097)]);
        assert_eq!(chunks(4097, FRAME, FRAME), vec![(0, 4096), (4096, 1)]);
        let big = chunks(256 << 20, 1 << 20, FRAME);
        assert_eq!(big.len(), 256);
        assert!(big.iter().all(|c| c.1 == 1 << 20));
        // A limit that is not whole frames is rounded down to them, never to zero.
        assert_eq!(
            chunks(10000, 5000, FRAME),
            vec![(0, 4096), (4096, 4096), (8192, 1808)]
        );
        assert_eq!(chunks(10, 100, FRAME), vec![(0, 10)]);
    }

    #[test]
    fn granted_depth_bounds_the_chunk_on_macos_only() {
        let mac = Profile::for_platform(Platform::MacOs);
        // Half the depth per chunk: two chunks fit the queue at once.
        assert_eq!(mac.chunk_limit(256), 128 * FRAME);
        assert_eq!(mac.chunk_limit(16), 8 * FRAME);
        assert_eq!(
            mac.chunk_limit(1),
            FRAME,
            "a depth of one still moves a frame"
        );
        assert_eq!(mac.cost(0), 1);
        assert_eq!(mac.cost(4096), 1);
        assert_eq!(mac.cost(4097), 2);
        let c = chunks(1 << 20, mac.chunk_limit(16), mac.frame);
        assert_eq!(c.len(), 32);
        assert!(c.iter().all(|&(_, n)| mac.cost(n) <= 16 / 2));
        let linux = Profile::for_platform(Platform::Linux);
        assert_eq!(linux.chunk_limit(16), 1 << 30);
        assert_eq!(linux.cost(1 << 20), 1);
    }

    fn gid(s: &str) -> Gid {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    #[test]
    fn gid_is_the_ipv4_mapped_address_of_the_interface() {
        let table = vec![
            gid("::"),
            gid("fe80::1234:56ff:fe78:9abc"),
            gid("::ffff:192.168.1.7"),
            gid("::ffff:10.0.0.2"),
            gid("2001:db8::2"),
        ];
        assert_eq!(select_gid(&table, Some(Ipv4Addr::new(10, 0, 0, 2))), Ok(3));
        assert_eq!(
            select_gid(&table, Some(Ipv4Addr::new(192, 168, 1, 7))),
            Ok(2)
        );
        assert_eq!(select_gid(&table, None), Ok(2), "first IPv4-mapped entry");
        assert_eq!(
            ipv4_mapped(Ipv4Addr::new(10, 0, 0, 2)),
            gid("::ffff:10.0.0.2")
        );
    }

    #[test]
    fn gid_selection_skips_empty_and_link_local_entries() {
        // A link-local entry whose low bytes look like the address must not be picked.
        let mut fake = gid("fe80::");
        fake[10] = 0xff;
        fake[11] = 0xff;
        fake[12..].copy_from_slice(&[10, 0, 0, 2]);
        let table = vec![gid("::"), fake, gid("::"), gid("::ffff:10.0.0.2")];
        assert_eq!(select_gid(&table, Some(Ipv4Addr::new(10, 0, 0, 2))), Ok(3));
        assert_eq!(select_gid(&table, None), Ok(3));
    }

    #[test]
    fn missing_gid_is_an_error_saying_what_the_table_holds() {
        let table = vec![gid("::"), gid("fe80::1"), gid("::ffff:10.0.0.9")];
        let e = select_gid(&table, Some(Ipv4Addr::new(10, 0, 0, 2))).unwrap_err();
        assert!(e.contains("no GID maps to 10.0.0.2"), "{e}");
        assert!(e.contains("::ffff:10.0.0.9"), "{e}");
        assert!(!e.contains("fe80"), "unusable entries are not offered: {e}");
        let e = select_gid(&[gid("::"), gid("fe80::1")], None).unwrap_err();
        assert!(e.contains("no usable entry"), "{e}");
        assert!(select_gid(&[], Some(Ipv4Addr::new(10, 0, 0, 2))).is_err());
    }

    #[test]
    fn device_names_map_from_interfaces_on_macos() {
        assert_eq!(
            device_for_iface(Platform::MacOs, "en3").as_deref(),
            Some("rdma_en3")
        );
        assert_eq!(
            iface_for_device(Platform::MacOs, "rdma_en5").as_deref(),
            Some("en5")
        );
        assert_eq!(iface_for_device(Platform::MacOs, "mlx5_0"), None);
        assert_eq!(
            device_for_iface(Platform::Linux, "no-such-iface-tbbench"),
            None
        );
    }

    fn remote() -> Remote {
        Remote {
            lid: 7,
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            gid: gid("::ffff:10.0.0.2"),
        }
    }

    #[test]
    fn init_attributes_per_profile() {
        let local = Local {
            port: 1,
            gid_index: Some(3),
            psn: 42,
        };
        let mac = Profile::for_platform(Platform::MacOs);
        let (a, m) = init_attr(&mac, &local);
        assert_eq!(a.qp_state, IBV_QPS_INIT);
        assert_eq!(a.port_num, 1);
        assert_eq!(
            a.qp_access_flags, IBV_ACCESS_LOCAL_WRITE as u32,
            "no remote writes on UC"
        );
        assert_eq!(
            m,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        );
        let linux = Profile::for_platform(Platform::Linux);
        let (a, _) = init_attr(&linux, &local);
        assert_ne!(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE as u32, 0);
    }

    #[test]
    fn rtr_attributes_for_uc_on_macos() {
        let mac = Profile::for_platform(Platform::MacOs);
        assert_eq!(mac.qp_type, IBV_QPT_UC);
        let local = Local {
            port: 1,
            gid_index: Some(3),
            psn: 42,
        };
        let (a, m) = rtr_attr(&mac, &local, &remote(), IBV_MTU_4096);
        assert_eq!(a.qp_state, IBV_QPS_RTR);
        assert_eq!(a.path_mtu, IBV_MTU_1024, "macOS always uses 1024");
        assert_eq!(mtu_bytes(a.path_mtu), 1024);
        assert_eq!(a.dest_qp_num, 0x00ab_cdef);
        assert_eq!(a.rq_psn, 0x0012_3456);
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.grh.dgid.0, gid("::ffff:10.0.0.2"));
        assert_eq!(a.ah_attr.grh.sgid_index, 3);
        assert_eq!(a.ah_attr.port_num, 1);
        assert_eq!(
            m,
            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
            "UC has no atomics or RNR timer"
        );
    }

    #[test]
    fn rtr_attributes_for_rc_on_linux() {
        let linux = Profile::for_platform(Platform::Linux);
        assert_eq!(linux.qp_type, IBV_QPT_RC);
        let ib = Local {
            port: 2,
            gid_index: None,
            psn: 42,
        };
        let (a, m) = rtr_attr(&linux, &ib, &remote(), IBV_MTU_4096);
        assert_eq!(a.path_mtu, IBV_MTU_4096, "the negotiated MTU");
        assert_eq!(a.ah_attr.dlid, 7);
        assert_eq!(a.ah_attr.is_global, 0, "InfiniBand by LID: no GRH");
        assert_eq!(a.max_dest_rd_atomic, 1);
        assert!(a.min_rnr_timer > 0);
        assert_eq!(
            m,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        );
        let roce = Local {
            gid_index: Some(1),
            ..ib
        };
        let (a, _) = rtr_attr(&linux, &roce, &remote(), IBV_MTU_1024);
        assert_eq!(a.ah_attr.is_global, 1, "RoCE needs the GRH");
        assert_eq!(a.path_mtu, IBV_MTU_1024);
    }

    #[test]
    fn rts_attributes_per_profile() {
        let local = Local {
            port: 1,
            gid_index: None,
            psn: 0x00fe_dcba,
        };
        let (a, m) = rts_attr(&Profile::for_platform(Platform::MacOs), &local);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!(a.sq_psn, 0x00fe_dcba);
        assert_eq!(m, IBV_QP_STATE | IBV_QP_SQ_PSN);
        let (a, m) = rts_attr(&Profile::for_platform(Platform::Linux), &local);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!(a.rnr_retry, 7);
        assert!(a.timeout > 0 && a.retry_cnt > 0);
        assert_eq!(
            m,
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        );
    }

    #[test]
    fn path_mtu_is_the_smaller_end_or_fixed() {
        let linux = Profile::for_platform(Platform::Linux);
        assert_eq!(path_mtu(&linux, IBV_MTU_4096, IBV_MTU_1024), IBV_MTU_1024);
        assert_eq!(path_mtu(&linux, IBV_MTU_4096, IBV_MTU_4096), IBV_MTU_4096);
        let mac = Profile::for_platform(Platform::MacOs);
        assert_eq!(path_mtu(&mac, IBV_MTU_4096, IBV_MTU_4096), IBV_MTU_1024);
        assert_eq!(mtu_bytes(IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(IBV_MTU_256), 256);
    }
}
