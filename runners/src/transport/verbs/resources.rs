//! The verbs objects a rank holds: devices opened, memory registered, completion queues and
//! queue pairs made and moved through their states, each released in order when dropped.

use super::*;

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What sysfs says about RDMA devices, for the no-device message.
pub(super) fn sysfs_note() -> String {
    if cfg!(target_vendor = "apple") {
        return "is RDMA enabled? `rdma_ctl status` says; `rdma_ctl enable` in recoveryOS turns it on".into();
    }
    match std::fs::read_dir("/sys/class/infiniband") {
        Err(_) => "/sys/class/infiniband is absent (no RDMA driver loaded)".into(),
        Ok(d) => {
            let names: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if names.is_empty() {
                "/sys/class/infiniband is empty".into()
            } else {
                format!("/sys/class/infiniband lists {}", names.join(", "))
            }
        }
    }
}

pub(super) fn no_device(why: &str) -> anyhow::Error {
    anyhow!(
        "transport verbs: no RDMA device on this host ({}; {})",
        one_line(why),
        sysfs_note()
    )
}

/// The opened device and its protection domain; the last holder closes them, so memory
/// registered from buffers that outlive the transport stays valid until those buffers go.
pub(super) struct Device {
    pub(super) lib: Arc<Lib>,
    pub(super) ctx: *mut IbvContext,
    pub(super) pd: *mut IbvPd,
    pub(super) name: String,
    pub(super) max_mrs: Option<usize>,
    pub(super) mrs: AtomicUsize,
}

// The verbs objects are used from one thread at a time (the transport is &mut), and the
// library's handles may move between threads.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every MR, QP and CQ holds an Arc to this and is gone by now.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

pub(super) struct Mr {
    pub(super) raw: *mut IbvMr,
    pub(super) dev: Arc<Device>,
}

unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}

impl Mr {
    pub(super) fn register(dev: &Arc<Device>, ptr: *mut u8, len: usize, access: i32) -> Result<Mr> {
        if let Some(max) = dev.max_mrs {
            if dev.mrs.load(Ordering::Relaxed) >= max {
                bail!(
                    "transport verbs: {} allows about {max} memory regions and all are in use (each buffer the suite allocates takes one)",
                    dev.name
                );
            }
        }
        // SAFETY: ptr..ptr+len is memory the caller owns for the MR's lifetime.
        let raw = unsafe { (dev.lib.reg_mr)(dev.pd, ptr as *mut _, len, access) };
        if raw.is_null() {
            let e = std::io::Error::last_os_error();
            bail!(
                "transport verbs: cannot register {len} bytes with {}: {e} (locked-memory limit? see `ulimit -l`)",
                dev.name
            );
        }
        dev.mrs.fetch_add(1, Ordering::Relaxed);
        Ok(Mr {
            raw,
            dev: dev.clone(),
        })
    }
    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: raw is a live MR.
        unsafe { (*self.raw).lkey }
    }
    pub(super) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by Mr::register and not yet deregistered.
        unsafe { (self.dev.lib.dereg_mr)(self.raw) };
        self.dev.mrs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One registered range, for finding the keys of memory handed to `exchange`.
#[derive(Clone)]
pub(super) struct Reg {
    pub(super) start: usize,
    pub(super) end: usize,
    /// (lkey, rkey) on each device, in the transport's device order.
    pub(super) keys: Vec<(u32, u32)>,
    pub(super) id: usize,
}

pub(super) type Registry = Arc<Mutex<Vec<Reg>>>;

/// Lives in a [`Buffer`] from [`VerbsTransport::alloc`]: forgets and deregisters the memory
/// before the buffer frees it.
pub(super) struct MrGuard {
    pub(super) mrs: Vec<Mr>,
    pub(super) registry: Registry,
}

impl Drop for MrGuard {
    fn drop(&mut self) {
        let id = self.mrs[0].raw as usize;
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|x| x.id != id);
    }
}

/// The queue pairs and the completion queue, destroyed in that order.
pub(super) struct Queues {
    pub(super) lib: Arc<Lib>,
    pub(super) cq: *mut IbvCq,
    pub(super) qps: Vec<*mut IbvQp>,
}

impl Drop for Queues {
    fn drop(&mut self) {
        // SAFETY: made by this library and not yet destroyed.
        unsafe {
            for qp in self.qps.drain(..) {
                (self.lib.destroy_qp)(qp);
            }
            if !self.cq.is_null() {
                (self.lib.destroy_cq)(self.cq);
            }
        }
    }
}

/// One queue pair and the depths the device granted it.
#[derive(Clone, Copy)]
pub(super) struct Qp {
    pub(super) raw: *mut IbvQp,
    pub(super) send_depth: u32,
    pub(super) recv_depth: u32,
    pub(super) psn: u32,
}

impl Qp {
    pub(super) fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.raw).qp_num }
    }
}

