//! Reading GGUF files (llama.cpp's model format, version 2 and 3): the metadata, the tensor
//! table, and each tensor's bytes. The file is read whole into memory (not mapped: a file cut
//! short while mapped would fault on access); models this decode is meant for (a few hundred
//! MB) fit, and every rank then slices what it needs.
//!
//! Every count, length and offset in a file is checked against the bytes that back it before
//! it is used: a count is refused unless its entries could fit in what is left of the file, so
//! nothing read here takes more memory than a small multiple of the file's size, and every
//! tensor the decode can read lies inside the file. Errors name the field, key or tensor and
//! the byte it was read from, on one line.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::ops::Range;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

impl Meta {
    /// What the value is, short enough for an error line (an array's values are not listed).
    pub fn describe(&self) -> String {
        match self {
            Meta::Uint(v) => format!("the number {v}"),
            Meta::Int(v) => format!("the number {v}"),
            Meta::Float(v) => format!("the number {v}"),
            Meta::Bool(v) => format!("the boolean {v}"),
            Meta::Str(s) => format!("the string {}", quote(s)),
            Meta::Array(v) => format!("an array of {} values", v.len()),
        }
    }
}

/// A name from a file, quoted for an error line: control characters escaped (a newline in a
/// name must not split the line) and anything past 80 characters cut.
pub fn quote(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_debug).collect();
    if s.chars().nth(80).is_some() {
        out.push('…');
    }
    format!("'{out}'")
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: dims[0] is the row length (the fastest-moving index). One to four of them,
    /// their product within u64 (the reader refuses others).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// From the start of the data section.
    pub offset: u64,
    /// Where its entry in the tensor table starts in the file.
    pub at: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        // Saturates rather than wraps: a product past u64 (refused by the reader) stays too
        // big for anything that checks it.
        self.dims
            .iter()
            .try_fold(1u64, |a, d| a.checked_mul(*d))
            .unwrap_or(u64::MAX)
    }

    /// "tensor 'name' (entry at byte N)", for error lines.
    pub fn label(&self) -> String {
        format!("tensor {} (entry at byte {})", quote(&self.name), self.at)
    }
}

pub struct Gguf {
    pub meta: BTreeMap<String, Meta>,
    /// Where each metadata entry starts in the file.
    meta_at: BTreeMap<String, u64>,
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
    /// The file's length: `bytes` holds all of it, or only its start ([`Gguf::open_metadata`]).
    file_len: u64,
    data_start: u64,
}

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian

