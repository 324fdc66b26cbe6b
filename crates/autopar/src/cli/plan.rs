//! `autopar plan`: plan a job without training it. The model comes from the same flags as
//! `autopar train` (no data needed: the model's own input shape), so a model larger than this
//! machine can be planned for thousands of devices. Prints every op's strategy and its source,
//! the layouts, parameter layouts, redistributions, gradient buckets, the communication per
//! step and the memory per device of one rank (`--rank`, default `global_rank` or 0).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use autopar_models::{model_by_name, Mode};
use autopar_parallel::report::{compare_text, search_json, split_svg, PlanReport};
use autopar_parallel::{compare_searches, plan_job, rank_program, ParallelMode, PlanRequest, RankCost};
use clap::Args;

use super::common::{
    check_micro_batches, file_parallel_option, given_parallel_option, load_profile, model_options, optimizer_kind, parallel_context,
    pipeline_split, read_config, ModelArgs, ParallelArgs, Spinner,
};

/// The flags of `autopar plan`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    autopar plan --model gpt --depth 32 --width 1024 --heads 16 --devices 4096\n  \
    autopar plan --model mlp --devices 8 --strategy run/ckpt/strategy.json --json\n  \
    autopar plan --model resnet50 --devices 64 --parallel-mode data_parallel --svg splits.svg\n  \
    autopar plan --model mlp --devices 8 --mindspore-layouts\n  \
    autopar plan --model gpt --devices 8 --parallel-mode auto_parallel --parallel search_mode=dynamic_programming\n  \
    autopar plan --model mlp --devices 8 --compare")]
pub struct PlanArgs {
    /// Read settings from a TOML file (the keys of `autopar train`; flags given here override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    parallel: ParallelArgs,
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
    /// Draw how the biggest parameters are split over the device matrix into this SVG file (a
    /// pipeline: the schedule's timeline, one row per stage).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
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
    if args.compare && args.svg.is_some() {
        bail!("--compare prints a table of every search; --svg draws one plan\nhint: drop one of them");
    }
    if args.json && args.mindspore_layouts {
        bail!("--json and --mindspore-layouts both choose the output\nhint: drop one of them (--mindspore-layouts prints MindSpore's parameter_layout_dict lines)");
    }
    if args.compare && args.mindspore_layouts {
        bail!("--compare prints a table of every search; --mindspore-layouts prints one plan's layouts\nhint: drop one of them");
    }
    let file = read_config(args.config.as_deref())?;
    // --compare plans under auto_parallel: its options are checked as such.
    let mut parallel = args.parallel.clone();
    if args.compare {
        let given = parallel
            .parallel_mode
            .clone()
            .or_else(|| file.parallel_mode.clone())
            .or_else(|| given_parallel_option(&parallel, "parallel_mode"))
            .or_else(|| file_parallel_option(&file, "parallel_mode"));
        match given {
            Some(m) if !m.eq_ignore_ascii_case("auto_parallel") => {
                bail!("--compare plans under auto_parallel, but the parallel mode is {m}\nhint: drop --parallel-mode (or pass auto_parallel) with --compare")
            }
            Some(_) => {}
            None => parallel.parallel_mode = Some("auto_parallel".into()),
        }
    }
    let ctx = parallel_context(&parallel, &file)?;
    let (name, opts) = model_options(&args.model, &file)?;
    let model = model_by_name(&name, &opts)?;
    let n = ctx.devices();
    let batch = match args.batch_size.or(file.batch_size) {
        Some(0) => bail!("invalid --batch-size 0\nhint: pass --batch-size 1 or more"),
        Some(b) => b,
        None if 32 % n == 0 => 32,
        None => n,
    };
    let slots = optimizer_kind(&args.optimizer, 0.9)?.state_slots();
    let rank = args.rank.or(ctx.explicit_global_rank()).unwrap_or(0);
    if rank >= n {
        bail!("--rank {rank} is not a rank of {n} devices\nhint: pass --rank between 0 and {}", n - 1);
    }
    let items = autopar_runtime::strategy_io::load_plan_strategies(&ctx)?;

