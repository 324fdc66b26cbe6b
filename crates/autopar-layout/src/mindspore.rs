//! MindSpore's words at the boundary: right-counted tensor maps and the 12-tuple
//! `parameter_layout_dict` entries. Every conversion between MindSpore's conventions and
//! autopar's left-counted axes lives here.

use std::fmt;
use std::str::FromStr;

use crate::error::{LayoutError, Result};
use crate::mesh::DeviceMatrix;

/// A tensor map in MindSpore's form: one entry per tensor dimension; each entry lists device
/// axes counted from the **right** (`0` = last element of the device matrix), most significant
/// first; `[-1]` = not split.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct TensorMap(pub Vec<Vec<i64>>);

impl TensorMap {
    /// A map with one value per dimension (no multi-axis entries).
    pub fn single(values: &[i64]) -> Self {
        Self(values.iter().map(|&v| vec![v]).collect())
    }

    /// The map of per-dimension left-counted axes on a mesh of `ndim` axes.
    pub fn from_axes(ndim: usize, axes: &[Vec<usize>]) -> Self {
        Self(axes.iter().map(|a| if a.is_empty() { vec![-1] } else { a.iter().map(|&x| ndim as i64 - 1 - x as i64).collect() }).collect())
    }

    /// MindSpore's flattened form (as in `parameter_layout_dict` index 1): multi-axis entries
    /// are spliced in place.
    pub fn flattened(&self) -> Vec<i64> {
        self.0.iter().flatten().copied().collect()
    }

    /// The number of entries (tensor dimensions).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map has no entries (a scalar).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Convert to left-counted axes on `mesh`, checking ranges and lengths against `shape`.
    pub fn to_axes(&self, mesh: &DeviceMatrix, shape: &[usize]) -> Result<Vec<Vec<usize>>> {
        if self.0.len() != shape.len() {
            return Err(LayoutError::ShapeMapLengthMismatch {
                shape: shape.to_vec(),
                shape_len: shape.len(),
                map: self.to_string(),
                map_len: self.0.len(),
            });
        }
        let ndim = mesh.ndim() as i64;
        let mut out = Vec::with_capacity(self.0.len());
        for (dim, entry) in self.0.iter().enumerate() {
            let mut axes = Vec::new();
            for &v in entry {
                if v == -1 {
                    continue;
                }
                if v < -1 || v >= ndim {
                    return Err(LayoutError::TensorMapOutOfRange { dim, value: v, dims: mesh.dims().to_vec() });
                }
                axes.push((ndim - 1 - v) as usize);
            }
            out.push(axes);
        }
        Ok(out)
    }
}

impl fmt::Display for TensorMap {
    /// `[-1, 0]`, with multi-axis entries as tuples: `[-1, (1, 0)]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            if e.len() == 1 {
                write!(f, "{}", e[0])?;
            } else {
                write!(f, "(")?;
                for (j, v) in e.iter().enumerate() {
                    if j > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                write!(f, ")")?;
            }
        }
        write!(f, "]")
    }
}

impl FromStr for TensorMap {
    type Err = LayoutError;

    /// Accepts `-1,0`, `[-1, 0]` and multi-axis entries as `(1,0)` or `[1,0]`: `[-1,(1,0)]`.
    fn from_str(s: &str) -> Result<Self> {
        let err = |reason: &str| LayoutError::Parse { what: "tensor map", text: s.to_string(), reason: reason.to_string() };
        let mut t = s.trim();
        if t.starts_with('[') && t.ends_with(']') && matching_close(t) == Some(t.len() - 1) {
            t = &t[1..t.len() - 1];
        }
        let mut entries = Vec::new();
        for part in split_top_level(t).map_err(|e| err(&e))? {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty entry"));
            }
            if part.starts_with('(') || part.starts_with('[') {
                let inner = &part[1..part.len() - 1];
                let vals = inner
                    .split(',')
                    .map(|v| v.trim())
                    .filter(|v| !v.is_empty())
                    .map(|v| v.parse::<i64>().map_err(|_| err(&format!("{v:?} is not an integer"))))
                    .collect::<Result<Vec<_>>>()?;
                if vals.is_empty() {
                    return Err(err("empty tuple entry"));
                }
                entries.push(vals);
            } else {
                entries.push(vec![part.parse::<i64>().map_err(|_| err(&format!("{part:?} is not an integer")))?]);
            }
        }
        Ok(TensorMap(entries))
    }
}

fn matching_close(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Split on commas that are not inside brackets or parentheses.
pub(crate) fn split_top_level(s: &str) -> std::result::Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced brackets".into());
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced brackets".into());
    }
    if !s[start..].trim().is_empty() || !out.is_empty() {
        out.push(&s[start..]);
    }
    Ok(out)
}

/// Parse a comma-separated list of unsigned integers, with or without brackets (`2,4`, `[2, 4]`).
pub fn parse_usize_list(what: &'static str, s: &str) -> Result<Vec<usize>> {
    let t = s.trim().trim_start_matches(['[', '(']).trim_end_matches([']', ')']);
    if t.trim().is_empty() {
        return Ok(Vec::new());
    }
    t.split(',')
        .map(|v| {
            let v = v.trim();
            v.parse::<usize>().map_err(|_| LayoutError::Parse {
                what,
                text: s.to_string(),
                reason: format!("{v:?} is not a non-negative integer"),
            })
        })
        .collect()
}

