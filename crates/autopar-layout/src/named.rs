//! MindSpore's `Layout`: a device matrix whose axes have names, and for each input of an op the
//! names of the axes that split each of its dimensions.
//!
//! ```text
//! layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
//! matmul.shard(in_strategy=(layout("dp", "sp"), layout("sp", ("mp", "dp"))))
//! ```
//!
//! Where a strategy gives split counts and leaves the device matrix to the op's rule, a layout
//! chooses the device matrix and which axis splits which dimension: several axes may split one
//! dimension (the first named is the most significant), `"None"` leaves a dimension whole, and
//! an axis no dimension names holds replicas. The alias `"interleaved_parallel"`, last in the
//! device matrix when present, is MindSpore's virtual split of a dimension into chunks computed
//! one after another on the same device: it is not a device axis, so it changes no slice a rank
//! holds and no number it computes; autopar computes the chunks together.
//!
//! The text form is MindSpore's call written out, `Layout((2, 4), ("dp", "mp"))(("dp", "None"),
//! ("None", "mp"))`: one tuple per input, in the op's input order.

use std::fmt;
use std::str::FromStr;

use crate::error::{LayoutError, Result, MAX_DEVICES};
use crate::mesh::DeviceMatrix;
use crate::strategy::Strategy;

/// The alias of MindSpore's virtual axis (chunks computed in turn on one device).
pub const INTERLEAVED: &str = "interleaved_parallel";

/// A MindSpore `Layout` applied to each input of one op.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedLayout {
    dev_matrix: Vec<usize>,
    alias: Vec<String>,
    /// Per input, per dimension: the positions in `dev_matrix` of the axes splitting it, the
    /// most significant first (empty: not split).
    inputs: Vec<Vec<Vec<usize>>>,
}

