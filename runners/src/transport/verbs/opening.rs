//! Opening the verbs transport: the devices each peer's queue pairs go on (over links, each
//! cable's), the queue pairs made before the rendezvous, and what is published there.

use super::*;

/// Which device a peer's queue pairs go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerDevice {
    /// No queue pairs: the rank itself, or a peer it has no cable to.
    Nothing,
    /// The device the options pick (`--rdma-device`, `--iface`, else the first listed).
    Default,
    /// The device of the cable to that peer (`rdma_en3`).
    Named(String),
    /// The device on this interface (the cable's, where the hostfile names no device).
    OnInterface(String),
}

/// Devices opened and queue pairs made (in INIT), before the rendezvous: what
/// [`Prepared::hello`] publishes is what the peers need to connect to them.
pub struct Prepared {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) profile: Profile,
    pub(super) chunk_limit: usize,
    /// Per channel (each rank's first cable, in rank order, then further cables of pairs with
    /// several): its data and control queue pairs and the port (index into `ports`) they are on.
    pub(super) qps: Vec<Option<(Qp, Qp, usize)>>,
    /// Per channel, the rank it reaches.
    pub(super) chan_rank: Vec<usize>,
    pub(super) hello: Hello,
    pub(super) info: VerbsInfo,
    pub(super) timeout: Duration,
    pub(super) ports: Vec<Port>,
}

/// Which of its rank's lanes channel `ch` is: how many channels before it reach that rank.
pub(super) fn lane_of(chan_rank: &[usize], ch: usize) -> usize {
    chan_rank[..ch]
        .iter()
        .filter(|&&r| r == chan_rank[ch])
        .count()
}

/// Warns when macOS's Thunderbolt Bridge holds the interface: Apple's RDMA does not work on a
/// bridged port.
pub(super) fn warn_if_bridged(platform: Platform, iface: Option<&str>) {
    let (Platform::MacOs, Some(iface)) = (platform, iface) else {
        return;
    };
    let Ok(out) = std::process::Command::new("ifconfig")
        .arg("bridge0")
        .output()
    else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let member = format!("member: {iface} ");
    if text.lines().any(|l| l.trim_start().starts_with(&member)) {
        eprintln!("tbbench: warning: the Thunderbolt Bridge (bridge0) includes {iface}; RDMA over {iface} needs it off (System Settings > Network > Thunderbolt Bridge, or `sudo ifconfig bridge0 deletem {iface}`)");
    }
}

