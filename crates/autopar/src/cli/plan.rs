//! `autopar plan`: plan a job without training it. The model comes from the same flags as
//! `autopar train` (no data needed: the model's own input shape, or the data's where `--data`
//! or the config names a dataset, as `train` sizes it), so a model larger than this
//! machine can be planned for thousands of devices. Prints every op's strategy and its source,
//! the layouts, parameter layouts, redistributions, gradient buckets, the communication per
//! step and the memory per device of one rank (`--rank`, default `global_rank` or 0).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use autopar_models::{model_by_name, Mode};
use autopar_parallel::report::html::{html, rank_memory, Measured, Page};
use autopar_parallel::report::PipelineReport;
use autopar_parallel::report::{compare_text, search_json, split_svg, MemoryLimit, PlanReport, SummaryFacts};
use autopar_parallel::search::DeviceProfile;
use autopar_parallel::strategy_files::{job_strategy_files, load_plan_strategies};
use autopar_parallel::{
    assemble_job, compare_searches, default_micro_batches, micro_batch_size, rank_program, JobPlan, JobRequest, ParallelMode, PlanRequest,
    RankCost,
};
use clap::Args;

use super::common::{
    check_micro_batches, file_parallel_option, given_parallel_option, load_profile, model_options, open_training_data, optimizer_kind,
    parallel_context, pipeline_split, precision, read_config, recompute, ModelArgs, ParallelArgs, Spinner,
};

/// The flags of `autopar plan`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  \
    autopar plan --model gpt --depth 32 --width 1024 --heads 16 --devices 4096\n  \
    autopar plan --model mlp --devices 8 --strategy run/ckpt/strategy.json --json\n  \
    autopar plan --model resnet50 --devices 64 --parallel-mode data_parallel --svg splits.svg\n  \
    autopar plan --model mlp --devices 8 --mindspore-layouts\n  \
    autopar plan --model gpt --devices 8 --html plan.html\n  \
    autopar plan --model gpt --devices 8 --parallel-mode auto_parallel --parallel search_mode=dynamic_programming\n  \
    autopar plan --model mlp --devices 8 --compare",
    allow_negative_numbers = true
)]
pub struct PlanArgs {
    /// Read settings from a TOML file (the keys of `autopar train`; flags given here override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    parallel: ParallelArgs,
    /// The data `train` would read (a CIFAR-10 or MNIST folder, a .safetensors file): sizes the
    /// model's input shape and classes from it where not given, as `train` does; `synthetic`
    /// or none: the model's own input shape.
    #[arg(long, value_name = "PATH|synthetic")]
    data: Option<String>,
    /// Global batch size (default: 32, or the device count when it does not divide 32).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Micro-batches per step of a pipeline (--parallel pipeline_stages=P; default P).
    #[arg(long, value_name = "M")]
    micro_batches: Option<usize>,
    /// The rank whose communication and memory are reported (default: global_rank, or 0).
    #[arg(long)]
    rank: Option<usize>,
    /// Optimizer whose state the memory figure counts: sgd, momentum or adamw.
    #[arg(long, default_value = "momentum")]
    optimizer: String,
    /// Print the plan as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Print every table after the summary: each op's strategy and layouts, the parameters,
    /// redistributions, gradient buckets, communication, memory and compute (the default is the
    /// summary alone).
    #[arg(long)]
    full: bool,
    /// Draw how the biggest parameters are split over the device matrix into this SVG file (a
    /// pipeline: the schedule's timeline, one row per stage).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write the plan as one self-contained web page to this HTML file: the summary, a sortable
    /// table of every op, the parameters' layouts, the redistributions, the memory of each rank
    /// and the pictures (nothing fetched from the network).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Print MindSpore's parameter_layout_dict lines (name: 12-tuple) instead of the report.
    #[arg(long)]
    mindspore_layouts: bool,
    /// Plan the model under every auto_parallel search, pure data parallel and the exact optimum
    /// of the cost model, and print their predicted costs side by side.
    #[arg(long)]
    compare: bool,
}

