//! Training callbacks, run on rank 0 after every step: the loss monitor (MindSpore's
//! `LossMonitor` lines), the metrics writer (one JSON object per step) and its loss-curve SVG.
//! Checkpoints are not a rank-0 callback: every rank writes its own slices (see
//! [`crate::trainer`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{TrainError, TrainResult};

/// What a callback learns after a step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEvent {
    /// Global step, counted from 1.
    pub step: u64,
    /// Epoch, counted from 1.
    pub epoch: u64,
    /// Step within the epoch, counted from 1.
    pub step_in_epoch: u64,
    /// Steps in one epoch.
    pub steps_per_epoch: u64,
    /// The last step of the run.
    pub total_steps: u64,
    /// The global loss of the step.
    pub loss: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// Global samples per second of this step (data wait included).
    pub samples_per_sec: f64,
    /// Global batch size.
    pub batch_size: usize,
    /// With loss scaling: the scale the step's backward pass was seeded with.
    pub loss_scale: Option<f64>,
    /// With loss scaling: the step's gradients overflowed on some rank (its update skipped
    /// unless the scale keeps overflowed steps).
    pub overflow: bool,
}

/// A hook into the training loop (rank 0).
pub trait Callback: Send {
    /// Training starts at `first_step` (0, or the step a resumed run continues from).
    fn on_train_begin(&mut self, _first_step: u64, _total_steps: u64) -> TrainResult<()> {
        Ok(())
    }
    /// A step finished; `event` says which and how it went.
    fn on_step_end(&mut self, event: &StepEvent) -> TrainResult<()>;
    /// `epoch` counted from 1.
    fn on_epoch_end(&mut self, _epoch: u64, _last: &StepEvent) -> TrainResult<()> {
        Ok(())
    }
    /// Training finished: called once after the last step (and its final checkpoint).
    fn on_train_end(&mut self) -> TrainResult<()> {
        Ok(())
    }
}

/// MindSpore's `LossMonitor`: `epoch: 1 step: 156, loss is 2.0084016` (the step counted within
/// the epoch) every `per_print_times` steps of the run, to any writer (stdout by default). As
/// in MindSpore, steps are counted over the run, not within each epoch (so a period longer than
/// an epoch still prints), from the last line printed (so a resumed run prints at its first step
/// past the period, then every period).
pub struct LossMonitor {
    per_print_times: u64,
    last_print: u64,
    out: Box<dyn Write + Send>,
}

impl LossMonitor {
    /// Prints to stdout every `per_print_times` steps (0: never).
    pub fn new(per_print_times: u64) -> Self {
        Self::with_writer(per_print_times, Box::new(std::io::stdout()))
    }

    /// Prints to `out` every `per_print_times` steps (0: never).
    pub fn with_writer(per_print_times: u64, out: Box<dyn Write + Send>) -> Self {
        Self { per_print_times, last_print: 0, out }
    }

    /// The monitor's line for `event`.
    pub fn line(event: &StepEvent) -> String {
        format!("epoch: {} step: {}, loss is {}", event.epoch, event.step_in_epoch, event.loss as f32)
    }
}

impl Callback for LossMonitor {
    fn on_step_end(&mut self, event: &StepEvent) -> TrainResult<()> {
        if self.per_print_times > 0 && event.step.saturating_sub(self.last_print) >= self.per_print_times {
            self.last_print = event.step;
            let _ = writeln!(self.out, "{}", Self::line(event));
        }
        Ok(())
    }
}

/// Writes one JSON object per step (`{"step":1,"epoch":1,"loss":2.31,"lr":0.01,"samples_per_sec":812.4}`,
/// with `loss_scale` and `overflow` when the loss is scaled) to a file, flushed every step; optionally the loss curve as an SVG beside it at the end.
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    svg: Option<PathBuf>,
    history: Vec<(u64, f64)>,
}

