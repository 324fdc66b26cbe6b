//! From a user strategy (`matmul.shard(((2, 1), (1, 4)))`) to a device matrix and one tensor
//! map per input and for the output, as MindSpore's `OperatorInfo` builds them
//! (`reference/mindspore-internals.md` §6.1):
//!
//! * element-wise ops: inputs align from the right; the device matrix takes, per position, the
//!   split the inputs give it (broadcast dimensions split 1);
//! * MatMul `[b.., i, k] x [k, j]`: device matrix `[b.., i, k, j]`;
//! * when the strategy uses fewer devices than there are, a repeated-calculation axis of size
//!   `devices / product` is added (on the right by default, MindSpore's
//!   `repeated_num_in_dev_matrix_right_`), then axes of size 1 are squeezed out.

use std::fmt;
use std::str::FromStr;

use crate::error::{LayoutError, Result, MAX_DEVICES};
use crate::layout::TensorLayout;
use crate::mesh::DeviceMatrix;
use crate::mindspore::{split_top_level, TensorMap};

/// Per-input split counts, as the user writes them: `((2, 1), (1, 4))`.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Strategy(pub Vec<Vec<usize>>);

impl Strategy {
    /// A strategy with the given split counts per input.
    pub fn new(inputs: Vec<Vec<usize>>) -> Self {
        Self(inputs)
    }

    /// Split counts per input.
    pub fn inputs(&self) -> &[Vec<usize>] {
        &self.0
    }
}

impl fmt::Display for Strategy {
    /// `((2, 1), (1, 4))`, MindSpore's notation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(")?;
        for (i, input) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "(")?;
            for (j, s) in input.iter().enumerate() {
                if j > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{s}")?;
            }
            if input.len() == 1 {
                write!(f, ",")?;
            }
            write!(f, ")")?;
        }
        write!(f, ")")
    }
}

impl FromStr for Strategy {
    type Err = LayoutError;

    /// Accepts `[[2,1],[1,4]]`, `((2, 1), (1, 4))` and a single input `[2,4]`.
    fn from_str(s: &str) -> Result<Self> {
        let err = |reason: String| LayoutError::Parse { what: "strategy", text: s.to_string(), reason };
        let t = s.trim();
        let inner = t
            .strip_prefix(['[', '('])
            .and_then(|x| x.strip_suffix([']', ')']))
            .ok_or_else(|| err("expected brackets, e.g. [[2,1],[1,4]]".into()))?;
        let mut parts = split_top_level(inner).map_err(err)?;
        // Python's one-element tuple `((2, 4),)` ends with a comma.
        if parts.len() > 1 && parts.last().is_some_and(|p| p.trim().is_empty()) {
            parts.pop();
        }
        let nested = parts.iter().any(|p| p.trim().starts_with(['[', '(']));
        let parse_list = |p: &str| -> Result<Vec<usize>> {
            p.trim()
                .trim_start_matches(['[', '('])
                .trim_end_matches([']', ')'])
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| v.parse::<usize>().map_err(|_| err(format!("{v:?} is not a split count"))))
                .collect()
        };
        if nested {
            Ok(Strategy(parts.iter().map(|p| parse_list(p)).collect::<Result<_>>()?))
        } else {
            Ok(Strategy(vec![parse_list(inner)?]))
        }
    }
}

/// How an operator turns its strategy into a device matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevMatrixRule {
    /// Element-wise and broadcasting ops: inputs aligned right, per position the largest split.
    Elementwise,
    /// `MatMul`/`BatchMatMul`: `[b.., i, k, j]`. Strategies are written for the inputs as
    /// stored, so with `transpose_b` the second input's strategy is `(j, k)`.
    MatMul {
        /// Whether the first input is transposed.
        transpose_a: bool,
        /// Whether the second input is transposed.
        transpose_b: bool,
    },
}

