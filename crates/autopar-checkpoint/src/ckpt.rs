//! MindSpore `.ckpt`: a concatenation of serialized `Checkpoint` messages with one `Value` each
//! (so the whole file parses as one `Checkpoint`), values over 512 MiB split into chunks with the
//! same tag and full dims, and an optional `"crc_num"` + 10-byte big-endian CRC-32 trailer.
//!
//! Reading walks the protobuf wire format over a memory map and records where each tensor's
//! bytes lie (one range per chunk) without copying them; writing streams each value with the
//! `prost` encoding helpers, so neither side ever holds a whole file in memory. The generated
//! `prost` types ([`crate::proto::ckpt`]) decode small files whole in tests.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::Path;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

use crate::dtype::DType;
use crate::error::{CheckpointError, Misuse, Result};
use crate::io::AtomicFile;
use crate::TensorEntry;

/// `SLICE_SIZE = 512 * 1024` KiB: values larger than this are written in chunks.
pub const CHUNK_BYTES: usize = 512 * 1024 * 1024;
pub(crate) const CRC_MAGIC: &[u8; 7] = b"crc_num";
pub(crate) const CRC_TRAILER_LEN: u64 = 17;

/// Where the protobuf payload ends and the stored CRC, if the file has a trailer.
pub(crate) fn trailer(map: &[u8]) -> (usize, Option<u32>) {
    let n = map.len();
    if n >= CRC_TRAILER_LEN as usize && &map[n - 17..n - 10] == CRC_MAGIC {
        let v = map[n - 10..].iter().fold(0u128, |acc, &b| (acc << 8) | b as u128);
        (n - 17, Some(v as u32))
    } else {
        (n, None)
    }
}

/// CRC-32 of the first `len` bytes of `path`, read in 4 MiB blocks (no mapping, so the page
/// cache is not charged to this process).
pub(crate) fn crc32_prefix(path: &Path, len: u64) -> Result<u32> {
    let mut f = File::open(path).map_err(CheckpointError::io("open", path))?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..want]).map_err(CheckpointError::io("read", path))?;
        h.update(&buf[..want]);
        left -= want as u64;
    }
    Ok(h.finalize())
}

struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl Wire<'_> {
    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            if self.pos >= self.end {
                return Err(format!("varint runs past the end at byte {}", self.pos));
            }
            let b = self.buf[self.pos];
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    /// A length-delimited field: the byte range of its payload.
    fn len_delimited(&mut self) -> std::result::Result<Range<usize>, (u64, String)> {
        let len = self.varint().map_err(|e| (0, e))?;
        let start = self.pos;
        let end = (start as u64).checked_add(len).ok_or((u64::MAX, "length overflows".to_string()))?;
        if end > self.end as u64 {
            return Err((end, format!("a field of {len} bytes at byte {start} runs past its end at byte {}", self.end)));
        }
        self.pos = end as usize;
        Ok(start..end as usize)
    }

    fn skip(&mut self, wire: u64) -> std::result::Result<(), (u64, String)> {
        match wire {
            0 => self.varint().map(|_| ()).map_err(|e| (0, e)),
            1 => self.advance(8),
            5 => self.advance(4),
            2 => self.len_delimited().map(|_| ()),
            w => Err((0, format!("unsupported wire type {w} at byte {}", self.pos))),
        }
    }

    fn advance(&mut self, n: usize) -> std::result::Result<(), (u64, String)> {
        if self.pos + n > self.end {
            return Err(((self.pos + n) as u64, format!("fixed field runs past the end at byte {}", self.pos)));
        }
        self.pos += n;
        Ok(())
    }
}