/// Runs `autopar plan`: writes the plan report to `out`.
pub fn run(args: PlanArgs, out: &mut dyn Write) -> Result<ExitCode> {
    refuse_output_conflicts(&args)?;
    for (path, flag, example) in [(&args.svg, "--svg", "plan.svg"), (&args.html, "--html", "plan.html")] {
        if let Some(path) = path {
            super::common::check_output_file(path, flag, example)?;
        }
    }
    let file = read_config(args.config.as_deref())?;
    let ctx = parallel_context(&compared_parallel(&args, &file)?, &file)?;
    let (name, mut opts) = model_options(&args.model, &file)?;
    if let Some(data) = args.data.as_ref().or(file.data.as_ref()).filter(|d| *d != "synthetic") {
        open_training_data(std::path::Path::new(data), &name, &mut opts)?;
    }
    let model = model_by_name(&name, &opts)?;
    let n = ctx.devices();
    let batch = match args.batch_size.or(file.batch_size) {
        Some(0) => bail!("invalid --batch-size 0\nhint: pass --batch-size 1 or more"),
        Some(b) => b,
        None if 32 % n == 0 => 32,
        None => n,
    };
    let optimizer = optimizer_kind(&args.optimizer, 0.9)?;
    let rank = args.rank.or(ctx.explicit_global_rank()).unwrap_or(0);
    if rank >= n {
        bail!("--rank {rank} is not a rank of {n} devices\nhint: pass --rank between 0 and {}", n - 1);
    }
    let profile = load_profile(&args.parallel, &file, &ctx)?;
    let micro = check_micro_batches(args.micro_batches.or(file.micro_batches))?.unwrap_or_else(|| default_micro_batches(&ctx));
    let micro_rows = micro_batch_size(batch, micro)?;
    let split = pipeline_split(&args.parallel, &file)?;
    let recompute = recompute(&args.parallel, &file)?;
    if args.compare {
        if ctx.pipeline_stages() > 1 {
            bail!("--compare plans without stages\nhint: drop --parallel pipeline_stages, or drop --compare");
        }
        if let Some(path) = ctx.op_strategy_save_file() {
            bail!("--compare plans with every search; op_strategy_config saves one plan's operator strategies ({path})\nhint: drop --compare to save them, or drop op_strategy_config");
        }
        if let Some(path) = ctx.strategy_save_file() {
            bail!("--compare plans with every search; strategy_ckpt_config saves one plan's strategy file ({path})\nhint: drop --compare to save it, or drop strategy_ckpt_config.save_file");
        }
    }
    let started = Instant::now();
    let spinner = Spinner::start(format!("building {} for batch {micro_rows}", model.name()));
    let (mut graph, m) = model.build_graph(micro_rows, Mode::Train, 1)?;
    let what = format!("{} ops on {n} devices", graph.len());
    if args.compare {
        let items = load_plan_strategies(&ctx)?;
        graph.apply_recompute(&recompute)?;
        spinner.step(format!("planning {what} with every search"));
        let req =
            PlanRequest { graph: &graph, loss: Some(m.loss), context: &ctx, strategy_file: items.as_ref(), profile: profile.as_ref() };
        let what = if micro > 1 { format!("batch {batch} in {micro} micro-batches of {micro_rows}") } else { format!("batch {batch}") };
        return print_comparison(&args, &compare_searches(&req)?, &format!("{} ({what})", model.describe()), n, out);
    }
    spinner.step(match (ctx.pipeline_stages(), ctx.parallel_mode()) {
        (p, _) if p > 1 => format!("planning {} ops in {p} stages on {n} devices", graph.len()),
        (_, ParallelMode::AutoParallel) => format!("planning {what}: {}", ctx.search_mode().name()),
        (_, mode) => format!("planning {what}: {}", mode.name()),
    });
    let job = assemble_job(&JobRequest {
        graph: &graph,
        loss: Some(m.loss),
        context: &ctx,
        micro_batches: Some(micro),
        pipeline_split: &split,
        profile: profile.as_ref(),
        recompute: &recompute,
        precision: precision(&args.parallel, &file)?,
    })?;
    spinner.step(format!("rank {rank}'s program"));
    let cost = rank_cost(&job, rank, optimizer.state_slots(), true)?;
    let seconds = started.elapsed().as_secs_f64();
    drop(spinner);
    let quiet = args.json || args.mindspore_layouts;
    // What training writes at its start (its optimizer's state named by --optimizer).
    let prefixes = optimizer.state_prefixes();
    let keys = |name: &str| prefixes.iter().map(|p| format!("{p}{name}")).collect();
    for (path, saved) in job_strategy_files(&job, &ctx, &[rank], &keys)? {
        saved.save(&path).map_err(|e| anyhow!("{e}\nhint: check that the folder exists and is writable"))?;
        if !quiet {
            eprintln!("autopar plan: wrote {}", path.display());
        }
    }
    let summary = Summary { profile: profile.clone().unwrap_or_else(DeviceProfile::builtin), limit: device_limit(&ctx), micro, rank };
    let facts =
        Facts { summary, model: model.as_ref(), batch, micro, rank, seconds, optimizer: &args.optimizer, slots: optimizer.state_slots() };
    if args.mindspore_layouts {
        return print_mindspore_layouts(&args, &job, &facts, &keys, out);
    }
    with_report(&job, &cost, &facts, |report, pipeline| {
        // Drawn only when a picture or the page is asked for.
        let pictures = if args.svg.is_some() || args.html.is_some() { pictures(report, pipeline, &facts.summary) } else { Vec::new() };
        if let (Some(path), Some((_, svg))) = (&args.svg, pictures.first()) {
            write_file(path, svg, !args.json)?;
        }
        if let Some(path) = &args.html {
            write_file(path, &page_html(&job, report, pipeline, &facts, &pictures, None, true)?, !args.json)?;
        }
        if pipeline.is_none() && facts.micro > 1 && args.full && !args.json {
            writeln!(
                out,
                "{} micro-batches of {} rows, one after another, gradients accumulated before one update: the plan below is one micro-batch's\n",
                facts.micro,
                facts.batch / facts.micro
            )?;
        }
        print_report(&args, report, pipeline, &facts.summary, out)
    })
}