impl MetricsWriter {
    /// Creates (or, with `append`, extends: a resumed run) the file at `path`.
    pub fn create(path: &Path, append: bool) -> TrainResult<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| TrainError::Write { path: dir.to_path_buf(), source })?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|source| TrainError::Write { path: path.to_path_buf(), source })?;
        // A resumed run's curve starts with the steps the file already holds.
        let history = if append { std::fs::read_to_string(path).map(|text| logged_losses(&text)).unwrap_or_default() } else { Vec::new() };
        Ok(Self { path: path.to_path_buf(), out: BufWriter::new(file), svg: None, history })
    }

    /// Also write the loss curve to `svg` when training ends.
    pub fn with_plot(mut self, svg: PathBuf) -> Self {
        self.svg = Some(svg);
        self
    }

    /// The SVG beside a metrics file: `metrics.jsonl` -> `metrics.svg`.
    pub fn plot_path(metrics: &Path) -> PathBuf {
        metrics.with_extension("svg")
    }
}

impl Callback for MetricsWriter {
    fn on_step_end(&mut self, e: &StepEvent) -> TrainResult<()> {
        let mut obj = serde_json::json!({
            "step": e.step,
            "epoch": e.epoch,
            "loss": e.loss,
            "lr": e.lr,
            "samples_per_sec": e.samples_per_sec,
        });
        if let Some(scale) = e.loss_scale {
            obj["loss_scale"] = scale.into();
            obj["overflow"] = e.overflow.into();
        }
        writeln!(self.out, "{obj}")
            .and_then(|_| self.out.flush())
            .map_err(|source| TrainError::Write { path: self.path.clone(), source })?;
        // Steps a killed run logged past its last checkpoint are run again: the new ones count.
        self.history.retain(|&(step, _)| step < e.step);
        self.history.push((e.step, e.loss));
        Ok(())
    }

    fn on_train_end(&mut self) -> TrainResult<()> {
        self.out.flush().map_err(|source| TrainError::Write { path: self.path.clone(), source })?;
        if let Some(svg) = &self.svg {
            write_loss_svg(svg, &self.history)?;
        }
        Ok(())
    }
}

/// The (step, loss) of every line of a metrics file that has both (other lines are skipped).
fn logged_losses(text: &str) -> Vec<(u64, f64)> {
    text.lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            Some((v.get("step")?.as_u64()?, v.get("loss")?.as_f64()?))
        })
        .collect()
}

/// Write the loss curve `points` (step, loss) as an SVG line chart, atomically.
pub fn write_loss_svg(path: &Path, points: &[(u64, f64)]) -> TrainResult<()> {
    let svg = loss_svg(points);
    autopar_data::write_atomic(path, svg.as_bytes()).map_err(TrainError::from)
}