impl NamedLayout {
    /// A layout from MindSpore's arguments: the device matrix, its axis names, and per input
    /// and dimension the names splitting it (an empty list or `"None"`: not split).
    pub fn new(dev_matrix: Vec<usize>, alias: Vec<String>, inputs: Vec<Vec<Vec<String>>>) -> Result<Self> {
        let text = || Self::text_of(&dev_matrix, &alias, &inputs);
        let bad = |what: String| LayoutError::BadLayout { layout: text(), what };
        if dev_matrix.len() != alias.len() {
            return Err(bad(format!("{} device axes and {} names", dev_matrix.len(), alias.len())));
        }
        if dev_matrix.is_empty() {
            return Err(bad("the device matrix has no axis".into()));
        }
        if let Some(a) = dev_matrix.iter().position(|&d| d == 0) {
            return Err(bad(format!("axis {:?} has size 0", alias[a])));
        }
        // Every product of axes is at most the whole matrix's: bounded, none overflows.
        let spans = dev_matrix.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d).filter(|&p| p <= MAX_DEVICES * MAX_DEVICES));
        if spans.is_none() {
            return Err(bad(format!("the device matrix spans more than {MAX_DEVICES} devices (and its virtual split)")));
        }
        for (i, a) in alias.iter().enumerate() {
            if a.is_empty() || a == "None" {
                return Err(bad(format!("axis {i} is named {a:?}; \"None\" means not split and cannot name an axis")));
            }
            if alias[..i].contains(a) {
                return Err(bad(format!("two axes are named {a:?}")));
            }
            if a == INTERLEAVED && i + 1 != alias.len() {
                return Err(bad(format!("{INTERLEAVED:?} must name the last axis of the device matrix (a virtual split)")));
            }
        }
        if inputs.is_empty() {
            return Err(bad("no input is given a layout".into()));
        }
        let mut resolved = Vec::with_capacity(inputs.len());
        for (i, dims) in inputs.iter().enumerate() {
            let mut used: Vec<usize> = Vec::new();
            let mut out = Vec::with_capacity(dims.len());
            for names in dims {
                let mut axes = Vec::new();
                for name in names.iter().filter(|n| n.as_str() != "None") {
                    let a = alias
                        .iter()
                        .position(|x| x == name)
                        .ok_or_else(|| bad(format!("input {i} names axis {name:?}, which is not one of the device matrix's {alias:?}")))?;
                    if used.contains(&a) {
                        return Err(bad(format!("input {i} is split by axis {name:?} twice; an axis splits at most one dimension")));
                    }
                    used.push(a);
                    axes.push(a);
                }
                if axes.iter().rev().skip(1).any(|&a| alias[a] == INTERLEAVED) {
                    return Err(bad(format!(
                        "input {i} names {INTERLEAVED:?} before another axis of the same dimension; it must be the dimension's last (least significant)"
                    )));
                }
                out.push(axes);
            }
            resolved.push(out);
        }
        Ok(Self { dev_matrix, alias, inputs: resolved })
    }

    /// The device matrix as given (the virtual axis included).
    pub fn dev_matrix(&self) -> &[usize] {
        &self.dev_matrix
    }

    /// The axis names, in device-matrix order.
    pub fn alias(&self) -> &[String] {
        &self.alias
    }

    /// How many inputs the layout covers.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Per dimension of input `i`, the positions in [`Self::dev_matrix`] of the axes splitting it.
    pub fn input_axes(&self, i: usize) -> &[Vec<usize>] {
        &self.inputs[i]
    }

    fn is_device_axis(&self, a: usize) -> bool {
        self.alias[a] != INTERLEAVED
    }

    /// The devices the layout spans: the product of its device axes (not the virtual one).
    pub fn devices(&self) -> usize {
        (0..self.dev_matrix.len()).filter(|&a| self.is_device_axis(a)).map(|a| self.dev_matrix[a]).product()
    }

    /// The split counts the layout gives each input dimension (device axes only): the
    /// strategy it is, as MindSpore reports one.
    pub fn strategy(&self) -> Strategy {
        Strategy(
            self.inputs
                .iter()
                .map(|dims| {
                    dims.iter()
                        .map(|axes| axes.iter().filter(|&&a| self.is_device_axis(a)).map(|&a| self.dev_matrix[a]).product())
                        .collect()
                })
                .collect(),
        )
    }

    /// The device matrix ranks are arranged on (the device axes, in order, as MindSpore
    /// reports it: axes of size 1 kept, the virtual axis left out) and, for each position of
    /// [`Self::dev_matrix`], its axis there (None: the virtual axis).
    pub fn mesh(&self) -> Result<(DeviceMatrix, Vec<Option<usize>>)> {
        let mut dims = Vec::new();
        let mut index = vec![None; self.dev_matrix.len()];
        for (a, &d) in self.dev_matrix.iter().enumerate() {
            if self.is_device_axis(a) {
                index[a] = Some(dims.len());
                dims.push(d);
            }
        }
        if dims.is_empty() {
            dims.push(1);
        }
        Ok((DeviceMatrix::new(dims)?, index))
    }

    /// Per dimension of input `i`, its axes in [`Self::mesh`]'s device matrix.
    pub fn mesh_axes(&self, i: usize) -> Result<Vec<Vec<usize>>> {
        let (_, index) = self.mesh()?;
        Ok(self.inputs[i].iter().map(|axes| axes.iter().filter_map(|&a| index[a]).collect()).collect())
    }

    fn text_of(dev_matrix: &[usize], alias: &[String], inputs: &[Vec<Vec<String>>]) -> String {
        let names = |xs: &[String]| -> String { tuple(xs.iter().map(|x| format!("\"{x}\""))) };
        let inputs = inputs.iter().map(|dims| {
            tuple(dims.iter().map(|axes| match axes.as_slice() {
                [] => "\"None\"".to_string(),
                [one] => format!("\"{one}\""),
                many => names(many),
            }))
        });
        format!("Layout({}, {}){}", tuple(dev_matrix.iter().map(|d| d.to_string())), names(alias), tuple(inputs))
    }

    fn named_inputs(&self) -> Vec<Vec<Vec<String>>> {
        self.inputs.iter().map(|dims| dims.iter().map(|axes| axes.iter().map(|&a| self.alias[a].clone()).collect()).collect()).collect()
    }
}