/// The fewest bytes a metadata entry takes (key length, type, a 1-byte value) and a tensor
/// table entry (name length, dimension count, one dimension, type, offset).
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// The fewest bytes one value of metadata type `t` takes in the file; None for no such type.
fn min_value_bytes(t: u32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12, // element type and count
        _ => return None,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    /// The next `n` bytes of field `what`.
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            bail!(
                "{what} at byte {}: {n} bytes run past the end of the file ({} bytes)",
                self.pos,
                self.b.len()
            );
        }
        // n <= left, which is a usize.
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn le<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.le(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.le(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(&format!("{what} length"))?;
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }

    /// Refuses a count of `n` entries of at least `min` bytes each that the rest of the file
    /// cannot hold, before anything is allocated for them.
    fn fits(&self, n: u64, min: u64, what: &str, at: usize) -> Result<()> {
        if n.checked_mul(min).is_none_or(|b| b > self.left()) {
            bail!(
                "{what} {n} at byte {at}: {n} entries of at least {min} bytes do not fit in the {} bytes left of the file from byte {}",
                self.left(),
                self.pos
            );
        }
        Ok(())
    }

    fn value(&mut self, t: u32, depth: usize) -> Result<Meta> {
        Ok(match t {
            0 => Meta::Uint(self.le::<1>("value")?[0] as u64),
            1 => Meta::Int(self.le::<1>("value")?[0] as i8 as i64),
            2 => Meta::Uint(u16::from_le_bytes(self.le("value")?) as u64),
            3 => Meta::Int(i16::from_le_bytes(self.le("value")?) as i64),
            4 => Meta::Uint(self.u32("value")? as u64),
            5 => Meta::Int(self.u32("value")? as i32 as i64),
            6 => Meta::Float(f32::from_le_bytes(self.le("value")?) as f64),
            7 => Meta::Bool(self.le::<1>("value")?[0] != 0),
            8 => Meta::Str(self.string("string")?),
            9 => {
                let at = self.pos;
                if depth > 2 {
                    bail!("array at byte {at}: arrays nested more than 3 deep");
                }
                let et = self.u32("array element type")?;
                let min = min_value_bytes(et)
                    .ok_or_else(|| anyhow!("array at byte {at}: unknown element type {et}"))?;
                let n_at = self.pos;
                let n = self.u64("array length")?;
                self.fits(n, min, "array length", n_at)?;
                // n * min <= bytes left, so n fits in a usize.
                let mut v = Vec::with_capacity(n as usize);
                for j in 0..n {
                    v.push(
                        self.value(et, depth + 1)
                            .with_context(|| format!("element {j} of {n}"))?,
                    );
                }
                Meta::Array(v)
            }
            10 => Meta::Uint(self.u64("value")?),
            11 => Meta::Int(self.u64("value")? as i64),
            12 => Meta::Float(f64::from_le_bytes(self.le("value")?)),
            other => bail!("unknown metadata type {other} at byte {}", self.pos - 4),
        })
    }
}