/// Opens the devices and makes the queue pairs: every peer's on the device `opts.per_peer`
/// names for it (its cable's), or all on one. Any failure is one line saying what is missing.
pub fn prepare(rank: usize, size: usize, opts: &VerbsOptions) -> Result<Prepared> {
    let host = Platform::this_host();
    let path = opts
        .library
        .clone()
        .unwrap_or_else(|| default_library().to_string());
    let lib = Arc::new(Lib::open(&path).map_err(|e| no_device(&e))?);
    if let (Some(join), Some((secret, addr))) = (lib.join_run, opts.run) {
        // SAFETY: 16 readable bytes; the address in host byte order, 0 for every address.
        let rc = unsafe { join(secret.as_ptr(), secret.len(), addr.map_or(0, u32::from)) };
        if rc != 0 {
            bail!("transport verbs: {path} refused the run's secret");
        }
    }
    let list = list_devices(&lib, &path)?;
    let names = list.names.clone();
    // The device the options pick: --rdma-device, the one of --iface, or the first listed.
    let wanted = opts.device.clone().or_else(|| {
        opts.iface
            .as_deref()
            .and_then(|i| profile::device_for_iface(host, i))
    });
    let default = match &wanted {
        Some(w) if names.contains(w) => w.clone(),
        Some(w) => {
            let from = match (&opts.device, &opts.iface) {
                (None, Some(i)) => format!(" (the device of interface {i})"),
                _ => String::new(),
            };
            bail!(
                "transport verbs: no RDMA device named {w}{from} on this host; it has {}",
                names.join(", ")
            );
        }
        None => names[0].clone(),
    };
    // Each channel's device, checked against the list: every rank's first (or only) cable,
    // then the further cables of pairs with several.
    let resolve = |p: usize, want: Option<&PeerDevice>| -> Result<Option<String>> {
        Ok(match want {
            _ if p == rank => None,
            None | Some(PeerDevice::Default) => Some(default.clone()),
            Some(PeerDevice::Nothing) => None,
            Some(PeerDevice::Named(n)) => {
                if !names.iter().any(|x| x == n) {
                    bail!(
                        "transport verbs: no RDMA device named {n} (the device of the cable to rank {p}) on this host; it has {}",
                        names.join(", ")
                    );
                }
                Some(n.clone())
            }
            Some(PeerDevice::OnInterface(i)) => {
                // The software device names a cable's device as Apple does, on any host.
                let found = match &lib.emulated {
                    Some(_) => Some(format!("rdma_{i}")).filter(|n| names.contains(n)),
                    None => profile::device_for_iface(host, i),
                };
                match found {
                    Some(n) => Some(n),
                    None => bail!(
                        "transport verbs: no RDMA device on {i}, the interface of the cable to rank {p}; this host has {} (is RDMA enabled on that port?)",
                        names.join(", ")
                    ),
                }
            }
        })
    };
    let mut chan_rank: Vec<usize> = (0..size).collect();
    let mut per_peer: Vec<Option<String>> = Vec::with_capacity(size);
    for p in 0..size {
        per_peer.push(resolve(p, opts.per_peer.as_ref().map(|v| &v[p]))?);
    }
    for (p, dev) in &opts.extra_lanes {
        if *p >= size || per_peer[*p].is_none() {
            bail!("transport verbs: a further cable to rank {p}, which has no first one");
        }
        if chan_rank.iter().filter(|&&r| r == *p).count() >= handshake::MAX_LANES {
            bail!(
                "transport verbs: more than {} cables to rank {p}; tbbench stripes over at most {}",
                handshake::MAX_LANES,
                handshake::MAX_LANES
            );
        }
        chan_rank.push(*p);
        per_peer.push(resolve(*p, Some(dev))?);
    }
    // Devices in the order their first peer comes, each once.
    let mut opened: Vec<String> = Vec::new();
    for n in per_peer.iter().flatten() {
        if !opened.contains(n) {
            opened.push(n.clone());
        }
    }
    if opened.is_empty() {
        opened.push(default.clone());
    }
    // The software device's names say whose rules it follows; a real device follows this
    // host's. One run's devices follow one platform's rules.
    let platform_of = |n: &str| match &lib.emulated {
        Some(_) => profile::platform_of_emulated(n),
        None => host,
    };
    let platform = platform_of(&opened[0]);
    if let Some(other) = opened.iter().find(|n| platform_of(n) != platform) {
        bail!(
            "transport verbs: {} and {other} follow different platforms' rules; one rank's devices must be of one kind",
            opened[0]
        );
    }
    let profile = Profile::for_platform(platform);
    if let (Some(version), 0) = (&lib.emulated, rank) {
        eprintln!(
            "tbbench: note: {} is a software stand-in for an RDMA device ({version}, loaded from {path}) with {} rules; it moves bytes over TCP, so its figures are labelled emulated and are not RDMA measurements",
            opened.join(", "),
            match platform {
                Platform::MacOs => "Apple's",
                Platform::Linux => "ConnectX's",
            }
        );
    }
    let mut ports: Vec<Port> = Vec::with_capacity(opened.len());
    for name in &opened {
        // The default device takes --iface and the rank's data address; a cable's device its
        // own interface (`rdma_en3` is on en3).
        let (iface, ip) = if *name == default {
            (
                opts.iface
                    .clone()
                    .or_else(|| profile::iface_for_device(platform, name)),
                opts.ip,
            )
        } else {
            (profile::iface_for_device(platform, name), None)
        };
        let peers = per_peer.iter().flatten().filter(|n| *n == name).count();
        ports.push(open_port(&lib, &list, name, &profile, iface, ip, peers)?);
    }
    drop(list);

    // A channel's number rides in a work request id's 16-bit peer field (`wire::wr_id`).
    if per_peer.len() > 0xffff {
        bail!(
            "transport verbs: {} queue-pair channels (ranks and their further cables); at most 65535",
            per_peer.len()
        );
    }
    let mut qps: Vec<Option<(Qp, Qp, usize)>> = vec![None; per_peer.len()];
    for (p, slot) in qps.iter_mut().enumerate() {
        let Some(name) = &per_peer[p] else { continue };
        let at = opened.iter().position(|n| n == name).expect("opened above");
        let port = &mut ports[at];
        let data = make_qp(
            &port.dev,
            &profile,
            &mut port.queues,
            port.port,
            port.gid_index,
        )?;
        let ctl = make_qp(
            &port.dev,
            &profile,
            &mut port.queues,
            port.port,
            port.gid_index,
        )?;
        *slot = Some((data, ctl, at));
    }
    let limit = |q: &Qp| profile.chunk_limit(q.send_depth.min(q.recv_depth));
    let chunk_limit = qps
        .iter()
        .flatten()
        .map(|(d, _, _)| limit(d))
        .min()
        .unwrap_or(profile.chunk_limit(profile.want_depth))
        .min(u32::MAX as usize / 2);
    let first = &ports[0];
    let hello = Hello {
        platform,
        mtu: first.mtu,
        lid: first.lid,
        max_chunk: chunk_limit as u32,
        gid: first.gid,
        qps: qps
            .iter()
            .enumerate()
            .filter_map(|(ch, q)| {
                q.map(|(d, c, at)| PeerQps {
                    peer: chan_rank[ch],
                    lane: lane_of(&chan_rank, ch),
                    data_qpn: d.qpn(),
                    data_psn: d.psn,
                    ctl_qpn: c.qpn(),
                    ctl_psn: c.psn,
                    lid: ports[at].lid,
                    mtu: ports[at].mtu,
                    gid: ports[at].gid,
                })
            })
            .collect(),
    };
    let mtu = ports.iter().map(|p| p.mtu).min().unwrap_or(first.mtu);
    let info = VerbsInfo {
        device: opened.join(","),
        devices: opened.clone(),
        port: first.port,
        iface: if ports.len() == 1 {
            first.iface.clone()
        } else {
            None
        },
        mtu_bytes: profile::mtu_bytes(profile::path_mtu(&profile, mtu, mtu)),
        link_layer: match (platform, first.roce) {
            _ if lib.emulated.is_some() => "emulated",
            (Platform::MacOs, _) => "thunderbolt",
            (Platform::Linux, true) => "roce",
            (Platform::Linux, false) => "infiniband",
        },
        profile: profile.name(),
        emulated: lib.emulated.is_some(),
    };
    Ok(Prepared {
        rank,
        size,
        profile,
        chunk_limit,
        qps,
        chan_rank,
        hello,
        info,
        timeout: opts.timeout,
        ports,
    })
}