/// Parse the tensor index of a `.ckpt` file whose protobuf payload is `map[..payload_len]`.
pub(crate) fn parse_index(path: &Path, map: &[u8], payload_len: usize) -> Result<Vec<TensorEntry>> {
    let file_len = map.len() as u64;
    let malformed = |reason: String| CheckpointError::Malformed { path: path.to_path_buf(), reason };
    let wrap = |what: String, (needed, reason): (u64, String)| {
        if needed > payload_len as u64 {
            CheckpointError::Truncated { path: path.to_path_buf(), what, needed, len: file_len }
        } else {
            CheckpointError::Malformed { path: path.to_path_buf(), reason: format!("{what}: {reason}") }
        }
    };
    let mut top = Wire { buf: map, pos: 0, end: payload_len };
    let mut out: Vec<TensorEntry> = Vec::new();
    let mut value_no = 0usize;
    while top.pos < top.end {
        let key = top.varint().map_err(|e| malformed(format!("top level: {e}")))?;
        let (field, wire) = (key >> 3, key & 7);
        if field != 1 || wire != 2 {
            // A checkpoint's top level holds its values alone: anything else is another kind
            // of protobuf file (a strategy file decodes this far too).
            return Err(malformed(format!(
                "top-level field {field} (wire type {wire}) at byte {} is not a checkpoint value: is this a MindSpore checkpoint (a strategy file, perhaps)?",
                top.pos
            )));
        }
        let what = format!("value #{value_no}");
        value_no += 1;
        let vr = top.len_delimited().map_err(|e| wrap(what.clone(), e))?;
        let mut v = Wire { buf: map, pos: vr.start, end: vr.end };
        let mut tag: Option<String> = None;
        let mut tensor: Option<Range<usize>> = None;
        while v.pos < v.end {
            let key = v.varint().map_err(|e| malformed(format!("{what}: {e}")))?;
            let (field, wire) = (key >> 3, key & 7);
            match (field, wire) {
                (1, 2) => {
                    let r = v.len_delimited().map_err(|e| wrap(what.clone(), e))?;
                    tag = Some(String::from_utf8(map[r].to_vec()).map_err(|_| malformed(format!("{what}: tag is not UTF-8")))?);
                }
                (2, 2) => tensor = Some(v.len_delimited().map_err(|e| wrap(what.clone(), e))?),
                (3, 2) => {
                    let name = tag.clone().unwrap_or_else(|| what.clone());
                    return Err(CheckpointError::Unsupported {
                        tensor: name,
                        reason: format!("map tensors (MapParameter) in {} are not supported", path.display()),
                    });
                }
                (_, w) => v.skip(w).map_err(|e| wrap(what.clone(), e))?,
            }
        }
        let tag = tag.ok_or_else(|| malformed(format!("{what} has no tag")))?;
        let tr = tensor.ok_or_else(|| malformed(format!("value {tag:?} has no tensor")))?;
        let mut t = Wire { buf: map, pos: tr.start, end: tr.end };
        let mut dims: Vec<i64> = Vec::new();
        let mut ttype: Option<String> = None;
        let mut content: Option<Range<usize>> = None;
        let twhat = format!("tensor {tag:?}");
        while t.pos < t.end {
            let key = t.varint().map_err(|e| malformed(format!("{twhat}: {e}")))?;
            match (key >> 3, key & 7) {
                (1, 0) => dims.push(t.varint().map_err(|e| malformed(format!("{twhat}: {e}")))? as i64),
                (1, 2) => {
                    let r = t.len_delimited().map_err(|e| wrap(twhat.clone(), e))?;
                    let mut p = Wire { buf: map, pos: r.start, end: r.end };
                    while p.pos < p.end {
                        dims.push(p.varint().map_err(|e| malformed(format!("{twhat}: {e}")))? as i64);
                    }
                }
                (2, 2) => {
                    let r = t.len_delimited().map_err(|e| wrap(twhat.clone(), e))?;
                    ttype = Some(String::from_utf8_lossy(&map[r]).into_owned());
                }
                (3, 2) => content = Some(t.len_delimited().map_err(|e| wrap(twhat.clone(), e))?),
                (_, w) => t.skip(w).map_err(|e| wrap(twhat.clone(), e))?,
            }
        }
        let ttype = ttype.ok_or_else(|| malformed(format!("{twhat} has no tensor_type")))?;
        let content = content.ok_or_else(|| malformed(format!("{twhat} has no tensor_content")))?;
        let dtype = DType::from_mindspore(&ttype).ok_or_else(|| CheckpointError::UnknownDtype {
            path: path.to_path_buf(),
            tensor: tag.clone(),
            dtype: ttype.clone(),
        })?;
        if dims.iter().any(|&d| d < 0) {
            return Err(malformed(format!("{twhat} has negative dims {dims:?}")));
        }
        let mut shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        if shape == [0] && dtype != DType::Str {
            shape.clear();
        }
        let seg = content.start as u64..content.end as u64;
        match out.last_mut() {
            Some(last) if last.name == tag => {
                if last.dtype != dtype || last.shape != shape {
                    return Err(malformed(format!(
                        "chunks of {tag:?} disagree: {} {:?} then {} {:?}",
                        last.dtype, last.shape, dtype, shape
                    )));
                }
                last.segments.push(seg);
            }
            _ => {
                if out.iter().any(|e| e.name == tag) {
                    return Err(malformed(format!("tag {tag:?} appears twice, not in consecutive chunks")));
                }
                out.push(TensorEntry { name: tag, dtype, shape, segments: vec![seg] });
            }
        }
    }
    for e in &out {
        let actual = e.byte_len();
        let ok = if e.dtype == DType::Str { actual % 4 == 0 } else { actual == e.expected_len() };
        if !ok {
            return Err(CheckpointError::TensorSize {
                path: path.to_path_buf(),
                tensor: e.name.clone(),
                dtype: e.dtype.to_string(),
                shape: e.shape.clone(),
                expected: e.expected_len(),
                actual,
            });
        }
    }
    Ok(out)
}