/// The SVG text of a loss curve: axes with ticks, the curve, a title.
pub fn loss_svg(points: &[(u64, f64)]) -> String {
    let (w, h) = (800.0f64, 480.0f64);
    let (left, right, top, bottom) = (70.0, 20.0, 40.0, 50.0);
    let finite: Vec<(f64, f64)> = points.iter().filter(|(_, l)| l.is_finite()).map(|&(s, l)| (s as f64, l)).collect();
    let (x0, x1) = finite.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &(x, _)| (a.min(x), b.max(x)));
    let (y0, y1) = finite.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &(_, y)| (a.min(y), b.max(y)));
    let (x0, x1) = if finite.is_empty() {
        (0.0, 1.0)
    } else if x1 > x0 {
        (x0, x1)
    } else {
        (x0 - 1.0, x1 + 1.0)
    };
    let (y0, y1) = if finite.is_empty() {
        (0.0, 1.0)
    } else if y1 > y0 {
        (y0.min(0.0_f64.max(y0)), y1)
    } else {
        (y0 - 0.5, y1 + 0.5)
    };
    let pw = w - left - right;
    let ph = h - top - bottom;
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| top + (1.0 - (y - y0) / (y1 - y0)) * ph;
    let mut s = String::new();
    s.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    ));
    s.push_str(&format!("<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n"));
    s.push_str(&format!("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">training loss</text>\n", left + pw / 2.0));
    // Step ticks on whole steps, at most 6 of them.
    let every = ((x1 - x0) / 5.0).ceil().max(1.0);
    let mut fx = x0.ceil();
    while fx <= x1 {
        let px = sx(fx);
        s.push_str(&format!("<line x1=\"{px:.1}\" y1=\"{top}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#e0e0e0\"/>\n", top + ph));
        s.push_str(&format!("<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{fx}</text>\n", top + ph + 18.0));
        fx += every;
    }
    for i in 0..=5 {
        let fy = y0 + (y1 - y0) * i as f64 / 5.0;
        let py = sy(fy);
        s.push_str(&format!("<line x1=\"{left}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#e0e0e0\"/>\n", left + pw));
        s.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{fy:.4}</text>\n", left - 6.0, py + 4.0));
    }
    s.push_str(&format!(
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
        left + pw / 2.0,
        h - 10.0
    ));
    s.push_str(&format!("<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">loss</text>\n", top + ph / 2.0));
    let pts: Vec<String> = finite.iter().map(|&(x, y)| format!("{:.2},{:.2}", sx(x), sy(y))).collect();
    s.push_str(&format!("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n", pts.join(" ")));
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(step: u64, loss: f64) -> StepEvent {
        StepEvent {
            step,
            epoch: 1 + (step - 1) / 156,
            step_in_epoch: 1 + (step - 1) % 156,
            steps_per_epoch: 156,
            total_steps: 312,
            loss,
            lr: 0.01,
            samples_per_sec: 100.0,
            batch_size: 32,
            loss_scale: None,
            overflow: false,
        }
    }

    #[test]
    fn the_loss_monitor_prints_mindspore_lines_at_its_interval() {
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Shared::default();
        let mut m = LossMonitor::with_writer(156, Box::new(buf.clone()));
        for s in 1..=312 {
            m.on_step_end(&event(s, 2.0084016)).unwrap();
        }
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "epoch: 1 step: 156, loss is 2.0084016\nepoch: 2 step: 156, loss is 2.0084016\n");
        // A period longer than an epoch counts steps over the run (as MindSpore's), and one
        // that does not divide the epoch keeps its period across epochs.
        for (every, want) in
            [(200, vec!["epoch: 2 step: 44"]), (100, vec!["epoch: 1 step: 100", "epoch: 2 step: 44", "epoch: 2 step: 144"])]
        {
            let buf = Shared::default();
            let mut m = LossMonitor::with_writer(every, Box::new(buf.clone()));
            for s in 1..=312 {
                m.on_step_end(&event(s, 1.5)).unwrap();
            }
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            let got: Vec<&str> = text.lines().map(|l| l.trim_end_matches(", loss is 1.5")).collect();
            assert_eq!(got, want, "every {every}");
        }
        // A resumed run (from step 10) prints at its first step past the period, then every period.
        let buf = Shared::default();
        let mut m = LossMonitor::with_writer(4, Box::new(buf.clone()));
        for s in 11..=20 {
            m.on_step_end(&event(s, 1.5)).unwrap();
        }
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.starts_with("epoch: 1 step: 11,"), "{text}");
    }

    #[test]
    fn metrics_are_one_json_object_per_step_and_the_plot_is_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut w = MetricsWriter::create(&path, false).unwrap().with_plot(MetricsWriter::plot_path(&path));
        for s in 1..=3 {
            w.on_step_end(&event(s, 3.0 - s as f64 * 0.5)).unwrap();
        }
        w.on_train_end().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2]["step"], 3);
        assert_eq!(rows[2]["loss"], 1.5);
        for key in ["epoch", "lr", "samples_per_sec"] {
            assert!(rows[0].get(key).is_some(), "{key}");
        }
        let svg = std::fs::read_to_string(dir.path().join("m.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.trim_end().ends_with("</svg>"));
        // Appending (a resumed run) keeps the earlier lines, and its plot the earlier steps
        // (a step logged again replaces the earlier value); the step labels are whole and distinct.
        let mut w = MetricsWriter::create(&path, true).unwrap().with_plot(MetricsWriter::plot_path(&path));
        w.on_step_end(&event(3, 1.25)).unwrap();
        w.on_step_end(&event(4, 1.0)).unwrap();
        w.on_train_end().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 5);
        assert_eq!(w.history, [(1, 2.5), (2, 2.0), (3, 1.25), (4, 1.0)]);
        let svg = std::fs::read_to_string(dir.path().join("m.svg")).unwrap();
        let labels: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<text") && l.contains("y=\"448.0\""))
            .filter_map(|l| l.split('>').nth(1)?.split('<').next())
            .collect();
        assert_eq!(labels, ["1", "2", "3", "4"], "{svg}");
    }
}