/// Verbs half open. On one network: the device opened and the queue pairs made, their numbers
/// published at the rendezvous. Over links: nothing opened until the cables are known
/// ([`Opening::advertise_cabled`]), then each peer's queue pairs on its cable's device, their
/// numbers published in the rendezvous' second round.
pub struct VerbsOpening {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) opts: VerbsOptions,
    pub(super) prepared: Option<Prepared>,
}

impl VerbsOpening {
    pub fn prepare(plan: &OpenPlan) -> Result<Box<dyn Opening>> {
        let opts = plan.opts;
        // Without --rdma-device on one network, the device a hostfile names for this host's
        // cable (MLX's `rdma`): one per rank (a pair, or a star's leaves); several are the
        // cables of a mesh or ring, which run over links.
        let named = match (&opts.net.rdma_device, crate::links::HostCables::from_launcher()?) {
            (Some(d), _) => Some(d.clone()),
            (None, _) if opts.net.links => None,
            (None, Some(c)) => match c.devices().as_slice() {
                [] => None,
                [one] => Some(one.clone()),
                several => bail!(
                    "transport verbs: the hostfile names {} RDMA devices for this host's cables ({}); give --over verbs:links to reach each peer on its cable's device, or --rdma-device for one of them",
                    several.len(),
                    several.join(", ")
                ),
            },
            (None, None) => None,
        };
        let vopts = VerbsOptions {
            device: named,
            iface: opts.net.iface.clone(),
            ip: match plan.data_ip {
                Some(std::net::IpAddr::V4(v4)) if !v4.is_loopback() && !v4.is_unspecified() => {
                    Some(v4)
                }
                _ => None,
            },
            timeout: opts.timeout,
            library: opts
                .verbs_lib
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            // The software device listens where this rank's data goes (loopback for local
            // ranks; every address over links, where each cable's device listens on its own)
            // and hears only this run's ranks.
            run: Some((
                plan.token.0,
                match plan.data_ip {
                    Some(std::net::IpAddr::V4(v4)) if !v4.is_unspecified() => Some(v4),
                    _ => None,
                },
            )),
            per_peer: None,
            extra_lanes: Vec::new(),
        };
        let prepared = if opts.net.links {
            None
        } else {
            Some(prepare(plan.rank, plan.size, &vopts)?)
        };
        Ok(Box::new(VerbsOpening {
            rank: plan.rank,
            size: plan.size,
            opts: vopts,
            prepared,
        }))
    }
}