/// Streaming `.ckpt` writer: one `Checkpoint{value: [Value]}` message per tensor chunk.
pub struct CkptWriter {
    out: AtomicFile,
    crc: Option<crc32fast::Hasher>,
    chunk_bytes: usize,
}

impl CkptWriter {
    /// Starts a `.ckpt` file at `path` (written to a temporary file until finished), chunking values over 512 MiB as MindSpore does; `crc`
    /// adds MindSpore's CRC trailer.
    pub fn create(path: &Path, crc: bool) -> Result<Self> {
        Self::with_chunk_bytes(path, crc, CHUNK_BYTES)
    }

    /// A writer that chunks values larger than `chunk_bytes` (MindSpore: 512 MiB).
    pub fn with_chunk_bytes(path: &Path, crc: bool, chunk_bytes: usize) -> Result<Self> {
        if chunk_bytes == 0 {
            return Err(CheckpointError::InvalidArgument(Misuse::ZeroChunkSize));
        }
        Ok(Self { out: AtomicFile::create(path)?, crc: crc.then(crc32fast::Hasher::new), chunk_bytes })
    }

    /// Reserve disk space for the tensors of `specs` (name, element size, shape), an upper bound
    /// of the file size: what is not written is given back at [`Self::finish`].
    pub(crate) fn reserve_for(&mut self, specs: &[(&str, usize, &[usize])]) {
        let mut total = 32u64; // the CRC trailer
        for &(name, esz, shape) in specs {
            let len = shape.iter().fold(esz as u64, |acc, &d| acc.saturating_mul(d as u64));
            let chunks = len.div_ceil(self.chunk_bytes as u64).max(1);
            // per chunk: keys, lengths, name, dims and type name
            let head = 64 + name.len() as u64 + 11 * shape.len() as u64;
            total = total.saturating_add(len).saturating_add(chunks.saturating_mul(head));
        }
        self.out.preallocate(total);
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        if let Some(h) = &mut self.crc {
            h.update(bytes);
        }
        Ok(self.out.write_all(bytes)?)
    }

    /// Append one tensor: `data` is its raw little-endian bytes in C order.
    pub fn write_tensor(&mut self, name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> Result<()> {
        let dims: Vec<u64> = if dtype == DType::Str { vec![0] } else { shape.iter().map(|&d| d as u64).collect() };
        let ttype = dtype.mindspore_name().as_bytes();
        let mut chunks: Vec<&[u8]> = data.chunks(self.chunk_bytes).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for chunk in chunks {
            let dims_len: usize = dims.iter().map(|&d| key_len(1) + encoded_len_varint(d)).sum();
            let tensor_len = dims_len
                + key_len(2)
                + encoded_len_varint(ttype.len() as u64)
                + ttype.len()
                + key_len(3)
                + encoded_len_varint(chunk.len() as u64)
                + chunk.len();
            let value_len = key_len(1)
                + encoded_len_varint(name.len() as u64)
                + name.len()
                + key_len(2)
                + encoded_len_varint(tensor_len as u64)
                + tensor_len;
            let mut head: Vec<u8> = Vec::with_capacity(64 + name.len() + dims.len() * 10);
            encode_key(1, WireType::LengthDelimited, &mut head);
            encode_varint(value_len as u64, &mut head);
            encode_key(1, WireType::LengthDelimited, &mut head);
            encode_varint(name.len() as u64, &mut head);
            head.extend_from_slice(name.as_bytes());
            encode_key(2, WireType::LengthDelimited, &mut head);
            encode_varint(tensor_len as u64, &mut head);
            for &d in &dims {
                encode_key(1, WireType::Varint, &mut head);
                encode_varint(d, &mut head);
            }
            encode_key(2, WireType::LengthDelimited, &mut head);
            encode_varint(ttype.len() as u64, &mut head);
            head.extend_from_slice(ttype);
            encode_key(3, WireType::LengthDelimited, &mut head);
            encode_varint(chunk.len() as u64, &mut head);
            self.emit(&head)?;
            self.emit(chunk)?;
        }
        Ok(())
    }

    /// Append the CRC trailer if asked for, then fsync and rename into place.
    pub fn finish(mut self) -> Result<()> {
        if let Some(h) = self.crc.take() {
            let crc = h.finalize();
            let mut trailer = CRC_MAGIC.to_vec();
            trailer.extend_from_slice(&[0u8; 6]);
            trailer.extend_from_slice(&crc.to_be_bytes());
            self.out.write_all(&trailer)?;
        }
        Ok(self.out.commit()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_trailer_is_found_only_at_the_end() {
        let mut f = b"payload".to_vec();
        f.extend_from_slice(CRC_MAGIC);
        f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
        assert_eq!(trailer(&f), (7, Some(0x1234_5678)));
        assert_eq!(trailer(b"no trailer here at all"), (22, None));
    }
}