/// Rank `rank`'s predicted cost of a step of `job`, with the memory the run itself checks
/// and reports (a pipeline rank's stage with the activations of the micro-batches it holds at
/// once), on a communicator that packs a fused collective's parts (`packs`: MPI's) or not.
pub(super) fn rank_cost(job: &JobPlan, rank: usize, slots: usize, packs: bool) -> Result<RankCost> {
    let (_, position) = job.place(rank);
    let program = rank_program(&job.plan, position)?;
    let mut cost = RankCost::of(&program, slots)?;
    cost.memory = job.program(rank)?.memory_on(job, slots, packs)?;
    Ok(cost)
}

/// What the summary prices the step with and compares the memory against.
pub(super) struct Summary {
    pub(super) profile: DeviceProfile,
    pub(super) limit: Option<MemoryLimit>,
    pub(super) micro: usize,
    /// The reported rank, global.
    pub(super) rank: usize,
}

impl Summary {
    /// The facts of the summary of a plan (a pipeline's, with its report).
    fn facts<'a>(&'a self, pipeline: Option<&'a PipelineReport>) -> SummaryFacts<'a> {
        SummaryFacts { profile: &self.profile, limit: self.limit.clone(), micro_batches: self.micro, pipeline, rank: self.rank }
    }
}

/// What the plan is held against: `device_memory_capacity` per device when set, else the
/// least of this process's limits for the ranks run in it (as `train` checks them).
pub(super) fn device_limit(ctx: &autopar_parallel::ParallelContext) -> Option<MemoryLimit> {
    use autopar_runtime::budget::Limit;
    if ctx.is_set("device_memory_capacity") {
        return Some(MemoryLimit { bytes: ctx.search().device_memory_capacity, what: "device_memory_capacity".into(), per_device: true });
    }
    let least = autopar_runtime::budget::machine_limits(1, None).into_iter().min_by_key(|l| l.left())?;
    let what = match least {
        Limit::Available { .. } => "available on this machine",
        Limit::Cgroup { .. } => "left under the cgroup's limit",
        Limit::AddressSpace { .. } => "left under the address-space limit",
        Limit::DeviceCapacity { .. } => "device_memory_capacity",
    };
    Some(MemoryLimit { bytes: least.left(), what: what.into(), per_device: matches!(least, Limit::DeviceCapacity { .. }) })
}

/// Output flags that choose different outputs.
fn refuse_output_conflicts(args: &PlanArgs) -> Result<()> {
    if args.compare && args.svg.is_some() {
        bail!("--compare prints a table of every search; --svg draws one plan\nhint: drop one of them");
    }
    if args.compare && args.html.is_some() {
        bail!("--compare prints a table of every search; --html writes one plan's page\nhint: drop one of them");
    }
    if args.mindspore_layouts && args.html.is_some() {
        bail!("--mindspore-layouts prints MindSpore's layouts alone; --html writes the whole plan's page\nhint: drop one of them");
    }
    if args.json && args.mindspore_layouts {
        bail!("--json and --mindspore-layouts both choose the output\nhint: drop one of them (--mindspore-layouts prints MindSpore's parameter_layout_dict lines)");
    }
    if args.compare && args.mindspore_layouts {
        bail!("--compare prints a table of every search; --mindspore-layouts prints one plan's layouts\nhint: drop one of them");
    }
    Ok(())
}