/// `(a, b)`, `(a,)` for one item: Python's tuple notation.
fn tuple(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.len() == 1 {
        format!("({},)", items[0])
    } else {
        format!("({})", items.join(", "))
    }
}

impl fmt::Display for NamedLayout {
    /// `Layout((2, 4), ("dp", "mp"))(("dp", "None"), ("None", "mp"))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Self::text_of(&self.dev_matrix, &self.alias, &self.named_inputs()))
    }
}

/// One item of the text form: a number, a quoted name or a tuple.
#[derive(Debug)]
enum Item {
    Num(usize),
    Name(String),
    Tuple(Vec<Item>),
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn item(&mut self) -> std::result::Result<Item, String> {
        self.skip();
        match self.s.get(self.at) {
            Some(b'(') | Some(b'[') => {
                let close = if self.s[self.at] == b'(' { b')' } else { b']' };
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        return Ok(Item::Tuple(items));
                    }
                    items.push(self.item()?);
                    if !self.eat(b',') && !matches!(self.peek(), Some(c) if c == close) {
                        return Err(format!("expected ',' or '{}' at byte {}", close as char, self.at));
                    }
                }
            }
            Some(&q) if q == b'"' || q == b'\'' => {
                self.at += 1;
                let start = self.at;
                while self.at < self.s.len() && self.s[self.at] != q {
                    self.at += 1;
                }
                if self.at == self.s.len() {
                    return Err("a name's quote is not closed".into());
                }
                let name = String::from_utf8_lossy(&self.s[start..self.at]).into_owned();
                self.at += 1;
                Ok(Item::Name(name))
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.at;
                while self.at < self.s.len() && self.s[self.at].is_ascii_digit() {
                    self.at += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
                t.parse().map(Item::Num).map_err(|_| format!("{t:?} is not a device count"))
            }
            Some(b'N') if self.s[self.at..].starts_with(b"None") => {
                self.at += 4;
                Ok(Item::Name("None".into()))
            }
            Some(&c) => Err(format!("unexpected {:?} at byte {}", c as char, self.at)),
            None => Err("the text ends early".into()),
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip();
        self.s.get(self.at).copied()
    }
}

impl FromStr for NamedLayout {
    type Err = LayoutError;

