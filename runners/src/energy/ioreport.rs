//! macOS: the SoC's energy from IOReport's "Energy Model" channels, as macmon reads them
//! without sudo. A subscription to the group is sampled at the start and at the end of the
//! span; the delta of the two samples holds each channel's energy over the span (64-bit
//! counters: nothing wraps). The library is private, so it is opened at run time
//! (/usr/lib/libIOReport.dylib, CoreFoundation); where it is missing the result says why.
//!
//! Which channels count: the CPU clusters' sum ("CPU Energy", or "DIE_n_CPU Energy" per die
//! on an Ultra), "GPU Energy", the Neural Engine ("ANE", "ANE0", ...), DRAM ("DRAM", ...)
//! and the GPU's SRAM ("GPU SRAM", ...): the parts of the SoC macmon sums. The group's other
//! channels (per-cluster and per-block ones) are parts of those or of blocks outside the
//! compute path and are left out, so nothing counts twice. It is the SoC's energy, not the
//! machine's at the wall (fans, SSD, Thunderbolt controllers and power supply losses are not
//! in it).

/// One channel of a delta sample: its energy over the span, in its own unit.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelDelta {
    pub group: String,
    pub name: String,
    /// "mJ", "uJ" or "nJ".
    pub unit: String,
    pub value: i64,
}

/// The IOReport group that holds the energy channels.
pub const GROUP: &str = "Energy Model";

/// Whether a channel of the energy group is one of the SoC parts summed (see the module).
pub fn summed(name: &str) -> bool {
    name.ends_with("CPU Energy")
        || name == "GPU Energy"
        || name.starts_with("ANE")
        || name.starts_with("DRAM")
        || name.starts_with("GPU SRAM")
}

/// Joules per unit of a channel's value; None for a unit that is not an energy.
fn joules_per(unit: &str) -> Option<f64> {
    match unit.trim() {
        "J" => Some(1.0),
        "mJ" => Some(1e-3),
        "uJ" | "µJ" => Some(1e-6),
        "nJ" => Some(1e-9),
        _ => None,
    }
}

/// The energy of a delta sample: the summed channels' joules and their names; Err when no
/// channel of the group is one of them, or one is in a unit that is not an energy.
pub fn joules(deltas: &[ChannelDelta]) -> Result<(f64, Vec<String>), String> {
    let mut total = 0.0;
    let mut names = Vec::new();
    for d in deltas
        .iter()
        .filter(|d| d.group == GROUP && summed(&d.name))
    {
        let per = joules_per(&d.unit).ok_or_else(|| {
            format!(
                "IOReport channel {:?} is in {:?}, not an energy unit",
                d.name, d.unit
            )
        })?;
        // A counter that went backwards (a reset) adds nothing rather than a negative.
        total += d.value.max(0) as f64 * per;
        names.push(d.name.clone());
    }
    if names.is_empty() {
        return Err(format!(
            "IOReport's {GROUP:?} group has none of the CPU, GPU, ANE or DRAM energy channels"
        ));
    }
    Ok((total, names))
}

#[cfg(target_os = "macos")]
pub use mac::Session;

#[cfg(target_os = "macos")]
mod mac {
    use super::{ChannelDelta, GROUP};
    use std::ffi::{c_char, c_void, CStr, CString};
    use std::time::Instant;

    type Ref = *const c_void;
    const UTF8: u32 = 0x0800_0100;

    // The C signatures (CoreFoundation's published ones; IOReport's as its users call it).
    type StrCreate = unsafe extern "C" fn(Ref, *const c_char, u32) -> Ref;
    type StrGet = unsafe extern "C" fn(Ref, *mut c_char, isize, u32) -> u8;
    type RefRef = unsafe extern "C" fn(Ref, Ref) -> Ref;
    type Count = unsafe extern "C" fn(Ref) -> isize;
    type At = unsafe extern "C" fn(Ref, isize) -> Ref;
    type Release = unsafe extern "C" fn(Ref);
    type InGroup = unsafe extern "C" fn(Ref, Ref, u64, u64, u64) -> Ref;
    type Subscribe = unsafe extern "C" fn(Ref, Ref, *mut Ref, u64, Ref) -> Ref;
    type Three = unsafe extern "C" fn(Ref, Ref, Ref) -> Ref;
    type Get = unsafe extern "C" fn(Ref) -> Ref;
    type Integer = unsafe extern "C" fn(Ref, i32) -> i64;

    /// The IOReport and CoreFoundation entry points, opened once.
    struct Api {
        cf_string_create: StrCreate,
        cf_string_get: StrGet,
        cf_dict_get: RefRef,
        cf_array_count: Count,
        cf_array_at: At,
        cf_release: Release,
        channels_in_group: InGroup,
        subscribe: Subscribe,
        samples: Three,
        delta: Three,
        group: Get,
        name: Get,
        unit: Get,
        integer: Integer,
    }

    // The functions are plain C entry points; the table is read-only once built.
    unsafe impl Send for Api {}
    unsafe impl Sync for Api {}

