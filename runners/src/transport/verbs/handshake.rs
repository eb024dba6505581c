//! The connection data each rank publishes at the rendezvous: the largest chunk its queues
//! take, and for every peer the numbers (QPN) and first packet sequence numbers (PSN) of the
//! two queue pairs it made for that peer, with the LID, GID and MTU of the port they are on (a
//! rank cabled to several hosts puts each peer's queue pairs on the device of its cable). A
//! pair with several cables has an entry per cable, numbered by its lane (the cable's place
//! among the pair's). The header's LID, GID and MTU are the first port's. Carried as hex text inside the rank's
//! rendezvous record, so it travels the existing, token-checked rendezvous untouched.
//!
//! Decoding is strict: a record from another tbbench version or a damaged one is refused with
//! a reason rather than half-used to bring up queue pairs that would never talk.

use super::ffi::Gid;
use super::profile::{Platform, Remote};

const MAGIC: &[u8; 4] = b"TBV1";
const VERSION: u8 = 3;
/// The most lanes (cables) one pair may have: jaccl-ring stripes over up to four.
pub const MAX_LANES: usize = 8;
const HEADER: usize = 4 + 4 + 2 + 2 + 4 + 16;
const ENTRY: usize = 2 + 4 * 4 + 2 + 1 + 1 + 16;
/// QPNs and PSNs are 24-bit quantities on the wire.
const MAX_24: u32 = 0x00ff_ffff;

/// Both queue pairs one rank made for one peer: data, and the control one that carries
/// "ready to receive" notices; and the port they are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerQps {
    pub peer: usize,
    /// Which of the pair's cables (0 for the first, or the only one).
    pub lane: usize,
    pub data_qpn: u32,
    pub data_psn: u32,
    pub ctl_qpn: u32,
    pub ctl_psn: u32,
    pub lid: u16,
    /// The port's active MTU (`IBV_MTU_*`).
    pub mtu: u32,
    pub gid: Gid,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub platform: Platform,
    /// The port's active MTU (`IBV_MTU_*`).
    pub mtu: u32,
    pub lid: u16,
    /// The largest chunk this rank's queues take; both ends cut messages at the smaller.
    pub max_chunk: u32,
    pub gid: Gid,
    pub qps: Vec<PeerQps>,
}

impl Hello {
    pub fn encode(&self) -> String {
        let mut b = Vec::with_capacity(HEADER + ENTRY * self.qps.len());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.push(match self.platform {
            Platform::MacOs => 0,
            Platform::Linux => 1,
        });
        b.push(self.mtu as u8);
        b.push(0);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&(self.qps.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.max_chunk.to_le_bytes());
        b.extend_from_slice(&self.gid);
        for q in &self.qps {
            b.extend_from_slice(&(q.peer as u16).to_le_bytes());
            for v in [q.data_qpn, q.data_psn, q.ctl_qpn, q.ctl_psn] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&q.lid.to_le_bytes());
            b.push(q.mtu as u8);
            b.push(q.lane as u8);
            b.extend_from_slice(&q.gid);
        }
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Parses a record from a run of `size` ranks; the error says what is wrong with it.
    pub fn decode(text: &str, size: usize) -> Result<Hello, String> {
        let text = text.trim();
        if text.len() & 1 == 1 || !text.is_ascii() {
            return Err("not hex text".into());
        }
        let b: Vec<u8> = (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| "not hex text".to_string())?;
        if b.len() < HEADER {
            return Err(format!(
                "truncated ({} bytes, the header alone is {HEADER})",
                b.len()
            ));
        }
        if &b[0..4] != MAGIC {
            return Err("not tbbench RDMA connection data".into());
        }
        if b[4] != VERSION {
            return Err(format!(
                "version {} (this tbbench reads version {VERSION})",
                b[4]
            ));
        }
        let platform = match b[5] {
            0 => Platform::MacOs,
            1 => Platform::Linux,
            x => return Err(format!("unknown platform {x}")),
        };
        let mtu_code = |m: u8| {
            let m = m as u32;
            if (1..=5).contains(&m) {
                Ok(m)
            } else {
                Err(format!("MTU code {m} is not an IBV_MTU value"))
            }
        };
        let mtu = mtu_code(b[6])?;
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let lid = u16_at(8);
        let count = u16_at(10) as usize;
        let want = HEADER + count * ENTRY;
        if b.len() != want {
            return Err(format!(
                "{} bytes where {count} queue-pair entries make {want}",
                b.len()
            ));
        }
        let max_chunk = u32_at(12);
        if max_chunk == 0 {
            return Err("a chunk limit of 0 bytes".into());
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let mut qps: Vec<PeerQps> = Vec::with_capacity(count);
        for i in 0..count {
            let o = HEADER + i * ENTRY;
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&b[o + 22..o + 38]);
            let q = PeerQps {
                peer: u16_at(o) as usize,
                lane: b[o + 21] as usize,
                data_qpn: u32_at(o + 2),
                data_psn: u32_at(o + 6),
                ctl_qpn: u32_at(o + 10),
                ctl_psn: u32_at(o + 14),
                lid: u16_at(o + 18),
                mtu: mtu_code(b[o + 20])?,
                gid,
            };
            if q.peer >= size {
                return Err(format!("an entry for rank {} in a run of {size}", q.peer));
            }
            // A pair's lanes come in order, each once: 0, 1, ... up to MAX_LANES.
            let before = qps.iter().filter(|p| p.peer == q.peer).count();
            if q.lane != before {
                return Err(if q.lane < before {
                    format!("two entries for rank {} lane {}", q.peer, q.lane)
                } else {
                    format!("rank {}'s lane {} before its lane {before}", q.peer, q.lane)
                });
            }
            if q.lane >= MAX_LANES {
                return Err(format!("more than {MAX_LANES} cables to rank {}", q.peer));
            }
            if [q.data_qpn, q.data_psn, q.ctl_qpn, q.ctl_psn]
                .iter()
                .any(|v| *v > MAX_24)
            {
                return Err(format!("a QPN or PSN for rank {} exceeds 24 bits", q.peer));
            }
            qps.push(q);
        }
        Ok(Hello {
            platform,
            mtu,
            lid,
            max_chunk,
            gid,
            qps,
        })
    }