/// One opened device's port, its completion queue and the queue pairs made on it.
pub(super) struct Port {
    // Dropped first: the queue pairs and the CQ before the device they were made on.
    pub(super) queues: Queues,
    pub(super) dev: Arc<Device>,
    pub(super) port: u8,
    pub(super) gid_index: Option<u8>,
    pub(super) gid: Gid,
    pub(super) lid: u16,
    /// The port's active MTU (`IBV_MTU_*`).
    pub(super) mtu: u32,
    pub(super) roce: bool,
    pub(super) iface: Option<String>,
}

pub(super) fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::getrandom(&mut b);
    u32::from_le_bytes(b) & 0x00ff_ffff
}

/// The devices the library lists, by name, and the list to free once they are open.
pub(super) struct DeviceList<'a> {
    pub(super) lib: &'a Lib,
    pub(super) list: *mut *mut IbvDevice,
    pub(super) devices: Vec<*mut IbvDevice>,
    pub(super) names: Vec<String>,
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: from get_device_list, freed once; opened contexts outlive the list.
        unsafe { (self.lib.free_device_list)(self.list) };
    }
}

pub(super) fn list_devices<'a>(lib: &'a Lib, path: &str) -> Result<DeviceList<'a>> {
    let mut n: std::ffi::c_int = 0;
    // SAFETY: plain library calls; the list lives until the DeviceList drops.
    unsafe {
        *libc_errno() = 0;
        let list = (lib.get_device_list)(&mut n);
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(no_device(&format!(
                "{path} loaded, ibv_get_device_list: {}",
                strip_os_error(&e)
            )));
        }
        let devices: Vec<*mut IbvDevice> = (0..n.max(0) as usize).map(|i| *list.add(i)).collect();
        let names: Vec<String> = devices.iter().map(|d| lib.device_name(*d)).collect();
        let l = DeviceList {
            lib,
            list,
            devices,
            names,
        };
        if l.devices.is_empty() {
            return Err(no_device(&format!(
                "{path} loaded, ibv_get_device_list found no devices"
            )));
        }
        Ok(l)
    }
}