/// The first `limit` bytes of a regular file (all of it when shorter) and the file's length,
/// as it was when opened: a file that grows meanwhile is not read further; one that shrinks
/// reads short and is then refused as truncated; only a regular file (a device would never
/// end). The buffer is reserved fallibly, so a length no memory holds is one error line.
fn read_prefix(path: &Path, limit: u64) -> Result<(Vec<u8>, u64)> {
    let f = std::fs::File::open(path).context("cannot open it")?;
    let m = f.metadata().context("cannot stat it")?;
    if !m.is_file() {
        bail!("not a regular file");
    }
    let len = m.len();
    let n = limit.min(len);
    let mut bytes = Vec::new();
    usize::try_from(n)
        .ok()
        .and_then(|n| bytes.try_reserve_exact(n).ok())
        .ok_or_else(|| anyhow!("its {n} bytes do not fit in memory"))?;
    f.take(n)
        .read_to_end(&mut bytes)
        .context("cannot read it")?;
    Ok((bytes, len))
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf> {
        read_prefix(path, u64::MAX)
            .and_then(|(bytes, _)| Gguf::parse(bytes))
            .with_context(|| path.display().to_string())
    }

    /// The metadata and the tensor table only, for a reader that needs the model's shape and
    /// not its weights (`tbbench predict`): the file's first 8 MiB, four times more while the
    /// header runs past what was read, so a 40 GB model costs its header's bytes. Tensors are
    /// checked against the file's length as [`Gguf::open`] checks them; their data is not
    /// there to read.
    pub fn open_metadata(path: &Path) -> Result<Gguf> {
        Self::open_metadata_from(path, 8 << 20)
    }

    pub(crate) fn open_metadata_from(path: &Path, first: u64) -> Result<Gguf> {
        (|| {
            let mut want = first.max(64);
            loop {
                let (bytes, len) = read_prefix(path, want)?;
                match Gguf::parse_with_len(bytes, len) {
                    // The header may run past what was read: read more and try again; the
                    // whole file's error is the one to report (a file that shrank meanwhile
                    // ends the loop there too).
                    Err(_) if want < len => want = want.saturating_mul(4),
                    other => return other,
                }
            }
        })()
        .with_context(|| path.display().to_string())
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Gguf> {
        let len = bytes.len() as u64;
        Self::parse_with_len(bytes, len)
    }

    /// `bytes` is the start of a file of `file_len` bytes (all of it, for [`Gguf::parse`]).
    fn parse_with_len(bytes: Vec<u8>, file_len: u64) -> Result<Gguf> {
        let mut r = Reader { b: &bytes, pos: 0 };
        let magic = r.u32("magic")?;
        if magic != MAGIC {
            bail!("no GGUF magic (starts with {magic:#010x})");
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            bail!("GGUF version {version} at byte 4 (this reads 2 and 3)");
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        r.fits(n_kv, MIN_KV_BYTES, "metadata count", 16)?;
        let mut meta = BTreeMap::new();
        let mut meta_at = BTreeMap::new();
        for i in 0..n_kv {
            let at = r.pos;
            let k = r
                .string("key")
                .with_context(|| format!("metadata entry {i} of {n_kv} (at byte {at})"))?;
            let ctx = || format!("metadata {} (at byte {at})", quote(&k));
            let t = r.u32("type").with_context(ctx)?;
            let v = r.value(t, 0).with_context(ctx)?;
            if meta.insert(k.clone(), v).is_some() {
                bail!("{}: the key appears twice", ctx());
            }
            meta_at.insert(k, at as u64);
        }
        r.fits(n_tensors, MIN_TENSOR_BYTES, "tensor count", 8)?;
        // n_tensors * MIN_TENSOR_BYTES <= bytes left, so it fits in a usize.
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = HashSet::new();
        for i in 0..n_tensors {
            let at = r.pos;
            let name = r
                .string("name")
                .with_context(|| format!("tensor entry {i} of {n_tensors} (at byte {at})"))?;
            let ctx = || format!("tensor {} (entry at byte {at})", quote(&name));
            let nd_at = r.pos;
            let nd = r.u32("dimension count").with_context(ctx)?;
            if !(1..=4).contains(&nd) {
                bail!(
                    "{}: {nd} dimensions at byte {nd_at} (ggml has 1 to 4)",
                    ctx()
                );
            }
            let dims = (0..nd)
                .map(|_| r.u64("dimension"))
                .collect::<Result<Vec<_>>>()
                .with_context(ctx)?;
            if dims
                .iter()
                .try_fold(1u64, |a, d| a.checked_mul(*d))
                .is_none()
            {
                bail!("{}: dimensions {dims:?} hold more than 2^64 values", ctx());
            }
            let ggml_type = r.u32("type").with_context(ctx)?;
            let offset = r.u64("data offset").with_context(ctx)?;
            if !names.insert(name.clone()) {
                bail!("{}: a second tensor of that name", ctx());
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                at: at as u64,
            });
        }
        let align = match meta.get("general.alignment") {
            None => 32,
            Some(Meta::Uint(a)) if a.is_power_of_two() => *a,
            Some(other) => bail!(
                "metadata 'general.alignment' (at byte {}) is {}, not a power of two",
                meta_at.get("general.alignment").copied().unwrap_or(0),
                other.describe()
            ),
        };
        let data_start = (r.pos as u64)
            .div_ceil(align)
            .checked_mul(align)
            .ok_or_else(|| anyhow!("alignment {align} puts the data section past any file"))?;
        let g = Gguf {
            meta,
            meta_at,
            tensors,
            bytes,
            file_len,
            data_start,
        };
        for t in &g.tensors {
            // Tensors of types the decode cannot read have no known size; they are refused
            // if the model needs them (data() names the type).
            if super::quant::known(t.ggml_type) {
                g.span(t)?;
            }
        }
        Ok(g)
    }

    /// "metadata 'key' (at byte N)", for error lines.
    fn key(&self, key: &str) -> String {
        match self.meta_at.get(key) {
            Some(at) => format!("metadata {} (at byte {at})", quote(key)),
            None => format!("metadata {}", quote(key)),
        }
    }

    pub fn uint(&self, key: &str) -> Result<u64> {
        match self.meta.get(key) {
            Some(Meta::Uint(v)) => Ok(*v),
            Some(Meta::Int(v)) if *v >= 0 => Ok(*v as u64),
            Some(other) => bail!("{} is {}, not a count", self.key(key), other.describe()),
            None => bail!("{} is missing", self.key(key)),
        }
    }

    /// A count that must fit in a usize, be at least `min`, and at most `max` (a bound the
    /// caller derives from what the file holds).
    pub fn count(&self, key: &str, min: u64, max: u64) -> Result<usize> {
        let v = self.uint(key)?;
        if v < min || v > max {
            bail!("{} is {v}, outside {min}..={max}", self.key(key));
        }
        usize::try_from(v)
            .map_err(|_| anyhow!("{} is {v}, past this machine's sizes", self.key(key)))
    }

    pub fn float(&self, key: &str) -> Result<f64> {
        match self.meta.get(key) {
            Some(Meta::Float(v)) => Ok(*v),
            Some(Meta::Uint(v)) => Ok(*v as f64),
            Some(other) => bail!("{} is {}, not a number", self.key(key), other.describe()),
            None => bail!("{} is missing", self.key(key)),
        }
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        match self.meta.get(key) {
            Some(Meta::Str(s)) => Ok(s),
            Some(other) => bail!("{} is {}, not a string", self.key(key), other.describe()),
            None => bail!("{} is missing", self.key(key)),
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        match self.meta.get(key) {
            Some(Meta::Array(v)) => v
                .iter()
                .enumerate()
                .map(|(i, m)| match m {
                    Meta::Str(s) => Ok(s.as_str()),
                    other => bail!(
                        "{} holds {} at index {i}, not a string",
                        self.key(key),
                        other.describe()
                    ),
                })
                .collect(),
            Some(other) => bail!("{} is {}, not a list", self.key(key), other.describe()),
            None => bail!("{} is missing", self.key(key)),
        }
    }

    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| anyhow!("the model has no tensor {}", quote(name)))
    }

    /// Where a tensor's bytes lie in the file: refused if its type is not one the decode
    /// reads, its size overflows, or it runs past the end.
    fn span(&self, t: &TensorInfo) -> Result<Range<usize>> {
        let len = usize::try_from(t.elements())
            .map_err(|_| anyhow!("{} values, past this machine's sizes", t.elements()))
            .and_then(|n| super::quant::bytes_of(t.ggml_type, n))
            .with_context(|| t.label())?;
        let file = self.file_len;
        let start = self.data_start.checked_add(t.offset);
        match start.and_then(|s| s.checked_add(len as u64)) {
            // end <= file length, a usize.
            Some(end) if end <= file => Ok(end as usize - len..end as usize),
            _ => bail!(
                "tensor {} (entry at byte {}) data at offset {} + {len} bytes lies past the end of the file ({file} bytes)",
                quote(&t.name),
                t.at,
                start.map_or_else(|| format!("{} + {}", self.data_start, t.offset), |s| s.to_string()),
            ),
        }
    }

    /// Err unless a tensor's type is one the decode reads and its data lies within the file
    /// (also for a Gguf read to its header only).
    pub fn check_in_file(&self, t: &TensorInfo) -> Result<()> {
        self.span(t).map(|_| ())
    }

    /// A tensor's raw bytes (its ggml type decides how to read them).
    pub fn data(&self, t: &TensorInfo) -> Result<&[u8]> {
        let r = self.span(t)?;
        self.bytes
            .get(r)
            .ok_or_else(|| anyhow!("{}: data outside the file", t.label()))
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A tensor to write: name, dims (ggml order), ggml type, bytes.
    pub type Tensor = (String, Vec<u64>, u32, Vec<u8>);

    /// Where a written file's fields lie, for tests that damage them on purpose.
    #[derive(Debug, Default, Clone)]
    pub struct Layout {
        /// (byte, width) of every count, length, type, dimension and offset field.
        pub fields: Vec<(usize, usize)>,
        /// Where each region starts: header, each metadata entry, each tensor entry, the data
        /// section, each tensor's data.
        pub regions: Vec<usize>,
    }

    fn meta_type(m: &Meta) -> u32 {
        match m {
            Meta::Uint(v) if *v <= u32::MAX as u64 => 4,
            Meta::Uint(_) => 10,
            Meta::Int(v) if i32::try_from(*v).is_ok() => 5,
            Meta::Int(_) => 11,
            Meta::Float(_) => 6,
            Meta::Bool(_) => 7,
            Meta::Str(_) => 8,
            Meta::Array(_) => 9,
        }
    }

    fn put(b: &mut Vec<u8>, l: &mut Layout, field: &[u8]) {
        l.fields.push((b.len(), field.len()));
        b.extend(field);
    }

    fn put_str(b: &mut Vec<u8>, l: &mut Layout, s: &str) {
        put(b, l, &(s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    fn put_value(b: &mut Vec<u8>, l: &mut Layout, m: &Meta) {
        match m {
            Meta::Uint(v) if *v <= u32::MAX as u64 => b.extend((*v as u32).to_le_bytes()),
            Meta::Uint(v) => b.extend(v.to_le_bytes()),
            Meta::Int(v) => match i32::try_from(*v) {
                Ok(v) => b.extend(v.to_le_bytes()),
                Err(_) => b.extend(v.to_le_bytes()),
            },
            Meta::Float(v) => b.extend((*v as f32).to_le_bytes()),
            Meta::Bool(v) => b.push(*v as u8),
            Meta::Str(s) => put_str(b, l, s),
            Meta::Array(v) => {
                let et = v.first().map_or(4, meta_type);
                put(b, l, &et.to_le_bytes());
                put(b, l, &(v.len() as u64).to_le_bytes());
                for e in v {
                    put_value(b, l, e);
                }
            }
        }
    }

    /// A GGUF version 3 file with these metadata entries and tensors (each tensor's data
    /// aligned to 32, the file ending where the last tensor does), and where its fields lie.
    pub fn write_laid_out(kvs: &[(&str, Meta)], tensors: &[Tensor]) -> (Vec<u8>, Layout) {
        let mut l = Layout::default();
        let mut b = Vec::new();
        l.regions.push(0);
        b.extend(MAGIC.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        put(&mut b, &mut l, &(tensors.len() as u64).to_le_bytes());
        put(&mut b, &mut l, &(kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            l.regions.push(b.len());
            put_str(&mut b, &mut l, k);
            put(&mut b, &mut l, &meta_type(v).to_le_bytes());
            put_value(&mut b, &mut l, v);
        }
        let mut offset = 0u64;
        for (name, dims, t, data) in tensors {
            l.regions.push(b.len());
            put_str(&mut b, &mut l, name);
            put(&mut b, &mut l, &(dims.len() as u32).to_le_bytes());
            for d in dims {
                put(&mut b, &mut l, &d.to_le_bytes());
            }
            put(&mut b, &mut l, &t.to_le_bytes());
            put(&mut b, &mut l, &offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for (i, (_, _, _, data)) in tensors.iter().enumerate() {
            if i > 0 {
                while b.len() % 32 != 0 {
                    b.push(0);
                }
            }
            l.regions.push(b.len());
            b.extend(data);
        }
        (b, l)
    }

    pub fn write(kvs: &[(&str, Meta)], tensors: &[Tensor]) -> Vec<u8> {
        write_laid_out(kvs, tensors).0
    }

    /// A tiny GGUF in memory: two metadata entries, one F32 tensor of 4 values.
    pub fn tiny() -> Vec<u8> {
        let data = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write(
            &[
                ("general.architecture", Meta::Str("llama".into())),
                ("llama.block_count", Meta::Uint(7)),
            ],
            &[("w".into(), vec![4], 0, data)],
        )
    }

    fn refusal(b: Vec<u8>) -> String {
        let e = format!("{:#}", Gguf::parse(b).err().expect("refused"));
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let g = Gguf::parse(tiny()).unwrap();
        assert_eq!(g.string("general.architecture").unwrap(), "llama");
        assert_eq!(g.uint("llama.block_count").unwrap(), 7);
        let t = g.info("w").unwrap();
        assert_eq!((t.dims.clone(), t.ggml_type), (vec![4], 0));
        assert_eq!(g.data(t).unwrap().len(), 16);
        assert!(g
            .info("nope")
            .unwrap_err()
            .to_string()
            .contains("no tensor 'nope'"));
        assert!(g
            .uint("missing")
            .unwrap_err()
            .to_string()
            .contains("missing"));
        let e = g.uint("general.architecture").unwrap_err().to_string();
        assert!(
            e.contains("at byte 24") && e.contains("the string 'llama'"),
            "{e}"
        );
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let b = tiny();
        assert!(refusal(b"GGML....".to_vec()).contains("no GGUF magic"));
        let e = refusal(b[..b.len() - 8].to_vec());
        assert!(
            e.contains("tensor 'w'") && e.contains("lies past the end of the file"),
            "{e}"
        );
        let e = refusal(b[..60].to_vec());
        assert!(
            e.contains("metadata 'general.architecture' (at byte 24): string length at byte 56: 8 bytes run past the end of the file (60 bytes)"),
            "{e}"
        );
        let e = refusal(b[..40].to_vec());
        assert!(
            e.contains("metadata count 2 at byte 16: 2 entries of at least 13 bytes do not fit"),
            "{e}"
        );
        let mut v9 = b.clone();
        v9[4] = 9;
        assert!(refusal(v9).contains("version 9"));
    }

    /// Writes `v` over the little-endian field at `at`.
    fn patched(mut b: Vec<u8>, at: usize, v: &[u8]) -> Vec<u8> {
        b[at..at + v.len()].copy_from_slice(v);
        b
    }

    #[test]
    fn counts_past_the_file_are_refused_before_allocating() {
        let b = tiny();
        let e = refusal(patched(b.clone(), 16, &u64::MAX.to_le_bytes()));
        assert!(
            e.contains("metadata count 18446744073709551615 at byte 16"),
            "{e}"
        );
        let e = refusal(patched(b.clone(), 8, &(1u64 << 40).to_le_bytes()));
        assert!(e.contains("tensor count 1099511627776 at byte 8"), "{e}");
        // The key length of the first entry.
        let e = refusal(patched(b, 24, &u64::MAX.to_le_bytes()));
        assert!(
            e.contains("key length") || e.contains("key at byte 32"),
            "{e}"
        );
    }

    #[test]
    fn array_length_past_the_file_is_refused() {
        let tokens = Meta::Array(vec![Meta::Str("a".into()), Meta::Str("b".into())]);
        let (b, l) = write_laid_out(&[("tokenizer.ggml.tokens", tokens)], &[]);
        // Fields: tensor count, kv count, key length, type, element type, array length.
        let at = l.fields[5].0;
        let e = refusal(patched(b, at, &(1u64 << 50).to_le_bytes()));
        assert!(
            e.contains("'tokenizer.ggml.tokens'")
                && e.contains(&format!("array length {} at byte {at}", 1u64 << 50)),
            "{e}"
        );
    }

    #[test]
    fn tensor_offset_past_end_is_refused() {
        let (b, l) = write_laid_out(&[], &[("w".into(), vec![4], 0, vec![0; 16])]);
        let at = l.fields.last().unwrap().0;
        // An offset that wraps when added to the data start.
        let e = refusal(patched(b.clone(), at, &(u64::MAX - 8).to_le_bytes()));
        assert!(
            e.contains("tensor 'w'") && e.contains("past the end"),
            "{e}"
        );
        let e = refusal(patched(b, at, &64u64.to_le_bytes()));
        assert!(
            e.contains("data at offset 128 + 16 bytes lies past the end of the file (80 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn tensor_dimension_product_overflow_is_refused() {
        let (b, l) = write_laid_out(&[], &[("w".into(), vec![4, 1], 0, vec![0; 16])]);
        // Fields: counts, name length, dimension count, dims, type, offset.
        let wide = patched(b.clone(), l.fields[4].0, &(1u64 << 62).to_le_bytes());
        let e = refusal(patched(wide.clone(), l.fields[5].0, &8u64.to_le_bytes()));
        assert!(
            e.contains("tensor 'w' (entry at byte 24): dimensions [4611686018427387904, 8] hold more than 2^64 values"),
            "{e}"
        );
        // Fits u64 but not in bytes: 2^62 f32 values.
        let e = refusal(wide);
        assert!(
            e.contains(
                "tensor 'w' (entry at byte 24): 4611686018427387904 values of f32 take more bytes"
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_dimension_counts_alignment_and_duplicates_are_refused() {
        let (b, l) = write_laid_out(&[], &[("w".into(), vec![4], 0, vec![0; 16])]);
        let e = refusal(patched(b.clone(), l.fields[3].0, &0u32.to_le_bytes()));
        assert!(e.contains("0 dimensions at byte 33"), "{e}");
        let e = refusal(patched(b, l.fields[3].0, &9u32.to_le_bytes()));
        assert!(e.contains("9 dimensions"), "{e}");
        let e = refusal(write(&[("general.alignment", Meta::Uint(0))], &[]));
        assert!(
            e.contains("'general.alignment' (at byte 24) is the number 0"),
            "{e}"
        );
        let w = || ("w".to_string(), vec![4], 0, vec![0; 16]);
        let e = refusal(write(&[], &[w(), w()]));
        assert!(e.contains("a second tensor of that name"), "{e}");
        let e = refusal(write(&[("a", Meta::Uint(1)), ("a", Meta::Uint(2))], &[]));
        assert!(
            e.contains("metadata 'a' (at byte 41): the key appears twice"),
            "{e}"
        );
    }

    #[test]
    fn deep_arrays_and_unknown_types_are_refused() {
        let mut m = Meta::Uint(1);
        for _ in 0..5 {
            m = Meta::Array(vec![m]);
        }
        assert!(refusal(write(&[("a", m)], &[])).contains("nested more than 3 deep"));
        let (b, l) = write_laid_out(&[("a", Meta::Uint(1))], &[]);
        let e = refusal(patched(b, l.fields[3].0, &99u32.to_le_bytes()));
        assert!(
            e.contains("metadata 'a' (at byte 24): unknown metadata type 99 at byte 33"),
            "{e}"
        );
    }

    #[test]
    fn open_names_the_file_and_reads_only_regular_files() {
        let dir = std::env::temp_dir().join(format!("tbbench-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = format!("{:#}", Gguf::open(&dir).err().unwrap());
        assert!(e.ends_with(": not a regular file"), "{e}");
        let f = dir.join("cut.gguf");
        let b = tiny();
        std::fs::write(&f, &b[..b.len() - 8]).unwrap();
        let e = format!("{:#}", Gguf::open(&f).err().unwrap());
        assert!(
            e.starts_with(&format!("{}: tensor 'w'", f.display())) && e.contains("past the end"),
            "{e}"
        );
        std::fs::write(&f, &b).unwrap();
        assert!(Gguf::open(&f).is_ok());
        let e = format!("{:#}", Gguf::open(&dir.join("none.gguf")).err().unwrap());
        assert!(e.contains("none.gguf: cannot open it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_in_errors_are_escaped_and_cut() {
        assert_eq!(quote("a\nb"), "'a\\nb'");
        assert_eq!(quote(&"x".repeat(100)), format!("'{}…'", "x".repeat(80)));
    }
}