    fn entry(&self, me: usize, lane: usize) -> Option<&PeerQps> {
        self.qps.iter().find(|q| q.peer == me && q.lane == lane)
    }

    /// How many lanes (cables) this rank made queue pairs on for rank `me`.
    pub fn lanes_for(&self, me: usize) -> usize {
        self.qps.iter().filter(|q| q.peer == me).count()
    }

    /// The two far ends rank `me` connects to on a lane: (data, control).
    pub fn remotes_for(&self, me: usize, lane: usize) -> Option<(Remote, Remote)> {
        let q = self.entry(me, lane)?;
        let remote = |qpn, psn| Remote {
            lid: q.lid,
            qpn,
            psn,
            gid: q.gid,
        };
        Some((remote(q.data_qpn, q.data_psn), remote(q.ctl_qpn, q.ctl_psn)))
    }

    /// The MTU of the port that rank `me`'s queue pairs on a lane are on.
    pub fn mtu_for(&self, me: usize, lane: usize) -> Option<u32> {
        self.entry(me, lane).map(|q| q.mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Hello {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 2]);
        // Rank 2 is reached on another cable's device.
        let mut other = gid;
        other[12..].copy_from_slice(&[192, 168, 0, 5]);
        let mut second = gid;
        second[12..].copy_from_slice(&[192, 168, 1, 5]);
        Hello {
            platform: Platform::MacOs,
            mtu: 3,
            lid: 0x1234,
            max_chunk: 128 * 4096,
            gid,
            qps: vec![
                PeerQps {
                    peer: 0,
                    lane: 0,
                    data_qpn: 0x00ff_fffe,
                    data_psn: 1,
                    ctl_qpn: 17,
                    ctl_psn: 0x00ab_cdef,
                    lid: 0x1234,
                    mtu: 3,
                    gid,
                },
                PeerQps {
                    peer: 2,
                    lane: 0,
                    data_qpn: 300,
                    data_psn: 0,
                    ctl_qpn: 301,
                    ctl_psn: 0x00ff_ffff,
                    lid: 7,
                    mtu: 4,
                    gid: other,
                },
                // Rank 2's second cable, on a third device.
                PeerQps {
                    peer: 2,
                    lane: 1,
                    data_qpn: 400,
                    data_psn: 5,
                    ctl_qpn: 401,
                    ctl_psn: 6,
                    lid: 8,
                    mtu: 3,
                    gid: second,
                },
            ],
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let h = sample();
        let text = h.encode();
        assert!(text.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(Hello::decode(&text, 3), Ok(h.clone()));
        let linux = Hello {
            platform: Platform::Linux,
            mtu: 5,
            qps: vec![],
            ..h
        };
        assert_eq!(Hello::decode(&linux.encode(), 1), Ok(linux));
    }

    #[test]
    fn remotes_are_the_entry_for_this_rank() {
        let h = sample();
        let (data, ctl) = h.remotes_for(2, 0).unwrap();
        assert_eq!((data.qpn, data.psn), (300, 0));
        assert_eq!((ctl.qpn, ctl.psn), (301, 0x00ff_ffff));
        // The port of the entry, not the header's.
        assert_eq!((data.lid, ctl.lid), (7, 7));
        assert_eq!(data.gid[12..], [192, 168, 0, 5]);
        assert_eq!(h.mtu_for(2, 0), Some(4));
        assert_eq!(h.remotes_for(0, 0).unwrap().0.gid, h.gid);
        assert!(h.remotes_for(1, 0).is_none(), "no entry for rank 1");
        // A second cable to rank 2: its own queue pairs, port and MTU.
        assert_eq!((h.lanes_for(2), h.lanes_for(0), h.lanes_for(1)), (2, 1, 0));
        let (data, ctl) = h.remotes_for(2, 1).unwrap();
        assert_eq!((data.qpn, ctl.qpn, data.lid), (400, 401, 8));
        assert_eq!(data.gid[12..], [192, 168, 1, 5]);
        assert_eq!(h.mtu_for(2, 1), Some(3));
        assert!(h.remotes_for(2, 2).is_none());
    }

    #[test]
    fn truncated_input_is_refused() {
        let text = sample().encode();
        for cut in [0, 2, 10, 2 * HEADER, text.len() - 2] {
            let e = Hello::decode(&text[..cut], 3).unwrap_err();
            assert!(
                e.contains("truncated") || e.contains("where"),
                "cut at {cut}: {e}"
            );
        }
        assert!(
            Hello::decode(&text[..text.len() - 1], 3).is_err(),
            "odd length"
        );
        let mut longer = text.clone();
        longer.push_str("00");
        assert!(Hello::decode(&longer, 3).is_err(), "trailing bytes");
    }

    #[test]
    fn garbled_input_is_refused_with_a_reason() {
        let text = sample().encode();
        let flip = |at: usize, with: &str| {
            let mut t = text.clone();
            t.replace_range(at..at + 2, with);
            t
        };
        assert!(Hello::decode("zz", 3).unwrap_err().contains("hex"));
        assert!(Hello::decode(&flip(0, "55"), 3)
            .unwrap_err()
            .contains("not tbbench"));
        assert!(Hello::decode(&flip(8, "01"), 3)
            .unwrap_err()
            .contains("version 1"));
        assert!(Hello::decode(&flip(10, "07"), 3)
            .unwrap_err()
            .contains("platform"));
        assert!(Hello::decode(&flip(12, "09"), 3)
            .unwrap_err()
            .contains("MTU"));
        let mut no_chunk = text.clone();
        no_chunk.replace_range(24..32, "00000000");
        assert!(Hello::decode(&no_chunk, 3)
            .unwrap_err()
            .contains("chunk limit"));
        // The first entry's peer (rank 0) becomes rank 2: a duplicate.
        let dup = flip(2 * HEADER, "02");
        assert!(Hello::decode(&dup, 3).unwrap_err().contains("two entries"));
        // Rank 2's second cable numbered 2: a lane skipped.
        let skipped = flip(2 * (2 * ENTRY + HEADER + 21), "02");
        assert!(Hello::decode(&skipped, 3)
            .unwrap_err()
            .contains("lane 2 before its lane 1"));
        // Rank 2 is outside a run of 2.
        assert!(Hello::decode(&text, 2).unwrap_err().contains("run of 2"));
        // The high byte of the first data QPN makes it wider than 24 bits.
        let wide = flip(2 * (HEADER + 5), "01");
        assert!(Hello::decode(&wide, 3).unwrap_err().contains("24 bits"));
        // The first entry's port MTU code.
        assert!(Hello::decode(&flip(2 * (HEADER + 20), "09"), 3)
            .unwrap_err()
            .contains("MTU"));
    }
}
