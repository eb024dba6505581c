//! What RDMA devices this host has, for `tbbench env`: each device, its ports' state, MTU and
//! link layer, and the network interface it maps to. Opens devices read-only (queries only).

use super::ffi::{default_library, IbvPortAttr, Lib, IBV_LINK_LAYER_ETHERNET, IBV_PORT_ACTIVE};
use super::profile::{self, Platform};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub name: String,
    /// The interface this device carries (macOS `rdma_en3` → `en3`; Linux from sysfs).
    pub interface: Option<String>,
    pub ports: Vec<PortInfo>,
    /// A software stand-in (tbbench's softrdma device), not RDMA hardware.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub emulated: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortInfo {
    pub port: u8,
    /// "active", "down", "init", "armed", "active-defer", or the number.
    pub state: String,
    pub active_mtu_bytes: u32,
    /// "infiniband" or "ethernet" (RoCE, and Apple's Thunderbolt devices report this).
    pub link_layer: String,
    pub lid: u16,
}

pub fn port_state(s: u32) -> String {
    match s {
        1 => "down".into(),
        2 => "init".into(),
        3 => "armed".into(),
        IBV_PORT_ACTIVE => "active".into(),
        5 => "active-defer".into(),
        other => format!("state {other}"),
    }
}

/// Every device and its ports, or the one-line reason there are none (the same reason
/// `--transport verbs` gives).
pub fn list_devices() -> Result<Vec<DeviceInfo>, String> {
    let platform = Platform::this_host();
    // The library runs use (TBBENCH_VERBS_LIB, e.g. the software device), else the system's.
    let chosen = std::env::var(crate::options::ENV_VERBS_LIB).ok();
    let path = chosen.as_deref().unwrap_or(default_library());
    let lib = Lib::open(path).map_err(|e| super::no_device(&e).to_string())?;
    let mut out = Vec::new();
    // SAFETY: plain library calls; every context opened here is closed, the list freed.
    unsafe {
        let mut n: std::ffi::c_int = 0;
        *super::libc_errno() = 0;
        let list = (lib.get_device_list)(&mut n);
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(super::no_device(&format!(
                "{path} loaded, ibv_get_device_list: {}",
                super::strip_os_error(&e)
            ))
            .to_string());
        }
        for i in 0..n.max(0) as usize {
            let dev = *list.add(i);
            let name = lib.device_name(dev);
            let mut ports = Vec::new();
            let ctx = (lib.open_device)(dev);
            if !ctx.is_null() {
                // Ports are numbered from 1; devices here have one or two.
                for port in 1..=4u8 {
                    let mut a = IbvPortAttr::default();
                    if (lib.query_port)(ctx, port, &mut a) != 0 {
                        break;
                    }
                    ports.push(PortInfo {
                        port,
                        state: port_state(a.state),
                        active_mtu_bytes: profile::mtu_bytes(a.active_mtu),
                        link_layer: if a.link_layer == IBV_LINK_LAYER_ETHERNET {
                            "ethernet".into()
                        } else {
                            "infiniband".into()
                        },
                        lid: a.lid,
                    });
                }
                (lib.close_device)(ctx);
            }
            out.push(DeviceInfo {
                interface: profile::iface_for_device(platform, &name),
                name,
                ports,
                emulated: lib.emulated.is_some(),
            });
        }
        (lib.free_device_list)(list);
    }
    if out.is_empty() {
        return Err(super::no_device(&format!(
            "{path} loaded, ibv_get_device_list found no devices"
        ))
        .to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_states_are_named_as_verbs_h_numbers_them() {
        assert_eq!(port_state(4), "active");
        assert_eq!(port_state(1), "down");
        assert_eq!(port_state(9), "state 9");
    }

    #[test]
    fn this_host_lists_devices_or_says_why_not() {
        match list_devices() {
            Ok(devs) => assert!(devs.iter().all(|d| !d.name.is_empty())),
            Err(e) => {
                assert!(
                    e.contains("no RDMA device") || e.contains("cannot load"),
                    "{e}"
                );
                assert!(!e.contains('\n'));
            }
        }
    }
}