    let profile = load_profile(&args.parallel, &file, &ctx)?;
    let micro = check_micro_batches(args.micro_batches.or(file.micro_batches))?;
    let split = pipeline_split(&args.parallel, &file)?;
    if ctx.pipeline_stages > 1 {
        let stages = PipelineArgs { split: &split, profile: profile.as_ref(), strategy_file: items.as_ref() };
        return plan_pipeline_job(&args, &ctx, model.as_ref(), (batch, micro), rank, slots, stages, out);
    }
    if !split.is_empty() {
        // Refused (one stage), with the reason.
        autopar_parallel::pipeline::split_before(
            &mut autopar_graph::Graph::default(),
            ctx.pipeline_stages,
            &split,
            None,
            ctx.pipeline_config.pipeline_interleave,
        )?;
    }
    // Without stages, micro-batches run one after another on every device (as `train` runs
    // them, gradients accumulated before one update): each is planned as a batch of its own.
    let micro = micro.unwrap_or(1);
    if micro == 0 || !batch.is_multiple_of(micro) {
        bail!("--micro-batches {micro} does not divide the batch size {batch}\nhint: pass a --batch-size divisible by --micro-batches");
    }
    let started = Instant::now();
    let spinner = Spinner::start(format!("building {} for batch {}", model.name(), batch / micro));
    let (graph, m) = model.build_graph(batch / micro, Mode::Train, 1)?;
    if micro > 1 && !args.json && !args.mindspore_layouts {
        writeln!(
            out,
            "{micro} micro-batches of {} rows, one after another, gradients accumulated before one update: the plan below is one micro-batch's\n",
            batch / micro
        )?;
    }
    let what = format!("{} ops on {n} devices", graph.len());
    if args.compare {
        if let Some(path) = ctx.op_strategy_save_file() {
            bail!("--compare plans with every search; op_strategy_config saves one plan's operator strategies ({path})\nhint: drop --compare to save them, or drop op_strategy_config");
        }
        if let Some(path) = ctx.strategy_save_file() {
            bail!("--compare plans with every search; strategy_ckpt_config saves one plan's strategy file ({path})\nhint: drop --compare to save it, or drop strategy_ckpt_config.save_file");
        }
        spinner.step(format!("planning {what} with every search"));
        let req =
            PlanRequest { graph: &graph, loss: Some(m.loss), context: &ctx, strategy_file: items.as_ref(), profile: profile.as_ref() };
        let rows = compare_searches(&req)?;
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
            let what =
                if micro > 1 { format!("batch {batch} in {micro} micro-batches of {}", batch / micro) } else { format!("batch {batch}") };
            write!(out, "{}", compare_text(&format!("{} ({what})", model.describe()), n, &rows))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    spinner.step(match ctx.parallel_mode {
        ParallelMode::AutoParallel => format!("planning {what}: {}", ctx.search_mode.name()),
        mode => format!("planning {what}: {}", mode.name()),
    });
    let plan = plan_job(&PlanRequest {
        graph: &graph,
        loss: Some(m.loss),
        context: &ctx,
        strategy_file: items.as_ref(),
        profile: profile.as_ref(),
    })?;
    spinner.step(format!("rank {rank}'s program"));
    let program = rank_program(&plan, rank)?;
    let cost = RankCost::of(&program, slots)?;
    let seconds = started.elapsed().as_secs_f64();
    drop(spinner);

    if let Some(path) = ctx.strategy_save_file() {
        // What training writes at its start (its optimizer's state named by --optimizer).
        let prefixes = optimizer_kind(&args.optimizer, 0.9)?.state_prefixes();
        let keys = |name: &str| prefixes.iter().map(|p| format!("{p}{name}")).collect();
        let only = ctx.strategy_ckpt_config.only_trainable_params;
        autopar_runtime::strategy_io::strategy_file(&plan, only, &keys)
            .save(path)
            .with_context(|| format!("cannot write the strategy file {path}\nhint: check that the folder exists and is writable"))?;
        if !args.json && !args.mindspore_layouts {
            eprintln!("autopar plan: wrote the strategy file {path}");
        }
    }
    if let Some(path) = ctx.op_strategy_save_file() {
        autopar_runtime::strategy_io::operator_strategy_file(&plan).save(path).with_context(|| {
            format!("cannot write the operator strategy file {path}\nhint: check that the folder exists and is writable")
        })?;
        if !args.json && !args.mindspore_layouts {
            eprintln!("autopar plan: wrote the operator strategy file {path}");
        }
    }
    if let Some(path) = &args.svg {
        let svg = split_svg(&plan, 4);
        autopar_data::write_atomic(path, svg.as_bytes())
            .with_context(|| format!("cannot write {}\nhint: check that the folder exists and is writable", path.display()))?;
        if !args.json && !args.mindspore_layouts {
            eprintln!("autopar plan: wrote {}", path.display());
        }
    }
    if args.mindspore_layouts {
        let prefixes = optimizer_kind(&args.optimizer, 0.9)?.state_prefixes();
        let keys = |name: &str| prefixes.iter().map(|p| format!("{p}{name}")).collect();
        for (name, l) in autopar_parallel::parameter_layout_dict(&plan, rank, &keys) {
            writeln!(out, "{name}: {l}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = PlanReport {
        plan: &plan,
        cost: &cost,
        model: format!("{} (batch {batch})", model.describe()),
        optimizer: format!("{} slot(s) per trainable parameter: {}", slots, args.optimizer),
        planning_seconds: seconds,
        world: None,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report.json()).map_err(|e| anyhow!("cannot print the plan as JSON: {e}"))?;
        writeln!(out, "{text}")?;
    } else {
        write!(out, "{}", report.text())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a pipeline plan takes beyond an ordinary one.
struct PipelineArgs<'a> {
    /// `--pipeline-split`.
    split: &'a [String],
    /// `--profile`.
    profile: Option<&'a autopar_parallel::DeviceProfile>,
    /// The strategies of a strategy file (`--strategy`), applied inside the stages.
    strategy_file: Option<&'a autopar_parallel::StrategyItems>,
}

/// `autopar plan` of a pipeline: the stages, the schedule (its SVG timeline with --svg), the
/// activation memory per stage, then the plan every stage's ops share on one stage's devices.
#[allow(clippy::too_many_arguments)]
fn plan_pipeline_job(
    args: &PlanArgs,
    ctx: &autopar_parallel::ParallelContext,
    model: &dyn autopar_models::Model,
    (batch, micro): (usize, Option<usize>),
    rank: usize,
    slots: usize,
    PipelineArgs { split, profile, strategy_file }: PipelineArgs<'_>,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    if args.compare {
        bail!("--compare plans without stages\nhint: drop --parallel pipeline_stages, or drop --compare");
    }
    if let Some(path) = ctx.strategy_save_file() {
        bail!("plan does not write a pipeline's strategy files ({path}; training writes one per stage)\nhint: drop strategy_ckpt_config.save_file here, or train to write them");
    }
    let m = micro.unwrap_or(ctx.pipeline_stages);
    if m == 0 || !batch.is_multiple_of(m) {
        bail!("--micro-batches {m} does not divide the batch size {batch}\nhint: pick --batch-size a multiple of --micro-batches");
    }
    let started = Instant::now();
    let spinner = Spinner::start(format!("building {} for micro-batch {}", model.name(), batch / m));
    let (mut graph, net) = model.build_graph(batch / m, Mode::Train, 1)?;
    if !split.is_empty() {
        autopar_parallel::pipeline::split_before(
            &mut graph,
            ctx.pipeline_stages,
            split,
            Some(net.loss),
            ctx.pipeline_config.pipeline_interleave,
        )?;
    }
    spinner.step(format!("planning {} ops in {} stages on {} devices", graph.len(), ctx.pipeline_stages, ctx.devices()));
    let req = PlanRequest { graph: &graph, loss: Some(net.loss), context: ctx, strategy_file, profile };
    let pp = autopar_parallel::pipeline::plan_pipeline(&req, m)?;
    let report = autopar_parallel::pipeline::pipeline_report(&pp)?;
    let (_, position) = pp.place(rank);
    let program = rank_program(&pp.plan, position)?;
    let cost = RankCost::of(&program, slots)?;
    let seconds = started.elapsed().as_secs_f64();
    drop(spinner);
    if let Some(path) = &args.svg {
        autopar_data::write_atomic(path, report.svg().as_bytes())
            .with_context(|| format!("cannot write {}\nhint: check that the folder exists and is writable", path.display()))?;
        if !args.json && !args.mindspore_layouts {
            eprintln!("autopar plan: wrote the schedule's timeline to {}", path.display());
        }
    }
    if args.mindspore_layouts {
        for (name, l) in autopar_parallel::pipeline::pipeline_layout_dict(&pp, rank) {
            writeln!(out, "{name}: {l}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Groups in world ranks: a parameter's on the reported rank's stage when it holds it (as
    // --mindspore-layouts names them), else on the first stage holding it.
    let own_stage = pp.place(rank).0;
    let stage_of: std::collections::HashMap<String, usize> = pp
        .param_stages()
        .into_iter()
        .filter_map(|(n, s)| (if s.contains(&own_stage) { Some(own_stage) } else { s.first().copied() }).map(|f| (n, f)))
        .collect();
    let d = pp.stage_devices();
    let rank_of = |name: &str, position: usize| stage_of.get(name).copied().unwrap_or(0) * d + position;
    let stage_plan = PlanReport {
        plan: &pp.plan,
        cost: &cost,
        model: format!(
            "{} (micro-batch {} of batch {batch}; every stage's ops on one stage's {} devices, figures below for the whole network at position {position})",
            model.describe(),
            batch / m,
            pp.stage_devices()
        ),
        optimizer: format!("{} slot(s) per trainable parameter: {}", slots, args.optimizer),
        planning_seconds: seconds,
        world: Some((&rank_of, pp.device_num)),
    };
    if args.json {
        let v = serde_json::json!({ "pipeline": report.json(), "plan": stage_plan.json() });
        writeln!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| anyhow!("cannot print the plan as JSON: {e}"))?)?;
    } else {
        write!(out, "{}", report.text())?;
        writeln!(out)?;
        write!(out, "{}", stage_plan.text())?;
    }
    Ok(ExitCode::SUCCESS)
}
