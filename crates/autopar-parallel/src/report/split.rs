//! The picture of the split (`autopar plan --svg`): the device matrix, then the biggest
//! parameters and activations cut into the slices the ranks hold, then the costliest
//! redistributions between consecutive ops, each layout drawn before and after. Every line
//! that cuts a dimension, and every slice's tint, takes the colour of the device-matrix axis
//! that cuts it; replicas are said; every caption fits the picture.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use autopar_layout::TensorLayout;

use super::{escape, human_bytes, layout_text, site_text};
use crate::plan::ParallelPlan;

/// Pixels of one character of the picture's monospace 11-px text (at most).
const CHAR: f64 = 6.7;
/// The longest caption drawn whole; a longer one is cut, its whole text in its tooltip.
const LONGEST: usize = 190;
/// Hues of the device-matrix axes 0, 1, 2, ... and their names in the legend.
const AXIS_HUES: [(u32, &str); 6] = [(0, "red"), (210, "blue"), (120, "green"), (35, "orange"), (280, "purple"), (175, "teal")];

fn hue(axis: usize) -> u32 {
    AXIS_HUES[axis % AXIS_HUES.len()].0
}

/// A caption at (x, y), cut to [`LONGEST`] characters (the whole in its tooltip).
fn caption(s: &mut String, x: f64, y: f64, text: &str) {
    if text.chars().count() <= LONGEST {
        let _ = write!(s, r#"<text x="{x:.0}" y="{y:.0}">{}</text>"#, escape(text));
    } else {
        let cut: String = text.chars().take(LONGEST - 3).collect();
        let _ = write!(s, r#"<g><title>{}</title><text x="{x:.0}" y="{y:.0}">{}...</text></g>"#, escape(text), escape(&cut));
    }
}

/// How `l` is cut, in words: each dimension's axes, then the replicas and partial sums.
fn layout_words(l: &TensorLayout) -> String {
    let dims = l.mesh().dims();
    let axis = |a: usize| format!("axis {a} ({}, {})", dims[a], AXIS_HUES[a % AXIS_HUES.len()].1);
    let mut parts: Vec<String> = l
        .dim_axes()
        .iter()
        .enumerate()
        .map(|(d, axes)| match axes.len() {
            0 => format!("dim {d} whole"),
            _ => format!("dim {d} cut {} ways by {}", l.split(d), axes.iter().map(|&a| axis(a)).collect::<Vec<_>>().join(" x ")),
        })
        .collect();
    let replicas: Vec<usize> = l.replica_axes().into_iter().filter(|&a| dims[a] > 1).collect();
    if !replicas.is_empty() {
        let copies: usize = replicas.iter().map(|&a| dims[a]).product();
        parts.push(format!("{copies} copies of each slice, along {}", replicas.iter().map(|&a| axis(a)).collect::<Vec<_>>().join(" x ")));
    }
    if l.is_partial() {
        parts.push(format!("partial sums along {}", l.partial_axes().iter().map(|&a| axis(a)).collect::<Vec<_>>().join(" x ")));
    }
    parts.join("; ")
}

/// The first rank holding each slice of `l` and how many ranks hold it, by (row, column):
/// rows are dimension 0's pieces, columns the other dimensions' together.
fn holders(l: &TensorLayout) -> BTreeMap<(usize, usize), (usize, usize)> {
    let mut out = BTreeMap::new();
    let nd = l.shape().len();
    for r in 0..l.mesh().num_devices() {
        let index = |d: usize| l.dim_index(r, d).unwrap_or(0);
        let row = if nd > 0 { index(0) } else { 0 };
        let col = (1..nd).fold(0, |c, d| c * l.split(d) + index(d));
        out.entry((row, col)).or_insert((r, 0)).1 += 1;
    }
    out
}

/// The first axis cutting dimension `d` of `l`, if any.
fn cutting_axis(l: &TensorLayout, d: usize) -> Option<usize> {
    l.dim_axes().get(d).and_then(|a| a.first()).copied()
}

/// The dimension (1 or more) whose piece changes between columns `j - 1` and `j`: the
/// outermost whose index differs, as the columns count the other dimensions' pieces.
fn column_dim(l: &TensorLayout, j: usize) -> usize {
    let mut inner = 1;
    for d in (1..l.shape().len()).rev() {
        inner *= l.split(d);
        if !j.is_multiple_of(inner) {
            return d;
        }
    }
    1
}

/// The device-matrix axis (1 or more) whose coordinate changes between columns `j - 1` and
/// `j` of a matrix drawn with axis 0 down and the others across.
fn mesh_column_axis(dims: &[usize], j: usize) -> usize {
    let mut inner = 1;
    for a in (1..dims.len()).rev() {
        inner *= dims[a];
        if !j.is_multiple_of(inner) {
            return a;
        }
    }
    1
}

/// `l`'s slices in the box (x, y, w, h): tinted by the axis cutting them, the cuts drawn in
/// their axis' colour, each slice's first rank and replicas written where they fit.
fn draw_slices(s: &mut String, l: &TensorLayout, (x0, y0, w, h): (f64, f64, f64, f64)) {
    let rows = if l.shape().is_empty() { 1 } else { l.split(0) };
    let cols: usize = (1..l.shape().len()).map(|d| l.split(d)).product();
    let (shown_r, shown_c) = (rows.min(32), cols.min(32));
    let (cw, ch) = (w / shown_c as f64, h / shown_r as f64);
    let held = holders(l);
    let tint = cutting_axis(l, 0).or_else(|| (1..l.shape().len()).find_map(|d| cutting_axis(l, d)));
    for i in 0..shown_r {
        for j in 0..shown_c {
            let (first, count) = held.get(&(i, j)).copied().unwrap_or((0, 0));
            let fill = match tint {
                Some(a) => format!("hsl({},60%,{}%)", hue(a), 86 - 12 * ((i + j) % 3)),
                None => "hsl(0,0%,88%)".into(),
            };
            let (x, y) = (x0 + j as f64 * cw, y0 + i as f64 * ch);
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{cw:.1}" height="{ch:.1}" fill="{fill}" stroke="none"><title>slice ({i}, {j}): rank {first} and {} more</title></rect>"#,
                count.saturating_sub(1)
            );
            // Two lines where they fit, else one ("r8 x2"), else the tooltip alone.
            let one = format!("r{first} x{count}");
            if cw > 46.0 && ch > 26.0 {
                let _ = write!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}">r{first}</text><text x="{:.1}" y="{:.1}">x{count}</text>"#,
                    x + 4.0,
                    y + 13.0,
                    x + 4.0,
                    y + 25.0
                );
            } else if cw > one.len() as f64 * CHAR + 6.0 && ch > 13.0 {
                let _ = write!(s, r#"<text x="{:.1}" y="{:.1}">{one}</text>"#, x + 3.0, y + ch / 2.0 + 4.0);
            }
        }
    }
    // The cuts: between rows in dimension 0's axis colour, between columns in the colour of
    // the dimension that changes there.
    if let Some(a) = cutting_axis(l, 0) {
        for i in 1..shown_r {
            let y = y0 + i as f64 * ch;
            let _ = write!(
                s,
                r#"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="hsl({},80%,40%)" stroke-width="2"/>"#,
                x0 + w,
                hue(a)
            );
        }
    }
    for j in 1..shown_c {
        let a = cutting_axis(l, column_dim(l, j)).unwrap_or(0);
        let x = x0 + j as f64 * cw;
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="hsl({},80%,40%)" stroke-width="2"/>"#,
            y0 + h,
            hue(a)
        );
    }
    let _ = write!(s, r#"<rect x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="black"/>"#);
    if rows > shown_r || cols > shown_c {
        caption(s, x0, y0 + h + 14.0, &format!("showing {shown_r} x {shown_c} of {rows} x {cols} slices"));
    }
}

