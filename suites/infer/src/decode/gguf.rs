//! Reading GGUF files (llama.cpp's model format, version 2 and 3): the metadata, the tensor
//! table, and each tensor's bytes. The file is read whole into memory; models this decode is
//! meant for (a few hundred MB) fit, and every rank then slices what it needs.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
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

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: dims[0] is the row length (the fastest-moving index).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// From the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

pub struct Gguf {
    pub meta: BTreeMap<String, Meta>,
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
    data_start: usize,
}

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| anyhow!("truncated at byte {}", self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn value(&mut self, t: u32, depth: usize) -> Result<Meta> {
        Ok(match t {
            0 => Meta::Uint(self.take(1)?[0] as u64),
            1 => Meta::Int(self.take(1)?[0] as i8 as i64),
            2 => Meta::Uint(u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as u64),
            3 => Meta::Int(i16::from_le_bytes(self.take(2)?.try_into().unwrap()) as i64),
            4 => Meta::Uint(self.u32()? as u64),
            5 => Meta::Int(self.u32()? as i32 as i64),
            6 => Meta::Float(f32::from_le_bytes(self.take(4)?.try_into().unwrap()) as f64),
            7 => Meta::Bool(self.take(1)?[0] != 0),
            8 => Meta::Str(self.string()?),
            9 => {
                if depth > 2 {
                    bail!("arrays nested too deep");
                }
                let et = self.u32()?;
                let n = self.u64()?;
                // Each element takes at least one byte: a count beyond the file is corrupt.
                if n as usize > self.b.len() - self.pos {
                    bail!("array of {n} elements runs past the end");
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                Meta::Array(v)
            }
            10 => Meta::Uint(self.u64()?),
            11 => Meta::Int(self.u64()? as i64),
            12 => Meta::Float(f64::from_le_bytes(self.take(8)?.try_into().unwrap())),
            other => bail!("unknown metadata type {other}"),
        })
    }
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Gguf::parse(bytes).with_context(|| format!("{} is not a usable GGUF file", path.display()))
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Gguf> {
        let mut r = Reader { b: &bytes, pos: 0 };
        let magic = r.u32()?;
        if magic != MAGIC {
            bail!("no GGUF magic (starts with {magic:#010x})");
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            bail!("GGUF version {version} (this reads 2 and 3)");
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let mut meta = BTreeMap::new();
        for _ in 0..n_kv {
            let k = r.string()?;
            let t = r.u32()?;
            let v = r.value(t, 0).with_context(|| format!("metadata {k}"))?;
            meta.insert(k, v);
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let nd = r.u32()?;
            if nd > 4 {
                bail!("tensor {name} has {nd} dimensions");
            }
            let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let align = match meta.get("general.alignment") {
            Some(Meta::Uint(a)) if *a > 0 => *a as usize,
            _ => 32,
        };
        let data_start = r.pos.div_ceil(align) * align;
        let g = Gguf {
            meta,
            tensors,
            bytes,
            data_start,
        };
        for t in &g.tensors {
            let len =
                super::quant::bytes_of(t.ggml_type, t.elements() as usize).unwrap_or(0) as u64;
            if g.data_start as u64 + t.offset + len > g.bytes.len() as u64 {
                bail!(
                    "tensor {} runs past the end of the file (truncated?)",
                    t.name
                );
            }
        }
        Ok(g)
    }

    pub fn uint(&self, key: &str) -> Result<u64> {
        match self.meta.get(key) {
            Some(Meta::Uint(v)) => Ok(*v),
            Some(Meta::Int(v)) if *v >= 0 => Ok(*v as u64),
            Some(other) => bail!("metadata {key} is {other:?}, not a count"),
            None => bail!("metadata {key} is missing"),
        }
    }

    pub fn float(&self, key: &str) -> Result<f64> {
        match self.meta.get(key) {
            Some(Meta::Float(v)) => Ok(*v),
            Some(Meta::Uint(v)) => Ok(*v as f64),
            Some(other) => bail!("metadata {key} is {other:?}, not a number"),
            None => bail!("metadata {key} is missing"),
        }
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        match self.meta.get(key) {
            Some(Meta::Str(s)) => Ok(s),
            Some(other) => bail!("metadata {key} is {other:?}, not a string"),
            None => bail!("metadata {key} is missing"),
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        match self.meta.get(key) {
            Some(Meta::Array(v)) => v
                .iter()
                .map(|m| match m {
                    Meta::Str(s) => Ok(s.as_str()),
                    other => bail!("metadata {key} holds {other:?}, not strings"),
                })
                .collect(),
            Some(other) => bail!("metadata {key} is {other:?}, not a list"),
            None => bail!("metadata {key} is missing"),
        }
    }

    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| anyhow!("the model has no tensor {name}"))
    }

    /// A tensor's raw bytes (its ggml type decides how to read them).
    pub fn data(&self, t: &TensorInfo) -> Result<&[u8]> {
        let len = super::quant::bytes_of(t.ggml_type, t.elements() as usize)?;
        let start = self.data_start + t.offset as usize;
        Ok(&self.bytes[start..start + len])
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A tiny GGUF in memory: one metadata string, one F32 tensor of 4 values.
    pub fn tiny() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(MAGIC.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(2u64.to_le_bytes()); // kv
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        };
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "llama.block_count");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        s(&mut b, "w");
        b.extend(1u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // F32
        b.extend(0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for v in [1.0f32, 2.0, 3.0, 4.0] {
            b.extend(v.to_le_bytes());
        }
        b
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
            .contains("no tensor nope"));
        assert!(g
            .uint("missing")
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let b = tiny();
        let e = |b: Vec<u8>| format!("{:#}", Gguf::parse(b).err().expect("refused"));
        assert!(e(b"GGML....".to_vec()).contains("no GGUF magic"));
        assert!(e(b[..b.len() - 8].to_vec()).contains("runs past the end"));
        assert!(e(b[..40].to_vec()).contains("truncated"));
        let mut v9 = b.clone();
        v9[4] = 9;
        assert!(e(v9).contains("version 9"));
    }
}