    const IOREPORT: &str = "/usr/lib/libIOReport.dylib";
    const CORE_FOUNDATION: &str =
        "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation";

    fn open(path: &str) -> Result<*mut c_void, String> {
        let c = CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated path; the handle is kept for the process's life.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!(
                "macOS: cannot open {path} (IOReport's energy counters)"
            ));
        }
        Ok(h)
    }

    fn api() -> Result<&'static Api, String> {
        static API: std::sync::OnceLock<Result<Api, String>> = std::sync::OnceLock::new();
        API.get_or_init(|| {
            let (io, cf) = (open(IOREPORT)?, open(CORE_FOUNDATION)?);
            macro_rules! sym {
                ($h:expr, $name:literal, $ty:ty) => {{
                    // SAFETY: a NUL-terminated name in an open library.
                    let p = unsafe { libc::dlsym($h, concat!($name, "\0").as_ptr().cast()) };
                    if p.is_null() {
                        return Err(format!("macOS: {} lacks {}", IOREPORT, $name));
                    }
                    // SAFETY: the symbol is the C function of the type the field declares
                    // (IOReport's and CoreFoundation's published signatures).
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                }};
            }
            Ok(Api {
                cf_string_create: sym!(cf, "CFStringCreateWithCString", StrCreate),
                cf_string_get: sym!(cf, "CFStringGetCString", StrGet),
                cf_dict_get: sym!(cf, "CFDictionaryGetValue", RefRef),
                cf_array_count: sym!(cf, "CFArrayGetCount", Count),
                cf_array_at: sym!(cf, "CFArrayGetValueAtIndex", At),
                cf_release: sym!(cf, "CFRelease", Release),
                channels_in_group: sym!(io, "IOReportCopyChannelsInGroup", InGroup),
                subscribe: sym!(io, "IOReportCreateSubscription", Subscribe),
                samples: sym!(io, "IOReportCreateSamples", Three),
                delta: sym!(io, "IOReportCreateSamplesDelta", Three),
                group: sym!(io, "IOReportChannelGetGroup", Get),
                name: sym!(io, "IOReportChannelGetChannelName", Get),
                unit: sym!(io, "IOReportChannelGetUnitLabel", Get),
                integer: sym!(io, "IOReportSimpleGetIntegerValue", Integer),
            })
        })
        .as_ref()
        .map_err(|e| e.clone())
    }

    impl Api {
        fn cfstr(&self, s: &str) -> Ref {
            let c = CString::new(s).unwrap_or_default();
            // SAFETY: a NUL-terminated UTF-8 string; the caller releases the result.
            unsafe { (self.cf_string_create)(std::ptr::null(), c.as_ptr(), UTF8) }
        }
        fn string(&self, s: Ref) -> String {
            if s.is_null() {
                return String::new();
            }
            let mut buf = [0 as c_char; 256];
            // SAFETY: buf is writable for its length; the string is not owned here.
            let ok = unsafe { (self.cf_string_get)(s, buf.as_mut_ptr(), buf.len() as isize, UTF8) };
            if ok == 0 {
                return String::new();
            }
            // SAFETY: CFStringGetCString wrote a NUL-terminated string into buf.
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        }
        /// The channels of a sample (or of a delta of two).
        fn channels(&self, sample: Ref) -> Vec<ChannelDelta> {
            let key = self.cfstr("IOReportChannels");
            // SAFETY: sample is a live dictionary; key a live string released below.
            let array = unsafe { (self.cf_dict_get)(sample, key) };
            unsafe { (self.cf_release)(key) };
            if array.is_null() {
                return Vec::new();
            }
            // SAFETY: the value under IOReportChannels is an array of channel dictionaries.
            let n = unsafe { (self.cf_array_count)(array) };
            (0..n)
                .map(|i| {
                    let ch = unsafe { (self.cf_array_at)(array, i) };
                    ChannelDelta {
                        group: self.string(unsafe { (self.group)(ch) }),
                        name: self.string(unsafe { (self.name)(ch) }),
                        unit: self.string(unsafe { (self.unit)(ch) }).trim().to_string(),
                        value: unsafe { (self.integer)(ch, 0) },
                    }
                })
                .collect()
        }
    }

    /// A subscription to the energy group and its first sample.
    pub struct Session {
        api: &'static Api,
        channels: Ref,
        subscription: Ref,
        first: Ref,
        pub started: Instant,
    }

    // Used by one thread at a time (started on the rank's thread, finished on it).
    unsafe impl Send for Session {}

    impl Session {
        pub fn start() -> Result<Session, String> {
            let api = api()?;
            let group = api.cfstr(GROUP);
            // SAFETY: a live string; null subgroup means every subgroup.
            let channels = unsafe { (api.channels_in_group)(group, std::ptr::null(), 0, 0, 0) };
            unsafe { (api.cf_release)(group) };
            if channels.is_null() {
                return Err(format!(
                    "macOS: IOReport has no {GROUP:?} channels on this Mac"
                ));
            }
            let mut out: Ref = std::ptr::null();
            // SAFETY: channels is the dictionary IOReport just gave; out receives a dictionary.
            let subscription = unsafe {
                (api.subscribe)(std::ptr::null(), channels, &mut out, 0, std::ptr::null())
            };
            if subscription.is_null() {
                unsafe { (api.cf_release)(channels) };
                return Err("macOS: IOReport refused a subscription to its energy channels".into());
            }
            // SAFETY: a live subscription and its channels.
            let first = unsafe { (api.samples)(subscription, channels, std::ptr::null()) };
            if first.is_null() {
                unsafe {
                    (api.cf_release)(subscription);
                    (api.cf_release)(channels);
                }
                return Err("macOS: IOReport gave no sample of its energy channels".into());
            }
            let s = Session {
                api,
                channels,
                subscription,
                first,
                started: Instant::now(),
            };
            // The channels exist and are energies, or say why not now rather than at the end.
            super::joules(&api.channels(first))?;
            Ok(s)
        }

        /// The summed channels' names (what `tbbench env` lists).
        pub fn names(&self) -> Vec<String> {
            super::joules(&self.api.channels(self.first))
                .map(|(_, n)| n)
                .unwrap_or_default()
        }

        /// Joules since the start, and the channels summed.
        pub fn finish(self) -> Result<(f64, Vec<String>), String> {
            let api = self.api;
            // SAFETY: the live subscription and channels of this session.
            let last = unsafe { (api.samples)(self.subscription, self.channels, std::ptr::null()) };
            if last.is_null() {
                return Err("macOS: IOReport gave no closing sample".into());
            }
            // SAFETY: two samples of one subscription.
            let delta = unsafe { (api.delta)(self.first, last, std::ptr::null()) };
            unsafe { (api.cf_release)(last) };
            if delta.is_null() {
                return Err("macOS: IOReport gave no delta of its samples".into());
            }
            let r = super::joules(&api.channels(delta));
            unsafe { (api.cf_release)(delta) };
            r
        }
    }

    impl Drop for Session {
        fn drop(&mut self) {
            // SAFETY: each was created for this session and is released once.
            unsafe {
                (self.api.cf_release)(self.first);
                (self.api.cf_release)(self.subscription);
                (self.api.cf_release)(self.channels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(name: &str, unit: &str, value: i64) -> ChannelDelta {
        ChannelDelta {
            group: GROUP.into(),
            name: name.into(),
            unit: unit.into(),
            value,
        }
    }

    // Deltas shaped as IOReport gives them (the group, channel names and unit labels macmon
    // reads), built here: no Mac has recorded them for this repository.
    #[test]
    fn the_soc_parts_are_summed_in_their_units_and_nothing_twice() {
        let d = vec![
            ch("CPU Energy", "mJ", 12_000),
            ch("GPU Energy", "nJ", 3_000_000_000),
            ch("ANE", "mJ", 500),
            ch("DRAM", "mJ", 1_500),
            ch("GPU SRAM", "uJ", 250_000),
            // Parts of the above (clusters) or blocks outside the compute path: left out.
            ch("EACC_CPU", "mJ", 4_000),
            ch("PACC0_CPU", "mJ", 8_000),
            ch("DISP", "mJ", 900),
            ChannelDelta {
                group: "CPU Stats".into(),
                ..ch("CPU Energy", "mJ", 99_000)
            },
        ];
        let (j, names) = joules(&d).unwrap();
        assert!((j - (12.0 + 3.0 + 0.5 + 1.5 + 0.25)).abs() < 1e-9, "{j}");
        assert_eq!(
            names,
            ["CPU Energy", "GPU Energy", "ANE", "DRAM", "GPU SRAM"]
        );
    }

    #[test]
    fn an_ultra_counts_each_dies_cpu_and_every_ane() {
        let d = vec![
            ch("DIE_0_CPU Energy", "mJ", 10_000),
            ch("DIE_1_CPU Energy", "mJ", 9_000),
            ch("GPU Energy", "mJ", 20_000),
            ch("ANE0_0", "mJ", 100),
            ch("ANE0_1", "mJ", 100),
            ch("DRAM0", "mJ", 2_000),
        ];
        let (j, names) = joules(&d).unwrap();
        assert!((j - 41.2).abs() < 1e-9, "{j}");
        assert_eq!(names.len(), 6);
    }

    #[test]
    fn no_energy_channel_or_a_foreign_unit_says_why() {
        assert!(joules(&[ch("DISP", "mJ", 5)])
            .unwrap_err()
            .contains("none of the CPU, GPU, ANE or DRAM"));
        assert!(joules(&[ch("CPU Energy", "mW", 5)])
            .unwrap_err()
            .contains("not an energy unit"));
        // A counter that went backwards adds nothing.
        assert_eq!(joules(&[ch("CPU Energy", "mJ", -5)]).unwrap().0, 0.0);
    }
}
