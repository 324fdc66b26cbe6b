//! The plan as one self-contained web page (`autopar plan --html`, `autopar train --report`):
//! the summary, a sortable table of every op, the parameters' layouts, the redistributions,
//! the memory of each rank, the pictures, and after a training run what it measured beside
//! what the plan predicted. Nothing is fetched: styles, script and pictures are in the page.

use std::fmt::Write as _;

use super::{
    escape, group_text, human_bytes, human_flops, layout_text, site_text, summary::slice_flops, PipelineReport, PlanReport, SummaryFacts,
};
use crate::cost::Memory;
use crate::job::JobPlan;
use crate::optimizer_shard::OptDecision;
use crate::Result;

/// What a training run measured, shown beside the plan's predictions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// The step the run started from (0, or a resumed checkpoint's).
    pub first_step: u64,
    /// The loss of every step run.
    pub losses: Vec<f64>,
    /// Seconds of every step run (data wait included).
    pub step_seconds: Vec<f64>,
    /// This process's peak resident set (`VmHWM`) at the run's last step, evaluation
    /// aside, in bytes.
    pub peak_rss: Option<u64>,
    /// The ranks this process ran (every rank in process; one under mpirun).
    pub ranks_in_process: usize,
    /// The cores this process may run on.
    pub cores: usize,
    /// The plan's memory of those ranks together, in bytes (what the run holds itself to).
    pub plan_memory: u64,
    /// What the runtime allows beyond the plan for those ranks (its stated overhead), in bytes.
    pub overhead: u64,
    /// Under mpirun, every rank's process's peak resident set (`VmHWM`) at the end of
    /// training, by rank (None: not measured); empty in process.
    pub peak_rss_by_rank: Vec<Option<u64>>,
    /// The ranks that shared this host's cores: every rank in process; under mpirun the
    /// processes started on this host, one rank each.
    pub ranks_on_host: usize,
}

impl Measured {
    /// The median step time and how many steps it is of: the steps after the first (its
    /// warm-up), or the first alone when it is the only one.
    pub fn median_step(&self) -> Option<(f64, usize)> {
        let mut s: Vec<f64> = self.step_seconds.iter().skip(usize::from(self.step_seconds.len() > 1)).copied().collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => s[n / 2],
            _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        };
        Some((median, n))
    }
}

/// The parts of the page.
pub struct Page<'a> {
    /// The plan and its reported rank's cost.
    pub report: &'a PlanReport<'a>,
    /// What the summary prices and compares against.
    pub facts: &'a SummaryFacts<'a>,
    /// A pipeline's report.
    pub pipeline: Option<&'a PipelineReport>,
    /// The predicted memory of ranks (global), from [`rank_memory`].
    pub ranks: &'a [(usize, Memory)],
    /// Pictures: a caption and an SVG document each.
    pub pictures: &'a [(String, String)],
    /// A training run's measurements.
    pub measured: Option<&'a Measured>,
}

/// The most ranks whose memory the page lists; a larger job lists ranks spread over it.
pub const MOST_RANKS: usize = 64;

/// The predicted memory of the job's ranks: every rank up to [`MOST_RANKS`], else that many
/// spread evenly over the job (the first and the last among them), on a communicator that
/// packs a fused collective's parts into one buffer (`packs`: MPI's) or not (the in-process
/// one).
pub fn rank_memory(job: &JobPlan, optimizer_slots: usize, packs: bool) -> Result<Vec<(usize, Memory)>> {
    let n = job.device_num;
    let ranks: Vec<usize> = if n <= MOST_RANKS {
        (0..n).collect()
    } else {
        let mut r: Vec<usize> = (0..MOST_RANKS).map(|i| i * (n - 1) / (MOST_RANKS - 1)).collect();
        r.dedup();
        r
    };
    ranks.into_iter().map(|r| Ok((r, job.program(r)?.memory_on(job, optimizer_slots, packs)?))).collect()
}