/// Opens device `name`, its protection domain and port 1, picks its GID, and makes a
/// completion queue for `peers` peers' queue pairs. `iface` is the device's interface where
/// known, `ip` the address to look for among the GIDs when the interface has none.
#[allow(clippy::too_many_arguments)]
pub(super) fn open_port(
    lib: &Arc<Lib>,
    list: &DeviceList,
    name: &str,
    profile: &Profile,
    iface: Option<String>,
    ip: Option<Ipv4Addr>,
    peers: usize,
) -> Result<Port> {
    let i = list
        .names
        .iter()
        .position(|n| n == name)
        .expect("the caller checked the name");
    // SAFETY: a listed device.
    let ctx = unsafe { (lib.open_device)(list.devices[i]) };
    if ctx.is_null() {
        let e = std::io::Error::last_os_error();
        bail!("transport verbs: cannot open {name}: {e}");
    }
    // SAFETY: ctx is open.
    let pd = unsafe { (lib.alloc_pd)(ctx) };
    if pd.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: opened above, nothing else made from it.
        unsafe { (lib.close_device)(ctx) };
        bail!("transport verbs: cannot allocate a protection domain on {name}: {e}");
    }
    let dev = Arc::new(Device {
        lib: lib.clone(),
        ctx,
        pd,
        name: name.to_string(),
        max_mrs: profile.max_mrs,
        mrs: AtomicUsize::new(0),
    });

    let port: u8 = 1;
    let mut pattr = IbvPortAttr::default();
    // SAFETY: pattr is a zeroed ibv_port_attr; the exported call fills at most its prefix.
    let rc = unsafe { (lib.query_port)(ctx, port, &mut pattr) };
    if rc != 0 {
        bail!(
            "transport verbs: cannot query port {port} of {name}: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    if pattr.state != IBV_PORT_ACTIVE {
        bail!(
            "transport verbs: port {port} of {name} is not active (state {}); is the cable in and the link up?",
            pattr.state
        );
    }
    let roce = pattr.link_layer == IBV_LINK_LAYER_ETHERNET || pattr.lid == 0;
    warn_if_bridged(Platform::this_host(), iface.as_deref());
    // The device's own interface's address is its GID, before the rank's data address, which
    // may be another network's.
    let want_ip = iface
        .as_deref()
        .and_then(|i| crate::netinfo::ipv4_of(i).ok())
        .or(ip);
    let gids: Vec<Gid> = (0..pattr.gid_tbl_len.max(0))
        .map(|i| {
            let mut g = IbvGid::default();
            // SAFETY: g is a writable union ibv_gid.
            let rc = unsafe { (lib.query_gid)(ctx, port, i, &mut g) };
            if rc == 0 {
                g.0
            } else {
                [0; 16]
            }
        })
        .collect();
    let gid_index: Option<u8> = if profile.gid_must_be_ipv4 || roce {
        // Without an interface to take the address from, the first IPv4-mapped GID serves
        // (the software device's, or a device run on one host over loopback).
        if profile.gid_must_be_ipv4 && want_ip.is_none() && iface.is_some() {
            bail!("transport verbs: {name} needs the IPv4 address of its interface for its GID; give --iface (e.g. en3) or --rdma-device rdma_enX of an interface that has one");
        }
        let i = profile::select_gid(&gids, want_ip)
            .map_err(|e| anyhow!("transport verbs: {name} port {port}: {e}"))?;
        Some(i as u8)
    } else {
        None
    };
    let gid = gid_index
        .map(|i| gids[i as usize])
        .or_else(|| gids.first().copied())
        .unwrap_or([0; 16]);

    if let Some(max) = profile.max_qps {
        if 2 * peers > max {
            bail!(
                "transport verbs: {} peers need {} queue pairs on {name}, more than the {max} it allows (at most {} ranks reached through one device)",
                peers,
                2 * peers,
                max / 2 + 1
            );
        }
    }
    let cqe = (peers.max(1) * 4 * profile.want_depth as usize).min(1 << 20) as std::ffi::c_int;
    let mut queues = Queues {
        lib: lib.clone(),
        cq: std::ptr::null_mut(),
        qps: Vec::new(),
    };
    // SAFETY: ctx is open; no channel, vector 0.
    queues.cq = unsafe { (lib.create_cq)(ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    if queues.cq.is_null() {
        let e = std::io::Error::last_os_error();
        bail!("transport verbs: cannot create a completion queue of {cqe} entries on {name}: {e}");
    }
    Ok(Port {
        queues,
        dev,
        port,
        gid_index,
        gid,
        lid: pattr.lid,
        mtu: pattr.active_mtu.clamp(IBV_MTU_256, IBV_MTU_4096),
        roce,
        iface,
    })
}

#[cfg(target_os = "linux")]
pub(super) unsafe fn libc_errno() -> *mut std::ffi::c_int {
    libc::__errno_location()
}
#[cfg(not(target_os = "linux"))]
pub(super) unsafe fn libc_errno() -> *mut std::ffi::c_int {
    libc::__error()
}

/// "Function not implemented (os error 38)" without the number, as users read it.
pub(super) fn strip_os_error(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

pub(super) fn make_qp(
    dev: &Arc<Device>,
    profile: &Profile,
    queues: &mut Queues,
    port: u8,
    gid_index: Option<u8>,
) -> Result<Qp> {
    let lib = &dev.lib;
    let want = profile.want_depth;
    let mut init = IbvQpInitAttr {
        qp_context: std::ptr::null_mut(),
        send_cq: queues.cq,
        recv_cq: queues.cq,
        srq: std::ptr::null_mut(),
        cap: IbvQpCap {
            max_send_wr: want,
            max_recv_wr: want,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: profile.qp_type,
        sq_sig_all: 0,
    };
    // SAFETY: pd and cq are live; init is a valid ibv_qp_init_attr.
    let raw = unsafe { (lib.create_qp)(dev.pd, &mut init) };
    if raw.is_null() {
        let e = std::io::Error::last_os_error();
        bail!(
            "transport verbs: cannot create a {} queue pair on {}: {e}",
            if profile.qp_type == IBV_QPT_UC {
                "UC"
            } else {
                "RC"
            },
            dev.name
        );
    }
    queues.qps.push(raw);
    // The depth asked for is a request: the granted one bounds both the work in flight and,
    // on macOS, the largest message.
    let mut attr = IbvQpAttr::default();
    let mut got = IbvQpInitAttr { ..init };
    // SAFETY: raw is live; attr and got are valid out-parameters.
    let rc = unsafe { (lib.query_qp)(raw, &mut attr, IBV_QP_CAP, &mut got) };
    let cap = if rc == 0 { attr.cap } else { init.cap };
    let qp = Qp {
        raw,
        send_depth: cap.max_send_wr.min(want).max(1),
        recv_depth: cap.max_recv_wr.min(want).max(1),
        psn: random_psn(),
    };
    let local = Local {
        port,
        gid_index,
        psn: qp.psn,
    };
    let (mut a, mask) = profile::init_attr(profile, &local);
    modify(lib, raw, &mut a, mask, "INIT", &dev.name)?;
    Ok(qp)
}

pub(super) fn modify(
    lib: &Lib,
    qp: *mut IbvQp,
    attr: &mut IbvQpAttr,
    mask: i32,
    state: &str,
    dev: &str,
) -> Result<()> {
    // SAFETY: qp is live; attr is a valid ibv_qp_attr.
    let rc = unsafe { (lib.modify_qp)(qp, attr, mask) };
    if rc != 0 {
        bail!(
            "transport verbs: cannot move a queue pair on {dev} to {state}: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    Ok(())
}

/// Registers `len` bytes at `ptr` with every device, in their order.
pub(super) fn register_on_all(
    devs: &[Arc<Device>],
    ptr: *mut u8,
    len: usize,
    access: i32,
) -> Result<Vec<Mr>> {
    devs.iter()
        .map(|d| Mr::register(d, ptr, len, access))
        .collect()
}