/// Device matrix and tensor maps of one operator under one strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpLayout {
    /// Device matrix after squeezing axes of size 1 (as MindSpore reports it).
    pub dev_matrix: DeviceMatrix,
    /// The tensor map of each input, in MindSpore's right-counted form.
    pub inputs: Vec<TensorMap>,
    /// The output's tensor map.
    pub output: TensorMap,
    /// Size of the repeated-calculation axis (1 if the strategy uses every device).
    pub repeat: usize,
}

impl OpLayout {
    /// Layout of input `i` with full shape `shape` (checks divisibility).
    pub fn input_layout(&self, i: usize, shape: &[usize]) -> Result<TensorLayout> {
        let map = self.inputs.get(i).ok_or_else(|| LayoutError::BadStrategy {
            strategy: String::new(),
            what: format!("operator has {} inputs, asked for input {i}", self.inputs.len()),
        })?;
        TensorLayout::from_mindspore(self.dev_matrix.dims(), map, shape)
    }

    /// Layout of the output with full shape `shape`.
    pub fn output_layout(&self, shape: &[usize]) -> Result<TensorLayout> {
        TensorLayout::from_mindspore(self.dev_matrix.dims(), &self.output, shape)
    }
}

/// Build the device matrix and tensor maps for `strategy` on `device_num` devices.
/// `repeat_on_right` places the repeated-calculation axis as MindSpore does by default (true).
pub fn strategy_layouts(rule: DevMatrixRule, strategy: &Strategy, device_num: usize, repeat_on_right: bool) -> Result<OpLayout> {
    if device_num == 0 || device_num > MAX_DEVICES {
        return Err(LayoutError::DeviceCountOutOfRange { count: device_num, max: MAX_DEVICES });
    }
    let text = strategy.to_string();
    if strategy.0.is_empty() {
        return Err(LayoutError::BadStrategy { strategy: text, what: "no inputs".into() });
    }
    for (input, dims) in strategy.0.iter().enumerate() {
        if let Some(dim) = dims.iter().position(|&s| s == 0) {
            return Err(LayoutError::ZeroSplit { strategy: text, input, dim });
        }
    }
    let (dev, inputs, output) = match rule {
        DevMatrixRule::Elementwise => elementwise(strategy, &text)?,
        DevMatrixRule::MatMul { transpose_a, transpose_b } => matmul(strategy, &text, transpose_a, transpose_b)?,
    };
    let product: usize = dev.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).unwrap_or(usize::MAX);
    if product > device_num || !device_num.is_multiple_of(product) {
        return Err(LayoutError::StrategyNotDividing { strategy: text, product, devices: device_num });
    }
    let repeat = device_num / product;
    let (mut dev, mut inputs, mut output) = (dev, inputs, output);
    if repeat > 1 {
        if repeat_on_right {
            dev.push(repeat);
            for m in inputs.iter_mut().chain(std::iter::once(&mut output)) {
                for v in m.iter_mut() {
                    if *v >= 0 {
                        *v += 1;
                    }
                }
            }
        } else {
            dev.insert(0, repeat);
        }
    }
    let (dev, remap) = squeeze(&dev);
    let to_map = |m: &Vec<i64>| TensorMap::single(&m.iter().map(|&v| if v < 0 { -1 } else { remap[v as usize] }).collect::<Vec<_>>());
    Ok(OpLayout { dev_matrix: DeviceMatrix::new(dev)?, inputs: inputs.iter().map(to_map).collect(), output: to_map(&output), repeat })
}

type Maps = (Vec<usize>, Vec<Vec<i64>>, Vec<i64>);

fn elementwise(strategy: &Strategy, text: &str) -> Result<Maps> {
    // Inputs align from the right; each position's split is the largest any input gives it
    // (the others must give the same or 1, for a broadcast dimension).
    let n = strategy.0.iter().map(Vec::len).max().unwrap_or(0);
    let mut dev = vec![1usize; n];
    for s in &strategy.0 {
        for (t, &split) in s.iter().enumerate() {
            let p = n - s.len() + t;
            dev[p] = dev[p].max(split);
        }
    }
    let mut inputs = Vec::new();
    for (input, s) in strategy.0.iter().enumerate() {
        let m = s.len();
        let mut map = Vec::with_capacity(m);
        for (t, &split) in s.iter().enumerate() {
            let p = n - m + t;
            if split == dev[p] {
                map.push((n - 1 - p) as i64);
            } else if split == 1 {
                map.push(-1);
            } else {
                return Err(LayoutError::StrategySplitMismatch { strategy: text.to_string(), input, dim: t, got: split, expected: dev[p] });
            }
        }
        inputs.push(map);
    }
    let output = (0..n).map(|p| (n - 1 - p) as i64).collect();
    Ok((dev, inputs, output))
}

