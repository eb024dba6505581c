//! The element types collectives move and reduce: f32, f64, and the two 16-bit floats models
//! ship in (IEEE half and bfloat16), with the reductions each supports.
//!
//! 16-bit sums are computed in f32 and rounded back per element, as NCCL and MPI
//! implementations do for half types; `half` converts with F16C where the CPU has it
//! (detected at run time) and by bit manipulation elsewhere.

use super::ReduceOp;
use half::{bf16, f16};

/// An element type by name, as results and flags spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
}

impl Dtype {
    pub const ALL: [Dtype; 4] = [Dtype::F32, Dtype::F64, Dtype::F16, Dtype::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    pub fn parse(s: &str) -> Result<Dtype, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => Ok(Dtype::F32),
            "f64" | "double" | "float64" => Ok(Dtype::F64),
            "f16" | "half" | "float16" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            other => Err(format!(
                "unknown dtype '{other}' (use f32, f64, f16 or bf16)"
            )),
        }
    }

    /// The largest integer up to which every integer is exact in this type: sums of small
    /// integers that stay below it come out the same whatever order ranks add them in.
    pub fn exact_integers(self) -> f64 {
        match self {
            Dtype::F32 => (1u64 << 24) as f64,
            Dtype::F64 => (1u64 << 53) as f64,
            Dtype::F16 => 2048.0,
            Dtype::Bf16 => 256.0,
        }
    }
}

/// A plain number type collectives can send as bytes and reduce.
///
/// # Safety
/// Implementors must be plain old data: no padding, every bit pattern a valid value, so a
/// received byte buffer can be viewed as a slice of them.
pub unsafe trait Element: Copy + Send + Sync + Default + PartialEq + 'static {
    const DTYPE: Dtype;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `acc[i] = acc[i] op other[i]`. Commutative for every op (sum by IEEE addition, max and
    /// min by the total order), so two partners combining the same pair agree bit for bit.
    fn combine(acc: &mut [Self], other: &[Self], op: ReduceOp);
}

/// Max and min by IEEE's total order: plain comparisons cannot order NaN and may return either
/// zero of ±0, and two partners would then disagree.
macro_rules! total_order_combine {
    ($acc:expr, $other:expr, $op:expr, $cmp:expr) => {
        match $op {
            ReduceOp::Max => {
                for (a, b) in $acc.iter_mut().zip($other) {
                    if $cmp(b, a).is_gt() {
                        *a = *b;
                    }
                }
            }
            ReduceOp::Min => {
                for (a, b) in $acc.iter_mut().zip($other) {
                    if $cmp(b, a).is_lt() {
                        *a = *b;
                    }
                }
            }
            ReduceOp::Sum => unreachable!(),
        }
    };
}

// SAFETY: f32 and f64 are plain old data.
unsafe impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        match op {
            // A plain loop over zipped slices: the compiler vectorises it (no reassociation
            // is needed, each element is its own sum).
            ReduceOp::Sum => acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b),
            _ => total_order_combine!(acc, other, op, |b: &f32, a: &f32| b.total_cmp(a)),
        }
    }
}

unsafe impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn combine(acc: &mut [f64], other: &[f64], op: ReduceOp) {
        match op {
            ReduceOp::Sum => acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b),
            _ => total_order_combine!(acc, other, op, |b: &f64, a: &f64| b.total_cmp(a)),
        }
    }
}

/// 16-bit sums in blocks: both sides widened to f32 (vectorised conversions where the CPU
/// has them), added, and narrowed back.
fn sum_16bit<T: Copy>(
    acc: &mut [T],
    other: &[T],
    widen: fn(&[T], &mut [f32]),
    narrow: fn(&[f32], &mut [T]),
) {
    const BLOCK: usize = 256;
    let (mut a32, mut b32) = ([0f32; BLOCK], [0f32; BLOCK]);
    for (a, b) in acc.chunks_mut(BLOCK).zip(other.chunks(BLOCK)) {
        let k = a.len();
        widen(a, &mut a32[..k]);
        widen(b, &mut b32[..k]);
        a32[..k]
            .iter_mut()
            .zip(&b32[..k])
            .for_each(|(x, y)| *x += *y);
        narrow(&a32[..k], a);
    }
}

/// f16 and bf16: the same arithmetic, each through its own conversions.
macro_rules! element_16bit {
    ($t:ty, $dtype:expr) => {
        // SAFETY: both 16-bit types are a u16 with every bit pattern a value.
        unsafe impl Element for $t {
            const DTYPE: Dtype = $dtype;
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn combine(acc: &mut [$t], other: &[$t], op: ReduceOp) {
                use half::slice::HalfFloatSliceExt;
                match op {
                    ReduceOp::Sum => sum_16bit(
                        acc,
                        other,
                        |s, d| s.convert_to_f32_slice(d),
                        |s, d| d.convert_from_f32_slice(s),
                    ),
                    _ => total_order_combine!(acc, other, op, |b: &$t, a: &$t| b.total_cmp(a)),
                }
            }
        }
    };
}

element_16bit!(f16, Dtype::F16);
element_16bit!(bf16, Dtype::Bf16);

/// The bytes of a slice of elements.
pub fn as_bytes<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: Element types are plain old data (the trait's contract).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// The bytes of a slice of elements, writable.
pub fn as_bytes_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: every bit pattern is a valid element (the trait's contract); exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// A byte buffer viewed as elements; its length must be a multiple of the element size and
/// its start aligned for it (transport buffers are page-aligned).
pub fn as_elements_mut<T: Element>(b: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        b.len().is_multiple_of(size)
            && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
        "buffer not aligned for {}",
        T::DTYPE.name()
    );
    // SAFETY: checked length and alignment; every bit pattern is valid (trait contract).
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, b.len() / size) }
}
