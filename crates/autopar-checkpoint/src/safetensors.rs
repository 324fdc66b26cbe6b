//! safetensors: 8-byte little-endian header length, a JSON header, then the data. Reading takes
//! the header with two small reads and never touches tensor bytes; writing lays out the header
//! from the tensor list first (sorted names, as MindSpore and the safetensors library do) and
//! then streams each tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};

use crate::dtype::DType;
use crate::error::{CheckpointError, Misuse, Result};
use crate::io::AtomicFile;
use crate::TensorEntry;

/// Headers larger than this are refused as corrupt (the safetensors library uses 100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

pub(crate) struct Parsed {
    pub tensors: Vec<TensorEntry>,
    pub metadata: BTreeMap<String, String>,
}

pub(crate) fn parse_index(path: &Path, file: &mut File, file_len: u64) -> Result<Parsed> {
    let malformed = |reason: String| CheckpointError::Malformed { path: path.to_path_buf(), reason };
    if file_len < 8 {
        return Err(CheckpointError::Truncated { path: path.to_path_buf(), what: "header length".into(), needed: 8, len: file_len });
    }
    let mut n8 = [0u8; 8];
    file.read_exact(&mut n8).map_err(CheckpointError::io("read", path))?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER_BYTES || n > file_len - 8 {
        if n <= MAX_HEADER_BYTES {
            return Err(CheckpointError::Truncated { path: path.to_path_buf(), what: "JSON header".into(), needed: 8 + n, len: file_len });
        }
        return Err(CheckpointError::HeaderTooLarge { path: path.to_path_buf(), len: n, file_len });
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(CheckpointError::io("read", path))?;
    let json: Value = serde_json::from_slice(&header).map_err(|e| malformed(format!("the JSON header does not parse: {e}")))?;
    let Value::Object(obj) = json else {
        return Err(malformed("the JSON header is not an object".into()));
    };
    let data_start = 8 + n;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            let Value::Object(m) = v else {
                return Err(malformed("__metadata__ is not an object".into()));
            };
            for (k, v) in m {
                match v {
                    Value::String(s) => metadata.insert(k, s),
                    other => metadata.insert(k, other.to_string()),
                };
            }
            continue;
        }
        let bad = |what: &str| malformed(format!("tensor {name:?}: {what}"));
        let dt = v.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no dtype"))?;
        let dtype = DType::from_safetensors(dt).ok_or_else(|| CheckpointError::UnknownDtype {
            path: path.to_path_buf(),
            tensor: name.clone(),
            dtype: dt.to_string(),
        })?;
        let shape = v
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or_else(|| bad("shape entries must be non-negative integers")))
            .collect::<Result<Vec<_>>>()?;
        let offs = v.get("data_offsets").and_then(Value::as_array).ok_or_else(|| bad("no data_offsets"))?;
        let (b, e) = match offs.as_slice() {
            [b, e] => (b.as_u64().ok_or_else(|| bad("bad data_offsets"))?, e.as_u64().ok_or_else(|| bad("bad data_offsets"))?),
            _ => return Err(bad("data_offsets must be [begin, end]")),
        };
        if e < b {
            return Err(bad(&format!("data_offsets [{b}, {e}] end before they begin")));
        }
        if e > file_len - data_start {
            return Err(CheckpointError::Truncated {
                path: path.to_path_buf(),
                what: format!("tensor {name:?}"),
                needed: data_start.saturating_add(e),
                len: file_len,
            });
        }
        let segments = std::iter::once(data_start + b..data_start + e).collect();
        let entry = TensorEntry { name: name.clone(), dtype, shape, segments };
        if entry.byte_len() != entry.expected_len() {
            return Err(CheckpointError::TensorSize {
                path: path.to_path_buf(),
                tensor: name,
                dtype: dt.to_string(),
                shape: entry.shape.clone(),
                expected: entry.expected_len(),
                actual: entry.byte_len(),
            });
        }
        tensors.push(entry);
    }
    tensors.sort_by_key(|t| t.segments[0].start);
    Ok(Parsed { tensors, metadata })
}

/// A safetensors file being written: header first, then the tensors in sorted-name order.
pub struct SafetensorsWriter {
    out: AtomicFile,
    order: Vec<(String, DType, Vec<usize>)>,
    next: usize,
    /// Bytes of tensor `next` written so far by [`Self::write_part`].
    part: usize,
}