/// The parallel flags, under auto_parallel with `--compare` (whose options are checked as
/// such); a `--compare` of another mode, or with a file to save, is refused.
fn compared_parallel(args: &PlanArgs, file: &super::common::FileConfig) -> Result<ParallelArgs> {
    let mut parallel = args.parallel.clone();
    if !args.compare {
        return Ok(parallel);
    }
    let given = parallel
        .parallel_mode
        .clone()
        .or_else(|| file.parallel_mode.clone())
        .or_else(|| given_parallel_option(&parallel, "parallel_mode"))
        .or_else(|| file_parallel_option(file, "parallel_mode"));
    match given {
        Some(m) if !m.eq_ignore_ascii_case("auto_parallel") => {
            bail!("--compare plans under auto_parallel, but the parallel mode is {m}\nhint: drop --parallel-mode (or pass auto_parallel) with --compare")
        }
        Some(_) => {}
        None => parallel.parallel_mode = Some("auto_parallel".into()),
    }
    Ok(parallel)
}

/// What the report says of the job beside its plan.
pub(super) struct Facts<'a> {
    /// What the summary prices and compares against.
    pub(super) summary: Summary,
    pub(super) model: &'a dyn autopar_models::Model,
    pub(super) batch: usize,
    pub(super) micro: usize,
    /// The reported rank, global.
    pub(super) rank: usize,
    /// Seconds planning took.
    pub(super) seconds: f64,
    pub(super) optimizer: &'a str,
    /// Optimizer state tensors per trainable parameter.
    pub(super) slots: usize,
}