/// A sortable table: the header, then rows of cells, each its text and, for numbers, the
/// value it sorts by.
fn table(id: &str, head: &[&str], rows: &[Vec<(String, Option<f64>)>]) -> String {
    let mut s = format!(r#"<table class="sortable" id="{id}"><thead><tr>"#);
    for h in head {
        let _ = write!(s, r#"<th scope="col" title="sort by {0}">{0}</th>"#, escape(h));
    }
    s.push_str("</tr></thead><tbody>\n");
    for r in rows {
        s.push_str("<tr>");
        for (text, v) in r {
            match v {
                Some(v) => {
                    let _ = write!(s, r#"<td class="num" data-v="{v}">{}</td>"#, escape(text));
                }
                None => {
                    let _ = write!(s, "<td>{}</td>", escape(text));
                }
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
    s
}

fn text(t: impl Into<String>) -> (String, Option<f64>) {
    (t.into(), None)
}

fn bytes(b: usize) -> (String, Option<f64>) {
    (human_bytes(b), Some(b as f64))
}

fn number(v: f64, shown: String) -> (String, Option<f64>) {
    (shown, Some(v))
}

const STYLE: &str = r#"
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #1b1b1b; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
pre { background: #f6f6f4; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #eef; cursor: pointer; position: sticky; top: 0; }
th[aria-sort="ascending"]::after { content: " \25B2"; } th[aria-sort="descending"]::after { content: " \25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.over { background: #fdd; } .note { color: #555; font-size: 0.9em; }
figure { margin: 1em 0; overflow-x: auto; } figcaption { font-weight: bold; margin-bottom: 0.4em; }
"#;

/// Sorting by a click on a column's header (numbers by value), and the page's own check:
/// `data-rendered` on the body says every picture was laid out with an extent, and
/// `data-errors` lists any script error.
const SCRIPT: &str = r#"
(function () {
  function sortBy(table, col, th) {
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col], y = b.cells[col];
      var vx = x.getAttribute('data-v'), vy = y.getAttribute('data-v');
      var c = (vx !== null && vy !== null) ? (parseFloat(vx) - parseFloat(vy))
        : x.textContent.localeCompare(y.textContent, undefined, { numeric: true });
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener('click', function () { sortBy(table, col, th); });
    });
  });
  var empty = [];
  document.querySelectorAll('figure svg').forEach(function (svg, i) {
    var b = svg.getBBox();
    if (!(b.width > 0 && b.height > 0)) { empty.push(i); }
  });
  document.body.setAttribute('data-pictures', String(document.querySelectorAll('figure svg').length));
  document.body.setAttribute('data-rendered', empty.length ? 'empty pictures ' + empty.join(',') : 'yes');
})();
"#;

/// Records script errors on the body, before anything else runs.
const ERRORS: &str = r#"
window.addEventListener('error', function (e) {
  var b = document.body || document.documentElement;
  var was = b.getAttribute('data-errors');
  b.setAttribute('data-errors', (was ? was + '; ' : '') + e.message);
});
"#;

/// The page, as one HTML document.
pub fn html(page: &Page<'_>) -> String {
    let r = page.report;
    let title = format!("autopar plan: {}", r.model);
    let mut s = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{STYLE}</style>\n<script>{ERRORS}</script></head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        escape(&title)
    );
    let mut nav = vec![("summary", "summary")];
    if page.measured.is_some() {
        nav.push(("measured", "measured against the plan"));
    }
    nav.extend([
        ("memory", "memory per rank"),
        ("operators", "operators"),
        ("parameters", "parameter layouts"),
        ("redistributions", "redistributions"),
    ]);
    if page.pipeline.is_some() {
        nav.push(("pipeline", "pipeline"));
    }
    if !page.pictures.is_empty() {
        nav.push(("pictures", "pictures"));
    }
    s.push_str("<nav>");
    for (id, name) in &nav {
        let _ = write!(s, r##"<a href="#{id}">{name}</a>"##);
    }
    s.push_str("</nav>\n");
    let _ = write!(s, "<h2 id=\"summary\">Summary</h2>\n<pre>{}{}</pre>\n", escape(&r.header()), escape(&r.summary(page.facts)));
    if let Some(m) = page.measured {
        s.push_str(&measured_section(page, m));
    }
    s.push_str(&memory_section(page));
    s.push_str(&operators_section(r));
    s.push_str(&parameters_section(r, page.facts.rank));
    s.push_str(&redistributions_section(r));
    if let Some(p) = page.pipeline {
        let _ = write!(s, "<h2 id=\"pipeline\">Pipeline</h2>\n<pre>{}</pre>\n", escape(&p.text()));
    }
    if !page.pictures.is_empty() {
        s.push_str("<h2 id=\"pictures\">Pictures</h2>\n");
        for (caption, svg) in page.pictures {
            let _ = write!(s, "<figure><figcaption>{}</figcaption>\n{}</figure>\n", escape(caption), svg.trim_end());
        }
    }
    let _ = write!(s, "<script>{SCRIPT}</script>\n</body></html>\n");
    s
}

/// The run's measurements beside the plan's predictions, and its loss curve.
fn measured_section(page: &Page<'_>, m: &Measured) -> String {
    let predicted = page.report.predicted(page.facts);
    let mut s = String::from("<h2 id=\"measured\">Measured against the plan</h2>\n");
    let ms = |x: f64| format!("{:.2} ms", x * 1e3);
    let measured_step = match (m.median_step(), m.step_seconds.len()) {
        (Some((x, _)), 1) => number(x, format!("{} (the only step, its warm-up included)", ms(x))),
        (Some((x, n)), _) => number(x, format!("{} (median of the {n} steps after the first)", ms(x))),
        (None, _) => text("-"),
    };
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let ranks = plural(m.ranks_in_process, "rank");
    let rows = vec![
        vec![
            text(format!("step time ({} on {} of this host)", plural(m.ranks_on_host, "rank"), plural(m.cores, "core"))),
            number(predicted.total(), ms(predicted.total())),
            measured_step,
        ],
        vec![
            text(format!("memory of this process ({ranks})")),
            number(
                m.plan_memory as f64,
                format!(
                    "{} the plan; the run's budget {} with the runtime's stated overhead",
                    human_bytes(m.plan_memory as usize),
                    human_bytes((m.plan_memory + m.overhead) as usize)
                ),
            ),
            m.peak_rss.map_or(text("- (no /proc)"), |p| {
                number(p as f64, format!("{} peak resident (VmHWM) at the last step", human_bytes(p as usize)))
            }),
        ],
    ];
    s.push_str(&table("measured-table", &["figure", "predicted", "measured"], &rows));
    let mut notes = Vec::new();
    if let (Some(first), true) = (m.step_seconds.first(), m.step_seconds.len() > 1) {
        notes.push(format!("The first step ({}) includes warm-up.", ms(*first)));
    }
    notes.push(
        "The prediction gives each rank a device of the profile's rates and overlaps nothing; the memory row counts the process's own runtime (its binary, allocator, thread stacks) outside the plan, which the budget allows for."
            .to_string(),
    );
    if m.ranks_on_host > m.cores {
        notes.push(format!(
            "{} shared {} of this host: they took turns, so the measured step is about {:.1} times what a device each would take.",
            plural(m.ranks_on_host, "rank"),
            plural(m.cores, "core"),
            m.ranks_on_host as f64 / m.cores.max(1) as f64,
        ));
    } else {
        notes.push(
            "A ratio far from 1 says the profile does not describe this machine (<code>autopar calibrate</code> measures one).".to_string(),
        );
    }
    let _ = writeln!(s, "<p class=\"note\">{}</p>", notes.join(" "));
    if m.losses.len() > 1 {
        let _ = write!(s, "<figure><figcaption>loss per step</figcaption>\n{}</figure>\n", loss_svg(&m.losses, m.first_step));
    }
    s
}

/// The loss curve as an SVG polyline, its first and last steps and values written.
fn loss_svg(losses: &[f64], first_step: u64) -> String {
    let (w, h, left, top, bottom) = (720.0f64, 240.0f64, 50.0f64, 30.0f64, 200.0f64);
    let finite: Vec<f64> = losses.iter().copied().filter(|x| x.is_finite()).collect();
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let n = (losses.len().max(2) - 1) as f64;
    let points: Vec<String> = losses
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, l)| format!("{:.1},{:.1}", left + i as f64 / n * (w - 2.0 * left), bottom - (l - lo) / span * (bottom - top)))
        .collect();
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 0.0) };
    let (a, b) = (first_step + 1, first_step + losses.len() as u64);
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="11"><rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#ccc"/><polyline points="{}" fill="none" stroke="steelblue" stroke-width="1.5"/><text x="{left}" y="20">loss {:.4} at step {a}, {:.4} at step {b} (from {lo:.4} to {hi:.4})</text><text x="{left}" y="{}">step {a}</text><text x="{}" y="{}" text-anchor="end">step {b}</text></svg>"##,
        w - 2.0 * left,
        bottom - top,
        points.join(" "),
        losses.first().copied().unwrap_or(0.0),
        losses.last().copied().unwrap_or(0.0),
        bottom + 16.0,
        w - left,
        bottom + 16.0,
    )
}