    /// Parses the text form (quotes single or double; `None` bare or quoted).
    fn from_str(text: &str) -> Result<Self> {
        let err = |reason: String| LayoutError::Parse { what: "layout", text: text.to_string(), reason };
        let t = text.trim();
        let rest = t.strip_prefix("Layout").or_else(|| t.strip_prefix("layout")).ok_or_else(|| {
            err("expected Layout(device_matrix, alias_name)(input layouts...), e.g. Layout((2, 4), (\"dp\", \"mp\"))((\"dp\", \"None\"),)".into())
        })?;
        let mut p = Parser { s: rest.as_bytes(), at: 0 };
        let args = p.item().map_err(&err)?;
        let inputs = p.item().map_err(&err)?;
        if p.peek().is_some() {
            return Err(err(format!("unexpected text after the layout at byte {}", p.at)));
        }
        let Item::Tuple(args) = args else { return Err(err("expected (device_matrix, alias_name) after Layout".into())) };
        let [Item::Tuple(dims), Item::Tuple(names)] = &args[..] else {
            return Err(err("expected two tuples after Layout: the device matrix and the axis names".into()));
        };
        let dev_matrix = dims
            .iter()
            .map(|d| match d {
                Item::Num(n) => Ok(*n),
                other => Err(err(format!("device matrix entry {other:?} is not a number"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let name = |i: &Item| match i {
            Item::Name(n) => Ok(n.clone()),
            other => Err(err(format!("{other:?} is not a quoted axis name"))),
        };
        let alias = names.iter().map(name).collect::<Result<Vec<_>>>()?;
        let Item::Tuple(inputs) = inputs else { return Err(err("expected a tuple of input layouts after Layout(...)".into())) };
        let inputs = inputs
            .iter()
            .map(|input| match input {
                Item::Tuple(dims) => dims
                    .iter()
                    .map(|d| match d {
                        Item::Tuple(many) => many.iter().map(name).collect(),
                        one => Ok(vec![name(one)?]),
                    })
                    .collect::<Result<Vec<Vec<String>>>>(),
                other => Err(err(format!("input layout {other:?} is not a tuple of axis names"))),
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(dev_matrix, alias, inputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> NamedLayout {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn text_round_trips_and_gives_counts() {
        let x = l(r#"Layout((2, 2, 2), ("dp", "sp", "mp"))(("dp", "None"), ("None", ("mp", "sp")))"#);
        assert_eq!(x.to_string(), r#"Layout((2, 2, 2), ("dp", "sp", "mp"))(("dp", "None"), ("None", ("mp", "sp")))"#);
        assert_eq!(l(&x.to_string()), x);
        assert_eq!(x.strategy(), Strategy(vec![vec![2, 1], vec![1, 4]]));
        assert_eq!(x.input_axes(1), &[vec![], vec![2, 1]]);
        assert_eq!(x.devices(), 8);
        // Python's own spelling: single quotes, one-element tuples, None bare.
        let y = l("layout((4,), ('dp',))(('dp',), (None,))");
        assert_eq!(y.strategy(), Strategy(vec![vec![4], vec![1]]));
    }

    #[test]
    fn the_virtual_axis_and_axes_of_one_are_not_device_axes() {
        let x = l(r#"Layout((2, 1, 4, 2), ("dp", "one", "mp", "interleaved_parallel"))((("dp", "interleaved_parallel"), "mp"),)"#);
        assert_eq!(x.devices(), 8);
        assert_eq!(x.strategy(), Strategy(vec![vec![2, 4]]));
        let (mesh, index) = x.mesh().unwrap();
        assert_eq!(mesh.dims(), &[2, 1, 4]);
        assert_eq!(index, vec![Some(0), Some(1), Some(2), None]);
        assert_eq!(x.mesh_axes(0).unwrap(), vec![vec![0], vec![2]]);
    }

    #[test]
    fn malformed_layouts_say_what_is_wrong() {
        for (text, want) in [
            (r#"Layout((2, 4), ("dp",))(("dp",),)"#, "2 device axes and 1 names"),
            (r#"Layout((2, 4), ("dp", "dp"))(("dp",),)"#, "two axes are named"),
            (r#"Layout((2, 4), ("dp", "mp"))(("tp", "None"),)"#, "not one of the device matrix's"),
            (r#"Layout((2, 4), ("dp", "mp"))(("dp", "dp"),)"#, "twice"),
            (r#"Layout((2, 4), ("interleaved_parallel", "mp"))(("mp",),)"#, "last axis"),
            (r#"Layout((2, 4), ("dp", "None"))(("dp",),)"#, "cannot name an axis"),
            (r#"Layout((2, 4), ("dp", "mp"))"#, "ends early"),
            (r#"Strategy((2, 4))"#, "expected Layout"),
            (r#"Layout((2, x), ("dp", "mp"))(("dp",),)"#, "unexpected"),
            (r#"Layout((2, 2), ("dp", "interleaved_parallel"))((("interleaved_parallel", "dp"),),)"#, "dimension's last"),
            (r#"Layout((1099511627776, 1099511627776), ("dp", "mp"))(("dp",),)"#, "more than 4096 devices"),
        ] {
            let e = text.parse::<NamedLayout>().unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