fn matmul(strategy: &Strategy, text: &str, transpose_a: bool, transpose_b: bool) -> Result<Maps> {
    let bad = |what: String| LayoutError::BadStrategy { strategy: text.to_string(), what };
    if strategy.0.len() != 2 {
        return Err(bad(format!("MatMul takes 2 input strategies, found {}", strategy.0.len())));
    }
    let (a, b) = (&strategy.0[0], &strategy.0[1]);
    if a.len() < 2 || b.len() < 2 {
        return Err(bad("MatMul inputs need at least 2 dimensions".into()));
    }
    if b.len() > a.len() {
        return Err(bad("the second MatMul input has more dimensions than the first".into()));
    }
    let na = a.len();
    let (ai, ak) = if transpose_a { (a[na - 1], a[na - 2]) } else { (a[na - 2], a[na - 1]) };
    let nb = b.len();
    let (bk, bj) = if transpose_b { (b[nb - 1], b[nb - 2]) } else { (b[nb - 2], b[nb - 1]) };
    if ak != bk {
        return Err(LayoutError::ContractedSplitMismatch { strategy: text.to_string(), a: ak, b: bk });
    }
    let batch = &a[..na - 2];
    let mut dev: Vec<usize> = batch.to_vec();
    dev.extend([ai, ak, bj]);
    let n = dev.len();
    // values: batch position p -> n-1-p; i -> 2; k -> 1; j -> 0
    let mut amap: Vec<i64> = (0..batch.len()).map(|p| (n - 1 - p) as i64).collect();
    if transpose_a {
        amap.extend([1, 2]);
    } else {
        amap.extend([2, 1]);
    }
    let mut bmap = Vec::with_capacity(nb);
    let b_batch = &b[..nb - 2];
    for (t, &split) in b_batch.iter().enumerate() {
        let p = batch.len() - b_batch.len() + t;
        if split == batch[p] {
            bmap.push((n - 1 - p) as i64);
        } else if split == 1 {
            bmap.push(-1);
        } else {
            return Err(LayoutError::StrategySplitMismatch {
                strategy: text.to_string(),
                input: 1,
                dim: t,
                got: split,
                expected: batch[p],
            });
        }
    }
    if transpose_b {
        bmap.extend([0, 1]);
    } else {
        bmap.extend([1, 0]);
    }
    let mut out: Vec<i64> = (0..batch.len()).map(|p| (n - 1 - p) as i64).collect();
    out.extend([2, 0]);
    Ok((dev, vec![amap, bmap], out))
}