/// The predicted memory of each rank listed, against the limit when it is per device.
fn memory_section(page: &Page<'_>) -> String {
    let n = page.report.devices();
    let mut s = String::from("<h2 id=\"memory\">Memory per rank (predicted)</h2>\n");
    if page.ranks.len() < n {
        let _ = writeln!(s, "<p class=\"note\">{} of the {n} ranks, spread over the job.</p>", page.ranks.len());
    }
    let limit = page.facts.limit.as_ref().filter(|l| l.per_device);
    if let Some(l) = limit {
        let _ = writeln!(
            s,
            "<p class=\"note\">Held against {} per device ({}); ranks over it are marked.</p>",
            human_bytes(l.bytes as usize),
            escape(&l.what)
        );
    }
    let mut head =
        vec!["rank", "parameters", "gradients", "optimizer state", "peak activations", "activations alone", "comm buffers", "total"];
    // Under mpirun each rank's process measured itself.
    let measured = page.measured.map(|m| &m.peak_rss_by_rank[..]).filter(|p| !p.is_empty());
    if measured.is_some() {
        head.push("measured: its process's peak resident (VmHWM)");
        let _ = writeln!(
            s,
            "<p class=\"note\">Measured: each rank's process, one rank each under mpirun, from its start to the end of training (evaluation aside), beside the plan's total; the process's own runtime (binary, allocator, buffers) is outside the plan.</p>"
        );
    }
    let rows: Vec<Vec<(String, Option<f64>)>> = page
        .ranks
        .iter()
        .map(|(rank, m)| {
            let mut row = vec![
                number(*rank as f64, rank.to_string()),
                bytes(m.parameters),
                bytes(m.gradients),
                bytes(m.optimizer_state),
                bytes(m.peak_activations),
                bytes(m.activations),
                bytes(m.comm_buffers),
                bytes(m.total()),
            ];
            if let Some(p) = measured {
                row.push(p.get(*rank).copied().flatten().map_or(text("- (no /proc)"), |b| bytes(b as usize)));
            }
            row
        })
        .collect();
    let mut t = table("memory-table", &head, &rows);
    if let Some(l) = limit {
        for (rank, m) in page.ranks {
            if m.total() as u64 > l.bytes {
                t = t.replacen(
                    &format!("<tr><td class=\"num\" data-v=\"{rank}\">"),
                    &format!("<tr class=\"over\"><td class=\"num\" data-v=\"{rank}\">"),
                    1,
                );
            }
        }
    }
    s.push_str(&t);
    s
}