/// One tensor drawn: its name and shape, its cut in words, its slices.
struct Drawn<'a> {
    title: String,
    words: String,
    layout: &'a TensorLayout,
}

/// An SVG of the split: the device matrix, the `count` biggest parameters and activations,
/// and the `count` costliest redistributions (see the module's text).
pub fn split_svg(plan: &ParallelPlan, count: usize) -> String {
    let mut params: Vec<&crate::plan::ParamPlan> = plan.params.iter().collect();
    params.sort_by_key(|p| std::cmp::Reverse(p.layout.shape().iter().product::<usize>()));
    params.truncate(count);
    let mut acts: Vec<&crate::plan::NodePlan> = plan.nodes.iter().filter(|p| !plan.graph.node(p.id).op.is_leaf()).collect();
    acts.sort_by_key(|p| std::cmp::Reverse(p.output.shape().iter().product::<usize>()));
    acts.truncate(count);
    let mut redists: Vec<&crate::plan::Redistribution> = plan.redistributions.iter().filter(|r| r.forward_bytes() > 0).collect();
    redists.sort_by_key(|r| std::cmp::Reverse(r.forward_bytes()));
    redists.truncate(count);
    let tensors: Vec<Drawn<'_>> = params
        .iter()
        .map(|p| Drawn { title: format!("parameter {} {:?}", p.name, p.layout.shape()), words: layout_words(&p.layout), layout: &p.layout })
        .chain(acts.iter().map(|p| Drawn {
            title: format!("activation {} ({}) {:?}", p.name, p.kind, p.output.shape()),
            words: layout_words(&p.output),
            layout: &p.output,
        }))
        .collect();
    let redist_captions: Vec<[String; 2]> = redists
        .iter()
        .map(|r| {
            let steps: Vec<String> = r.plan.steps.iter().map(|st| st.step.to_string()).collect();
            [
                format!("before {}: {} -> {}", site_text(plan, r), layout_text(&r.plan.src), layout_text(&r.plan.dst)),
                format!("{} ({} sent by the busiest rank)", steps.join("; "), human_bytes(r.forward_bytes())),
            ]
        })
        .collect();
    let title = format!(
        "{} on {} devices: the device matrix, the biggest parameters and activations cut into slices, the costliest redistributions",
        plan.mode, plan.device_num
    );
    let legend = "rK: the first rank holding a slice; xN: N ranks hold that slice (replicas); grey: not cut";
    let colours: Vec<String> = AXIS_HUES.iter().enumerate().map(|(a, (_, name))| format!("axis {a} {name}")).collect();
    let axes_legend =
        format!("colours: a cut, and the slices' tint, in the colour of the device-matrix axis cutting it: {}", colours.join(", "));
    let dims = params.first().map(|p| p.layout.mesh().dims().to_vec()).unwrap_or_else(|| vec![plan.device_num]);
    let mesh_rows = if dims.len() > 1 { dims[0].max(1) } else { 1 };
    let mesh_cols = (plan.device_num / mesh_rows).max(1);
    let mesh_caption = if dims.len() > 1 {
        format!("device matrix {dims:?}: each rank at its coordinates, axis 0 (size {mesh_rows}) down, the others across")
    } else {
        format!("device matrix {dims:?}: the ranks in order")
    };
    let longest = tensors
        .iter()
        .flat_map(|t| [&t.title, &t.words])
        .chain(redist_captions.iter().flatten())
        .chain([&title, &legend.to_string(), &axes_legend, &mesh_caption])
        .map(|c| c.chars().count().min(LONGEST))
        .max()
        .unwrap_or(0);
    let w = (longest as f64 * CHAR).max(520.0);
    let (shown_mr, shown_mc) = (mesh_rows.min(16), mesh_cols.min(32));
    let (mcw, mch) = ((w / shown_mc as f64).min(60.0), 22.0);
    let (h, gap, top) = (200.0f64, 70.0f64, 82.0f64);
    let tensors_top = top + 30.0 + shown_mr as f64 * mch + 40.0;
    let redist_top = tensors_top + tensors.len() as f64 * (h + gap) + 20.0;
    let (rh, rgap) = (120.0f64, 70.0f64);
    let total_h = redist_top + 24.0 + redists.len() as f64 * (rh + rgap) + 20.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{total_h:.0}" font-family="monospace" font-size="11">"#,
        w + 40.0
    );
    caption(&mut s, 20.0, 24.0, &title);
    caption(&mut s, 20.0, 42.0, legend);
    caption(&mut s, 20.0, 60.0, &axes_legend);
    caption(&mut s, 20.0, top + 16.0, &mesh_caption);
    for i in 0..shown_mr {
        for j in 0..shown_mc {
            let rank = i * mesh_cols + j;
            let light = 88 - 10 * (i % 3);
            let (x, y) = (20.0 + j as f64 * mcw, top + 26.0 + i as f64 * mch);
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{mcw:.1}" height="{mch:.1}" fill="hsl({},55%,{light}%)" stroke="black" stroke-width="0.5"><title>rank {rank}</title></rect>"#,
                hue(0)
            );
            let label = format!("r{rank}");
            if mcw >= label.len() as f64 * CHAR + 6.0 {
                let _ = write!(s, r#"<text x="{:.1}" y="{:.1}">{label}</text>"#, x + 3.0, y + 15.0);
            }
        }
    }
    // The matrix's cuts in its axes' colours: rows by axis 0 (one axis: the ranks across
    // by it), columns by the axis whose coordinate changes there.
    let mesh_top = top + 26.0;
    for i in 1..shown_mr {
        let y = mesh_top + i as f64 * mch;
        let _ = write!(
            s,
            r#"<line x1="20" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="hsl({},80%,40%)" stroke-width="2"/>"#,
            20.0 + shown_mc as f64 * mcw,
            hue(0)
        );
    }
    for j in 1..shown_mc {
        let axis = if dims.len() > 1 { mesh_column_axis(&dims, j) } else { 0 };
        let x = 20.0 + j as f64 * mcw;
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{mesh_top:.1}" x2="{x:.1}" y2="{:.1}" stroke="hsl({},80%,40%)" stroke-width="2"/>"#,
            mesh_top + shown_mr as f64 * mch,
            hue(axis)
        );
    }
    if mesh_rows > shown_mr || mesh_cols > shown_mc {
        caption(&mut s, 20.0, tensors_top - 12.0, &format!("showing {shown_mr} x {shown_mc} of {mesh_rows} x {mesh_cols} ranks"));
    }
    for (k, t) in tensors.iter().enumerate() {
        let y0 = tensors_top + k as f64 * (h + gap) + 30.0;
        caption(&mut s, 20.0, y0 - 22.0, &t.title);
        caption(&mut s, 20.0, y0 - 8.0, &t.words);
        draw_slices(&mut s, t.layout, (20.0, y0, w, h));
    }
    if !redists.is_empty() {
        caption(
            &mut s,
            20.0,
            redist_top + 10.0,
            "redistributions between consecutive ops, costliest first: the layout produced (left) and the layout read (right)",
        );
    }
    for (k, r) in redists.iter().enumerate() {
        let y0 = redist_top + 24.0 + k as f64 * (rh + rgap) + 30.0;
        caption(&mut s, 20.0, y0 - 22.0, &redist_captions[k][0]);
        caption(&mut s, 20.0, y0 - 8.0, &redist_captions[k][1]);
        let half = (w - 40.0) / 2.0;
        draw_slices(&mut s, &r.plan.src, (20.0, y0, half, rh));
        let _ = write!(s, r#"<text x="{:.1}" y="{:.1}" font-size="16">&#8594;</text>"#, 20.0 + half + 12.0, y0 + rh / 2.0);
        draw_slices(&mut s, &r.plan.dst, (20.0 + half + 40.0, y0, half, rh));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_layout::DeviceMatrix;

    fn layout(dims: Vec<usize>, map: Vec<Vec<usize>>, shape: Vec<usize>) -> TensorLayout {
        TensorLayout::new(DeviceMatrix::new(dims).unwrap(), map, shape).unwrap()
    }

    #[test]
    fn each_slice_is_held_by_its_replicas() {
        // [8, 6] cut 2 ways on rows by axis 0, whole on columns, over a 2 x 2 matrix.
        let l = layout(vec![2, 2], vec![vec![0], vec![]], vec![8, 6]);
        let h = holders(&l);
        assert_eq!(h.len(), 2);
        assert_eq!(h[&(0, 0)], (0, 2));
        assert_eq!(h[&(1, 0)], (2, 2));
        assert!(layout_words(&l).contains("2 copies of each slice, along axis 1 (2, blue)"), "{}", layout_words(&l));
    }

    #[test]
    fn columns_change_at_the_outermost_dimension_that_changes() {
        // Dimensions 1 and 2 cut 2 and 3 ways: columns 0..6, dimension 1 changes at 3.
        let l = layout(vec![2, 3], vec![vec![], vec![0], vec![1]], vec![4, 4, 6]);
        assert_eq!(column_dim(&l, 3), 1);
        assert_eq!(column_dim(&l, 1), 2);
        assert_eq!(column_dim(&l, 4), 2);
        // A [2, 2, 3] matrix: columns over axes 1 and 2, axis 1 changing at 3.
        assert_eq!(mesh_column_axis(&[2, 2, 3], 3), 1);
        assert_eq!(mesh_column_axis(&[2, 2, 3], 2), 2);
    }

    #[test]
    fn a_long_caption_is_cut_and_kept_whole_in_its_tooltip() {
        let mut s = String::new();
        let long = "x".repeat(LONGEST + 10);
        caption(&mut s, 0.0, 0.0, &long);
        assert!(s.contains("...</text>"));
        assert!(s.contains(&long));
    }
}