/// Drop axes of size 1; returns the squeezed dims and, per old right-counted value, the new
/// right-counted value (or -1 if the axis was dropped). An all-ones matrix becomes `[1]`.
fn squeeze(dev: &[usize]) -> (Vec<usize>, Vec<i64>) {
    let n = dev.len();
    let kept: Vec<usize> = dev.iter().copied().filter(|&d| d != 1).collect();
    let mut remap = vec![-1i64; n];
    let mut right = 0i64;
    for (v, slot) in remap.iter_mut().enumerate() {
        if dev[n - 1 - v] != 1 {
            *slot = right;
            right += 1;
        }
    }
    if kept.is_empty() {
        (vec![1], remap)
    } else {
        (kept, remap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> Strategy {
        t.parse().unwrap()
    }

    #[test]
    fn strategy_parses_both_notations() {
        assert_eq!(s("[[2,1],[1,4]]"), Strategy(vec![vec![2, 1], vec![1, 4]]));
        assert_eq!(s("((2, 1), (1, 4))").to_string(), "((2, 1), (1, 4))");
        assert_eq!(s("[2,4]"), Strategy(vec![vec![2, 4]]));
        assert_eq!(s("((2, 4),)"), Strategy(vec![vec![2, 4]]));
        assert!("[[2,x]]".parse::<Strategy>().is_err());
    }

    #[test]
    fn matmul_column_parallel_matches_mindspore() {
        let l = strategy_layouts(DevMatrixRule::MatMul { transpose_a: false, transpose_b: false }, &s("((2,1),(1,4))"), 8, true).unwrap();
        assert_eq!(l.dev_matrix.dims(), &[2, 4]);
        assert_eq!(l.inputs[0], TensorMap::single(&[1, -1]));
        assert_eq!(l.inputs[1], TensorMap::single(&[-1, 0]));
        assert_eq!(l.output, TensorMap::single(&[1, 0]));
        assert_eq!(l.repeat, 1);
    }

    #[test]
    fn repeat_axis_goes_right_and_shifts_maps() {
        // Add (2,1)+(1,) on 8 devices: dev [2,1,4] squeezed to [2,4]; bias not split.
        let l = strategy_layouts(DevMatrixRule::Elementwise, &s("((2,1),(1,))"), 8, true).unwrap();
        assert_eq!(l.dev_matrix.dims(), &[2, 4]);
        assert_eq!(l.inputs[0], TensorMap::single(&[1, -1]));
        assert_eq!(l.inputs[1], TensorMap::single(&[-1]));
        assert_eq!(l.repeat, 4);
        let left = strategy_layouts(DevMatrixRule::Elementwise, &s("((2,1),(1,))"), 8, false).unwrap();
        assert_eq!(left.dev_matrix.dims(), &[4, 2]);
        assert_eq!(left.inputs[0], TensorMap::single(&[0, -1]));
    }

    #[test]
    fn strategy_errors_by_name() {
        assert!(matches!(
            strategy_layouts(DevMatrixRule::Elementwise, &s("[[3,1]]"), 8, true),
            Err(LayoutError::StrategyNotDividing { product: 3, devices: 8, .. })
        ));
        assert!(matches!(
            strategy_layouts(DevMatrixRule::MatMul { transpose_a: false, transpose_b: false }, &s("((2,4),(2,1))"), 8, true),
            Err(LayoutError::ContractedSplitMismatch { a: 4, b: 2, .. })
        ));
        assert!(matches!(
            strategy_layouts(DevMatrixRule::Elementwise, &s("[[2,4]]"), 8192, true),
            Err(LayoutError::DeviceCountOutOfRange { count: 8192, .. })
        ));
        assert!(matches!(strategy_layouts(DevMatrixRule::Elementwise, &s("[[0,4]]"), 8, true), Err(LayoutError::ZeroSplit { .. })));
        assert!(matches!(
            strategy_layouts(DevMatrixRule::Elementwise, &s("((2,4),(2,))"), 8, true),
            Err(LayoutError::StrategySplitMismatch { input: 1, got: 2, expected: 4, .. })
        ));
    }

    #[test]
    fn transposed_and_batched_matmul() {
        let l = strategy_layouts(DevMatrixRule::MatMul { transpose_a: false, transpose_b: true }, &s("((2,4),(1,4))"), 8, true).unwrap();
        assert_eq!(l.dev_matrix.dims(), &[2, 4]);
        assert_eq!(l.inputs[1], TensorMap::single(&[-1, 0]));
        let b =
            strategy_layouts(DevMatrixRule::MatMul { transpose_a: false, transpose_b: false }, &s("((2,2,1),(2,1,2))"), 8, true).unwrap();
        assert_eq!(b.dev_matrix.dims(), &[2, 2, 2]);
        assert_eq!(b.inputs[0], TensorMap::single(&[2, 1, -1]));
        assert_eq!(b.inputs[1], TensorMap::single(&[2, -1, 0]));
        assert_eq!(b.output, TensorMap::single(&[2, 1, 0]));
    }
}