/// Every op: its strategy, who chose it, its layouts, its collectives and its slice's FLOPs.
fn operators_section(r: &PlanReport<'_>) -> String {
    let plan = r.plan;
    let rows: Vec<Vec<(String, Option<f64>)>> = plan
        .nodes
        .iter()
        .filter(|p| !plan.graph.node(p.id).op.is_leaf())
        .map(|p| {
            let flops = slice_flops(plan, p);
            let ins: Vec<String> = p.inputs.iter().map(|l| l.to_string()).collect();
            vec![
                text(p.name.clone()),
                text(p.kind.to_string()),
                text(p.strategy_text()),
                text(p.source.map(|x| x.name()).unwrap_or("-")),
                text(format!("{:?}", p.output.mesh().dims())),
                text(ins.join(" ")),
                text(format!("{}{}", p.output, if p.output.is_partial() { " (partial)" } else { "" })),
                number(flops, human_flops(flops)),
                text(p.sync.describe()),
            ]
        })
        .collect();
    let head = ["name", "op", "strategy", "chosen by", "device matrix", "inputs", "output", "forward FLOPs (slice)", "in-op collectives"];
    format!(
        "<h2 id=\"operators\">Operators ({})</h2>\n<p class=\"note\">Click a column's header to sort by it.</p>\n{}",
        rows.len(),
        table("operators-table", &head, &rows)
    )
}