impl SafetensorsWriter {
    /// `tensors` in any order; they must then be written in [`Self::write_order`].
    pub fn create(path: &Path, metadata: &BTreeMap<String, String>, tensors: &[(String, DType, Vec<usize>)]) -> Result<Self> {
        let mut order = tensors.to_vec();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = order.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CheckpointError::InvalidArgument(Misuse::DuplicateTensor { name: w[0].0.clone() }));
        }
        let mut header = Map::new();
        if !metadata.is_empty() {
            let m: Map<String, Value> = metadata.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
            header.insert("__metadata__".into(), Value::Object(m));
        }
        // Insert in sorted order so the bytes are the same with or without serde_json's preserve_order.
        let mut off = 0u64;
        let mut text = String::from("{");
        if let Some(m) = header.get("__metadata__") {
            text.push_str(&format!("\"__metadata__\":{}", serde_json::to_string(m).unwrap_or_default()));
        }
        for (name, dtype, shape) in &order {
            let code = dtype.safetensors_name().ok_or_else(|| CheckpointError::Unsupported {
                tensor: name.clone(),
                reason: "string values cannot be stored in safetensors; write a .ckpt file".into(),
            })?;
            let len = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
            if text.len() > 1 {
                text.push(',');
            }
            text.push_str(&format!(
                "{}:{{\"dtype\":\"{code}\",\"shape\":{},\"data_offsets\":[{off},{}]}}",
                serde_json::to_string(name).unwrap_or_default(),
                serde_json::to_string(shape).unwrap_or_default(),
                off + len
            ));
            off += len;
        }
        text.push('}');
        while (8 + text.len()) % 8 != 0 {
            text.push(' ');
        }
        let mut out = AtomicFile::create(path)?;
        out.preallocate(8 + text.len() as u64 + off);
        out.write_all(&(text.len() as u64).to_le_bytes())?;
        out.write_all(text.as_bytes())?;
        Ok(Self { out, order, next: 0, part: 0 })
    }

    /// The tensors (name, dtype, shape) in the order they must be written: sorted by name.
    pub fn write_order(&self) -> impl Iterator<Item = &(String, DType, Vec<usize>)> {
        self.order.iter()
    }

    /// Write the next tensor of [`Self::write_order`].
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let len = self.expect(name)?;
        if self.part != 0 || data.len() != len {
            return Err(self.wrong_count(name, self.part + data.len()));
        }
        self.out.write_all(data)?;
        self.next += 1;
        Ok(())
    }

    /// Write the next bytes of tensor `name`, the next of [`Self::write_order`], in as many
    /// parts as its producer makes (a tensor too large to hold at once): the next tensor's
    /// turn comes when its bytes are complete.
    pub fn write_part(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let len = self.expect(name)?;
        if self.part + data.len() > len {
            return Err(self.wrong_count(name, self.part + data.len()));
        }
        self.out.write_all(data)?;
        self.part += data.len();
        if self.part == len {
            self.next += 1;
            self.part = 0;
        }
        Ok(())
    }

    /// The byte length of tensor `name`, an error unless it is the one to write next.
    fn expect(&self, name: &str) -> Result<usize> {
        let Some((want, dtype, shape)) = self.order.get(self.next) else {
            return Err(CheckpointError::InvalidArgument(Misuse::UnexpectedTensor { name: name.to_string(), expected: None }));
        };
        if want != name {
            return Err(CheckpointError::InvalidArgument(Misuse::UnexpectedTensor {
                name: name.to_string(),
                expected: Some(want.to_string()),
            }));
        }
        Ok(shape.iter().product::<usize>() * dtype.size())
    }

    fn wrong_count(&self, name: &str, got: usize) -> CheckpointError {
        let (_, dtype, shape) = &self.order[self.next];
        CheckpointError::InvalidArgument(Misuse::WrongByteCount {
            name: name.to_string(),
            dtype: dtype.to_string(),
            shape: shape.to_vec(),
            needs: shape.iter().product::<usize>() * dtype.size(),
            got,
        })
    }

    /// Completes the file and renames it into place; fails when not every tensor was written.
    pub fn finish(self) -> Result<()> {
        if self.next != self.order.len() {
            return Err(CheckpointError::InvalidArgument(Misuse::MissingTensors { written: self.next, declared: self.order.len() }));
        }
        Ok(self.out.commit()?)
    }
}

/// MindSpore's safetensors `crc_num`: CRC-32 over, per tensor in sorted-name order, the name's
/// bytes and then the raw tensor bytes.
pub(crate) fn mindspore_crc(file: &crate::CheckpointFile) -> Result<u32> {
    let names = file.tensors().iter().map(|t: &TensorEntry| t.name.as_str()).collect();
    crc_num(names, |name, h| {
        file.with_bytes(name, &mut |b| {
            h.update(b);
            Ok(())
        })
    })
}

/// The `crc_num` of tensors `names`: CRC-32 over each one's name and then its bytes (which
/// `bytes` feeds to the hasher), in name order.
pub(crate) fn crc_num(mut names: Vec<&str>, mut bytes: impl FnMut(&str, &mut crc32fast::Hasher) -> Result<()>) -> Result<u32> {
    names.sort_unstable();
    let mut h = crc32fast::Hasher::new();
    for name in names {
        h.update(name.as_bytes());
        bytes(name, &mut h)?;
    }
    Ok(h.finalize())
}
