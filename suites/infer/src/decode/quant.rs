//! ggml tensor types this decode reads, turned into f32: F32, F16, and the block formats
//! Q4_0, Q4_1 and Q8_0 (32 values per block, one or two f16 scales). Layouts as ggml defines
//! them: Q4 blocks hold the first 16 values in the low nibbles and the next 16 in the high.

use anyhow::{anyhow, bail, Result};

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;

const BLOCK: usize = 32;

fn name(t: u32) -> String {
    match t {
        F32 => "f32".into(),
        F16 => "f16".into(),
        Q4_0 => "q4_0".into(),
        Q4_1 => "q4_1".into(),
        Q8_0 => "q8_0".into(),
        6 => "q5_0".into(),
        7 => "q5_1".into(),
        10..=15 => "a k-quant".into(),
        16..=23 => "an i-quant".into(),
        30 => "bf16".into(),
        other => format!("ggml type {other}"),
    }
}

fn block_bytes(t: u32) -> Result<usize> {
    Ok(match t {
        Q4_0 => 2 + 16,
        Q4_1 => 2 + 2 + 16,
        Q8_0 => 2 + 32,
        other => bail!(
            "{} tensors are not read by tbbench's decode yet (it reads f32, f16, q4_0, q4_1, q8_0)",
            name(other)
        ),
    })
}

/// Whether the decode reads tensors of ggml type `t`.
pub fn known(t: u32) -> bool {
    matches!(t, F32 | F16 | Q4_0 | Q4_1 | Q8_0)
}

/// Bytes that `n` values of type `t` take. `n` comes from a file's tensor shape, so a size
/// that does not fit in memory is an error, not an overflow.
pub fn bytes_of(t: u32, n: usize) -> Result<usize> {
    let bytes = match t {
        F32 => n.checked_mul(4),
        F16 => n.checked_mul(2),
        _ => {
            if !n.is_multiple_of(BLOCK) {
                bail!("{n} values do not fill whole blocks of {BLOCK}");
            }
            (n / BLOCK).checked_mul(block_bytes(t)?)
        }
    };
    bytes.ok_or_else(|| {
        anyhow!(
            "{n} values of {} take more bytes than memory holds",
            name(t)
        )
    })
}

/// IEEE half to single precision, subnormals and infinities included.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise the fraction.
            let mut e = 127 - 15 + 1;
            let mut f = f;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

fn half(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Decodes `out.len()` values of type `t` from `src` (exactly their bytes).
pub fn dequantize(t: u32, src: &[u8], out: &mut [f32]) -> Result<()> {
    let need = bytes_of(t, out.len())?;
    if src.len() != need {
        bail!("{} bytes for {} values (need {need})", src.len(), out.len());
    }
    match t {
        F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes(c.try_into().unwrap());
            }
        }
        F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half(c);
            }
        }
        Q8_0 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(src.chunks_exact(34)) {
                let d = half(b);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * (b[2 + j] as i8) as f32;
                }
            }
        }
        Q4_0 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(src.chunks_exact(18)) {
                let d = half(b);
                for j in 0..16 {
                    o[j] = d * ((b[2 + j] & 0x0f) as i32 - 8) as f32;
                    o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        Q4_1 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(src.chunks_exact(20)) {
                let (d, m) = (half(b), half(&b[2..]));
                for j in 0..16 {
                    o[j] = d * (b[4 + j] & 0x0f) as f32 + m;
                    o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
                }
            }
        }
        _ => unreachable!("bytes_of refused it"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_decode_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.33325195);
        assert_eq!(f16_to_f32(0x0001), 5.9604645e-8); // smallest subnormal
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
    }

    #[test]
    fn block_formats_follow_ggml_layouts() {
        // Q4_1: d = 0.5, m = -1; nibble j low = j, high = 15 - j.
        let mut b = vec![0u8; 20];
        b[..2].copy_from_slice(&0x3800u16.to_le_bytes()); // 0.5
        b[2..4].copy_from_slice(&0xbc00u16.to_le_bytes()); // -1.0
        for j in 0..16 {
            b[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; 32];
        dequantize(Q4_1, &b, &mut out).unwrap();
        assert_eq!(out[0], -1.0);
        assert_eq!(out[3], 0.5);
        assert_eq!(out[16], 6.5);
        assert_eq!(out[31], -1.0);
        // Q8_0: d = 2, values -3 and 5.
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&0x4000u16.to_le_bytes());
        b[2] = (-3i8) as u8;
        b[33] = 5;
        dequantize(Q8_0, &b, &mut out).unwrap();
        assert_eq!((out[0], out[1], out[31]), (-6.0, 0.0, 10.0));
        // Q4_0: d = 1, nibble 8 is zero.
        let mut b = vec![0x88u8; 18];
        b[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[2] = 0x9f; // low 15 -> 7, high 9 -> 1
        dequantize(Q4_0, &b, &mut out).unwrap();
        assert_eq!((out[0], out[16], out[1]), (7.0, 1.0, 0.0));
    }

    #[test]
    fn unsupported_types_and_sizes_are_named() {
        let e = bytes_of(12, 256).unwrap_err().to_string();
        assert!(e.contains("k-quant") && e.contains("q4_1"), "{e}");
        assert!(bytes_of(Q8_0, 33)
            .unwrap_err()
            .to_string()
            .contains("whole blocks"));
        let mut out = [0f32; 32];
        assert!(dequantize(Q8_0, &[0u8; 10], &mut out).is_err());
    }
}