/// Every parameter's layout, its slice, its mirror group and its optimizer shard.
fn parameters_section(r: &PlanReport<'_>, world_rank: usize) -> String {
    let plan = r.plan;
    // In a pipeline the plan's ranks are positions in a stage: groups in world ranks.
    let rank = r.cost.rank;
    let rows: Vec<Vec<(String, Option<f64>)>> = plan
        .params
        .iter()
        .map(|p| {
            let l = &p.layout;
            let numel: usize = l.shape().iter().product();
            let shard = match &p.opt {
                OptDecision::Disabled => "-".to_string(),
                OptDecision::Sharded(sh) => {
                    format!("over {}, stores {:?}", group_text(&r.world_group(&p.name, &sh.group(rank)).0), p.stored_shape())
                }
                OptDecision::Whole(why) => format!("whole: {why}"),
            };
            vec![
                text(p.name.clone()),
                number(numel as f64, format!("{:?}", l.shape())),
                text(p.dtype.to_string()),
                text(format!("{:?}", l.mesh().dims())),
                text(l.tensor_map().to_string()),
                text(format!("{:?}", l.slice_shape())),
                bytes(l.slice_len() * p.dtype.size()),
                if p.trainable {
                    number(
                        p.mirror.iter().map(|a| a.size).product::<usize>() as f64,
                        group_text(&r.world_group(&p.name, &p.mirror_group(rank)).0),
                    )
                } else {
                    text("frozen")
                },
                text(shard),
            ]
        })
        .collect();
    let head = ["name", "shape", "dtype", "dev_matrix", "tensor_map", "slice", "slice bytes", "gradient summed over", "optimizer shard"];
    let whose = match r.world {
        Some(_) => format!(
            "the groups are those of position {rank} of each parameter's stage, in world ranks (rank {world_rank}'s for its own stage's parameters; a parameter on several stages, its group on rank {world_rank}'s stage when that stage holds it)"
        ),
        None => format!("the groups are rank {world_rank}'s"),
    };
    format!(
        "<h2 id=\"parameters\">Parameter layouts ({})</h2>\n<p class=\"note\">MindSpore's dev_matrix and tensor_map; {whose}.</p>\n{}",
        rows.len(),
        table("parameters-table", &head, &rows)
    )
}

/// Every redistribution between ops: where, from and to which layout, its steps and bytes.
fn redistributions_section(r: &PlanReport<'_>) -> String {
    let plan = r.plan;
    let rows: Vec<Vec<(String, Option<f64>)>> = plan
        .redistributions
        .iter()
        .map(|x| {
            let steps: Vec<String> = x.plan.steps.iter().map(|st| st.step.to_string()).collect();
            vec![
                text(site_text(plan, x)),
                text(layout_text(&x.plan.src)),
                text(layout_text(&x.plan.dst)),
                text(steps.join("; ")),
                bytes(x.forward_bytes()),
            ]
        })
        .collect();
    let head = ["before", "from", "to", "forward steps", "sent by the busiest rank"];
    if rows.is_empty() {
        return "<h2 id=\"redistributions\">Redistributions</h2>\n<p>None: every op reads its inputs as they are produced.</p>\n".into();
    }
    format!("<h2 id=\"redistributions\">Redistributions ({})</h2>\n{}", rows.len(), table("redistributions-table", &head, &rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_numbers_sort_by_value() {
        let t = table("t", &["a<b"], &[vec![bytes(2048)], vec![text("<script>")]]);
        assert!(t.contains("a&lt;b"));
        assert!(t.contains(r#"data-v="2048""#));
        assert!(t.contains("&lt;script&gt;"));
        assert!(!t.contains("<script>"));
    }

    #[test]
    fn the_median_step_leaves_the_first_aside() {
        let m = Measured { step_seconds: vec![9.0, 1.0, 3.0, 2.0], ..Default::default() };
        assert_eq!(m.median_step(), Some((2.0, 3)));
        let even = Measured { step_seconds: vec![9.0, 1.0, 3.0, 2.0, 4.0], ..Default::default() };
        assert_eq!(even.median_step(), Some((2.5, 4)));
        let one = Measured { step_seconds: vec![4.0], ..Default::default() };
        assert_eq!(one.median_step(), Some((4.0, 1)));
        assert_eq!(Measured::default().median_step(), None);
    }

    #[test]
    fn the_loss_curve_has_a_point_per_finite_step() {
        let svg = loss_svg(&[3.0, 2.0, f64::NAN, 1.0], 5);
        assert!(svg.contains("at step 6") && svg.contains("at step 9"), "{svg}");
        let points = svg.split("points=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default();
        assert_eq!(points.split(' ').count(), 3);
    }
}