/// `--compare`'s table (or JSON).
fn print_comparison(
    args: &PlanArgs,
    rows: &[autopar_parallel::search::SearchRow],
    what: &str,
    n: usize,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(search, row)| match row {
                Ok((r, s)) => serde_json::json!({"search": search.name(), "planning_seconds": s, "report": search_json(r)}),
                Err(e) => serde_json::json!({"search": search.name(), "error": e.to_string()}),
            })
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| anyhow!("cannot print the comparison as JSON: {e}"))?)?;
    } else {
        write!(out, "{}", compare_text(what, n, rows))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// MindSpore's parameter_layout_dict lines of the reported rank (a pipeline's: its stage's),
/// and with `--svg` the picture (a pipeline's schedule in simulated units).
fn print_mindspore_layouts(
    args: &PlanArgs,
    job: &JobPlan,
    f: &Facts<'_>,
    keys: &dyn Fn(&str) -> Vec<String>,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    let lines = if job.is_pipeline() {
        if let Some(path) = &args.svg {
            write_file(path, &autopar_parallel::report::pipeline_report(job)?.svg(None), false)?;
        }
        autopar_parallel::report::pipeline_layout_dict(job, f.rank)
    } else {
        if let Some(path) = &args.svg {
            write_file(path, &split_svg(&job.plan, 4), false)?;
        }
        autopar_parallel::parameter_layout_dict(&job.plan, f.rank, keys)
    };
    for (name, l) in lines {
        writeln!(out, "{name}: {l}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Calls `k` with the plan's report on the reported rank and, for a pipeline, the pipeline's
/// report. A pipeline's plan is every stage's ops on one stage's devices; its groups are
/// printed and named in world ranks: a parameter's on the reported rank's stage when it
/// holds it (as --mindspore-layouts names them), else on the first stage holding it.
pub(super) fn with_report<R>(
    job: &JobPlan,
    cost: &RankCost,
    f: &Facts<'_>,
    k: impl FnOnce(&PlanReport<'_>, Option<&PipelineReport>) -> Result<R>,
) -> Result<R> {
    let optimizer = format!("{} slot(s) per trainable parameter: {}", f.slots, f.optimizer);
    if !job.is_pipeline() {
        let report = PlanReport {
            plan: &job.plan,
            cost,
            model: format!("{} (batch {})", f.model.describe(), f.batch),
            optimizer,
            planning_seconds: f.seconds,
            world: None,
        };
        return k(&report, None);
    }
    let pipeline = autopar_parallel::report::pipeline_report(job)?;
    let (own_stage, position) = job.place(f.rank);
    let stage_of: std::collections::HashMap<String, usize> = job
        .param_stages()
        .into_iter()
        .filter_map(|(n, s)| (if s.contains(&own_stage) { Some(own_stage) } else { s.first().copied() }).map(|f| (n, f)))
        .collect();
    let d = job.stage_devices();
    let rank_of = |name: &str, position: usize| stage_of.get(name).copied().unwrap_or(0) * d + position;
    let report = PlanReport {
        plan: &job.plan,
        cost,
        model: format!(
            "{} (micro-batch {} of batch {}; every stage's ops on one stage's {d} devices, figures below for the whole network at position {position})",
            f.model.describe(),
            f.batch / f.micro,
            f.batch,
        ),
        optimizer,
        planning_seconds: f.seconds,
        world: Some((&rank_of, job.device_num)),
    };
    k(&report, Some(&pipeline))
}

/// The plan's pictures, each with its caption: a pipeline's schedule (its time axis in the
/// milliseconds the summary predicts) first, then how the biggest parameters are split.
fn pictures(report: &PlanReport<'_>, pipeline: Option<&PipelineReport>, summary: &Summary) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(p) = pipeline {
        let unit = report.predicted(&summary.facts(Some(p))).unit;
        out.push(("the pipeline's schedule, one row per stage".to_string(), p.svg(Some(unit))));
    }
    let what = match pipeline {
        Some(_) => format!(
            "one stage's device matrix, its ranks numbered by their position in the stage (stage s, position p: rank s x {} + p), and how the biggest tensors are split over it",
            report.plan.device_num
        ),
        None => "the device matrix and how the biggest tensors are split over it".to_string(),
    };
    out.push((what, split_svg(report.plan, 4)));
    out
}

/// The plan's web page, with a training run's measurements.
pub(super) fn page_html(
    job: &JobPlan,
    report: &PlanReport<'_>,
    pipeline: Option<&PipelineReport>,
    f: &Facts<'_>,
    pictures: &[(String, String)],
    measured: Option<&Measured>,
    packs: bool,
) -> Result<String> {
    let ranks = rank_memory(job, f.slots, packs)?;
    let facts = f.summary.facts(pipeline);
    Ok(html(&Page { report, facts: &facts, pipeline, ranks: &ranks, pictures, measured }))
}

/// The plan's web page of `job` on `f.rank`, with a training run's measurements, its memory on
/// a communicator that packs a fused collective's parts (`packs`: MPI's) or not.
pub(super) fn page(job: &JobPlan, f: &Facts<'_>, measured: Option<&Measured>, packs: bool) -> Result<String> {
    let cost = rank_cost(job, f.rank, f.slots, packs)?;
    with_report(job, &cost, f, |report, pipeline| {
        page_html(job, report, pipeline, f, &pictures(report, pipeline, &f.summary), measured, packs)
    })
}

/// A plan report as JSON, or as text: its header and summary, then with `--full` the
/// pipeline's report, if any, and every table.
fn print_report(
    args: &PlanArgs,
    plan: &PlanReport<'_>,
    pipeline: Option<&PipelineReport>,
    summary: &Summary,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    let facts = summary.facts(pipeline);
    if args.json {
        let mut v = match pipeline {
            Some(p) => serde_json::json!({ "pipeline": p.json(), "plan": plan.json() }),
            None => plan.json(),
        };
        v["summary"] = plan.summary_json(&facts);
        writeln!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| anyhow!("cannot print the plan as JSON: {e}"))?)?;
    } else {
        write!(out, "{}{}", plan.header(), plan.summary(&facts))?;
        if !args.full {
            writeln!(out, "(every table: --full; every figure: --json)")?;
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(p) = pipeline {
            write!(out, "\n{}", p.text())?;
        }
        write!(out, "{}", plan.tables())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A picture or page written to `path` (atomically), said on stderr when `say`.
pub(super) fn write_file(path: &std::path::Path, text: &str, say: bool) -> Result<()> {
    autopar_data::write_atomic(path, text.as_bytes())
        .with_context(|| format!("cannot write {}\nhint: check that the folder exists and is writable", path.display()))?;
    if say {
        eprintln!("autopar plan: wrote {}", path.display());
    }
    Ok(())
}