/// One entry of MindSpore 2.10's `parameter_layout_dict`: the 12-tuple of
/// `reference/mindspore-internals.md` §1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParameterLayout {
    /// The device matrix (field 0).
    pub dev_matrix: Vec<usize>,
    /// Flattened tensor map (multi-axis entries spliced in place).
    pub tensor_map: Vec<i64>,
    /// Model-parallel slice shape (before optimizer sharding).
    pub slice_shape: Vec<usize>,
    /// MindSpore's `field_size` (field 3; autopar writes 0).
    pub field_size: i64,
    /// Whether the tensor splits into equal slices (field 4; autopar writes `True`).
    pub uniform_split: bool,
    /// The optimizer-shard group (field 5): `<size>-<hash>`, `hccl_world_group`, or empty for none.
    pub opt_shard_group: String,
    /// The full (unsplit) shape (field 6).
    pub full_shape: Vec<usize>,
    /// The slice shape with a dimension split over several axes viewed as one dimension per axis (field 7).
    pub after_reshape_slice_shape: Vec<usize>,
    /// Whether several pipeline stages use the parameter (field 8).
    pub pipeline_shared: bool,
    /// Whether this stage owns the shared parameter's master copy and sends it (field 9).
    pub is_send: bool,
    /// The global rank of the shared parameter's peer copy (field 10): the owner's rank, or on the owner the next stage's.
    pub peer_rank: i64,
    /// Send/receive tag of a shared parameter, numbering them from 1 (field 11; 0: not shared).
    pub sr_tag: i64,
}

impl ParameterLayout {
    /// Parse one line `name: (dev, map, slice, field, uniform, 'group', full, after, b, b, i, i)`
    /// as MindSpore prints it; returns the name and the layout.
    pub fn parse_line(line: &str) -> Result<(String, ParameterLayout)> {
        let err = |reason: String| LayoutError::Parse { what: "parameter layout", text: line.to_string(), reason };
        let (name, rest) = line.split_once(": (").ok_or_else(|| err("expected `name: (...)`".into()))?;
        let body = rest.trim_end().strip_suffix(')').ok_or_else(|| err("missing closing parenthesis".into()))?;
        let f = split_top_level(body).map_err(err)?;
        if f.len() != 12 {
            return Err(err(format!("expected 12 fields, found {}", f.len())));
        }
        let ints = |s: &str| -> Result<Vec<i64>> {
            let t = s.trim().trim_start_matches('[').trim_end_matches(']');
            if t.trim().is_empty() {
                return Ok(Vec::new());
            }
            t.split(',').map(|v| v.trim().parse::<i64>().map_err(|_| err(format!("{v:?} is not an integer")))).collect()
        };
        let uints = |s: &str| -> Result<Vec<usize>> {
            ints(s)?.into_iter().map(|v| usize::try_from(v).map_err(|_| err(format!("negative size {v}")))).collect()
        };
        let boolean = |s: &str| match s.trim() {
            "True" => Ok(true),
            "False" => Ok(false),
            o => Err(err(format!("{o:?} is not True/False"))),
        };
        let int = |s: &str| s.trim().parse::<i64>().map_err(|_| err(format!("{:?} is not an integer", s.trim())));
        Ok((
            name.trim().to_string(),
            ParameterLayout {
                dev_matrix: uints(f[0])?,
                tensor_map: ints(f[1])?,
                slice_shape: uints(f[2])?,
                field_size: int(f[3])?,
                uniform_split: boolean(f[4])?,
                opt_shard_group: f[5].trim().trim_matches('\'').to_string(),
                full_shape: uints(f[6])?,
                after_reshape_slice_shape: uints(f[7])?,
                pipeline_shared: boolean(f[8])?,
                is_send: boolean(f[9])?,
                peer_rank: int(f[10])?,
                sr_tag: int(f[11])?,
            },
        ))
    }
}

impl fmt::Display for ParameterLayout {
    /// MindSpore's printed form of the 12-tuple.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let py = |b: bool| if b { "True" } else { "False" };
        write!(
            f,
            "({:?}, {:?}, {:?}, {}, {}, '{}', {:?}, {:?}, {}, {}, {}, {})",
            self.dev_matrix,
            self.tensor_map,
            self.slice_shape,
            self.field_size,
            py(self.uniform_split),
            self.opt_shard_group,
            self.full_shape,
            self.after_reshape_slice_shape,
            py(self.pipeline_shared),
            py(self.is_send),
            self.peer_rank,
            self.sr_tag
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_map_parses_and_prints_multi_axis_entries() {
        let m: TensorMap = "[-1, (1, 0)]".parse().unwrap();
        assert_eq!(m.0, vec![vec![-1], vec![1, 0]]);
        assert_eq!(m.to_string(), "[-1, (1, 0)]");
        assert_eq!(m.flattened(), vec![-1, 1, 0]);
        assert_eq!("-1,0".parse::<TensorMap>().unwrap(), TensorMap::single(&[-1, 0]));
        assert!("-1,x".parse::<TensorMap>().is_err());
        assert!("[-1,(0".parse::<TensorMap>().is_err());
    }

    #[test]
    fn parameter_layout_line_round_trips() {
        let line = "l1.w: ([2, 4], [-1, 0], [64, 32], 0, True, '2-16453000547691086251', [64, 128], [64, 32], False, False, 0, 0)";
        let (name, p) = ParameterLayout::parse_line(line).unwrap();
        assert_eq!(name, "l1.w");
        assert_eq!(p.opt_shard_group, "2-16453000547691086251");
        assert_eq!(format!("{name}: {p}"), line);
        assert_eq!(crate::TensorLayout::of_parameter(&p).unwrap().slice_shape(), vec![64, 32]);
    }
}