/// The device each peer's queue pairs go on over links: the one the hostfile names for this
/// end of the first cable to it, else the device of that cable's interface; the default
/// device for a peer on this host; none for a peer with no cable. Then the further cables of
/// pairs with several, in cable order, each a lane of its own: (rank, device).
pub(super) fn devices_on_cables(
    rank: usize,
    size: usize,
    cabling: &crate::links::Cabling,
) -> (Vec<PeerDevice>, Vec<(usize, PeerDevice)>) {
    let device = |link| {
        let (mine, _) = crate::links::Cabling::ends(link, rank);
        match &mine.rdma_device {
            _ if mine.link_kind == "loopback" => PeerDevice::Default,
            Some(d) => PeerDevice::Named(d.clone()),
            None => PeerDevice::OnInterface(mine.interface.clone()),
        }
    };
    let mut extra = Vec::new();
    let first = (0..size)
        .map(|p| {
            if p == rank {
                return PeerDevice::Nothing;
            }
            let cables = cabling.between(rank, p);
            let Some(link) = cables.first() else {
                return PeerDevice::Nothing;
            };
            let first = device(link);
            // Loopback "cables" are one network: nothing to stripe over.
            if first != PeerDevice::Default {
                extra.extend(cables[1..].iter().map(|l| (p, device(l))));
            }
            first
        })
        .collect();
    (first, extra)
}

/// Each rank's address as its GID carries it (RoCE and the software device: an IPv4-mapped
/// GID is the address the RDMA traffic goes to), else the data address it published: on a
/// cable's device that is the cable's address, not the management network's.
pub(super) fn gid_addresses(table: &[RankInfo], hellos: &[Option<String>]) -> Vec<String> {
    table
        .iter()
        .zip(hellos)
        .map(|(i, hello)| {
            let from_gid = hello
                .as_deref()
                .and_then(|h| handshake::Hello::decode(h, table.len()).ok())
                .and_then(|h| {
                    let g = h.gid;
                    (g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff)
                        .then(|| std::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]).to_string())
                });
            from_gid.or_else(|| i.data_ip.clone()).unwrap_or_default()
        })
        .collect()
}

impl Opening for VerbsOpening {
    fn advertise(&self, me: &mut RankInfo) {
        me.rdma = self.prepared.as_ref().map(|p| p.hello());
    }

    fn advertise_cabled(&mut self, cabling: &crate::links::Cabling) -> Result<Option<String>> {
        let size = self.size;
        let mut opts = self.opts.clone();
        let (first, extra) = devices_on_cables(self.rank, size, cabling);
        opts.per_peer = Some(first);
        opts.extra_lanes = extra;
        let prepared = prepare(self.rank, size, &opts)?;
        let hello = prepared.hello();
        self.prepared = Some(prepared);
        Ok(Some(hello))
    }

    fn connect(self: Box<Self>, p: &Peers) -> Result<Opened> {
        let hellos: Vec<Option<String>> = match p.cabled {
            Some(words) => words.to_vec(),
            None => p.table.iter().map(|i| i.rdma.clone()).collect(),
        };
        let prepared = self
            .prepared
            .ok_or_else(|| anyhow!("transport verbs: no device was opened for the cables"))?;
        let t = prepared.connect(&hellos, p.names.clone())?;
        let v = t.info();
        // The device's interface gives the speed; the MTU is the RDMA path MTU, which is what
        // sizes the packets (1024 on Thunderbolt whatever the IP MTU).
        let interface = v
            .iface
            .clone()
            .or_else(|| p.opts.net.iface.clone().filter(|_| v.devices.len() == 1));
        let speed = interface
            .as_deref()
            .and_then(|i| netinfo::interface_by_name(i).ok())
            .and_then(|i| i.speed_gbit_per_s);
        // Over links every cable's end records the device it ran on: this rank's as opened,
        // the far ends' by the rule that names a cable's device after its interface (Apple's
        // and the software device's; a Linux host's own sysfs says only of its own).
        let mut links = p.cabling.map(|c| c.links.clone()).unwrap_or_default();
        if v.emulated || v.link_layer == "thunderbolt" {
            for l in &mut links {
                for e in &mut l.ends {
                    if e.rdma_device.is_none() && e.link_kind != "loopback" {
                        e.rdma_device = Some(format!("rdma_{}", e.interface));
                    }
                }
            }
        }
        let network = tbbench_schema::Network {
            transport: "verbs".into(),
            label: format!("verbs/{} ({})", v.device, v.link_layer),
            interface,
            // Never counted as RDMA: the software device's figures measure its TCP.
            link_kind: if v.emulated { "rdma-emulated" } else { "rdma" }.into(),
            nominal_gbit_per_s: speed,
            mtu: Some(v.mtu_bytes),
            addresses: gid_addresses(p.table, &hellos),
            streams: None,
            streams_auto: false,
            congestion: None,
            sockbuf_bytes: None,
            sockbuf_auto: false,
            links,
            topology: None,
        };
        Ok(Opened {
            transport: Box::new(t),
            network,
        })
    }
}
