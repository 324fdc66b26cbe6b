//! `autopar ckpt`: distributed checkpoints and strategy files, with the names and argument order
//! of MindSpore's `checkpoint_transform` functions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use autopar_checkpoint::{
    collect_rank_files, merge_strategies, rank_list_for_transform, transform_checkpoint_by_rank, transform_checkpoints, CheckpointFile,
    Format, GroupInfo, StrategyFile, TransformOptions, TransformPlanner, TransformReport,
};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

/// The subcommands of `autopar ckpt`.
#[derive(Args, Debug)]
pub struct CkptArgs {
    #[command(subcommand)]
    command: CkptCommand,
}

#[derive(Subcommand, Debug)]
enum CkptCommand {
    /// Which source ranks' checkpoints a destination rank needs: exactly MindSpore's rank_list_for_transform.
    #[command(after_help = "Examples:\n  \
        autopar ckpt rank-list 0 --src-strategy src_strategy.ckpt --dst-strategy dst_strategy.ckpt\n  \
        autopar ckpt rank-list 0 --src-strategy src_strategy.ckpt --dst-strategy dst_strategy.ckpt --minimal")]
    RankList {
        /// Destination rank (global, over all pipeline stages).
        rank: usize,
        #[command(flatten)]
        strategies: StrategyArgs,
        /// Only the ranks whose bytes the destination rank reads (often fewer files than
        /// MindSpore lists; enough for `autopar ckpt transform-rank`, not for MindSpore's tool).
        #[arg(long)]
        minimal: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write one destination rank's checkpoint (transform_checkpoint_by_rank).
    #[command(after_help = "Examples:\n  \
        autopar ckpt transform-rank 2 --src-dir ckpts --out new/rank_2/net_2.ckpt --src-strategy s.ckpt --dst-strategy d.ckpt\n  \
        autopar ckpt transform-rank 0 --file 0=r0.ckpt --file 4=r4.ckpt --out net_0.safetensors --src-strategy s.ckpt --dst-strategy d.ckpt")]
    TransformRank {
        /// Destination rank (global, over all pipeline stages).
        rank: usize,
        /// Output file; its extension (.ckpt or .safetensors) picks the format.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// A source rank's checkpoint as RANK=PATH (repeatable).
        #[arg(long = "file", value_name = "RANK=PATH")]
        files: Vec<String>,
        /// Take source files from DIR/rank_<k>/ instead of --file.
        #[arg(long, value_name = "DIR")]
        src_dir: Option<PathBuf>,
        #[command(flatten)]
        strategies: StrategyArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Transform every destination rank (transform_checkpoints).
    #[command(after_help = "Example:\n  \
        autopar ckpt transform SRC_DIR DST_DIR --prefix net_ --src-strategy S --dst-strategy D --format ckpt --jobs 4\n\n\
        Reads SRC_DIR/rank_<k>/*.ckpt|*.safetensors, writes DST_DIR/rank_<r>/<prefix><r>.<format>.")]
    Transform {
        /// Folder holding rank_<k>/ subfolders of source checkpoints.
        src_dir: PathBuf,
        /// Output folder.
        dst_dir: PathBuf,
        /// Output file name prefix.
        #[arg(long, default_value = "checkpoint_")]
        prefix: String,
        #[command(flatten)]
        strategies: StrategyArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = FormatArg::Ckpt)]
        format: FormatArg,
        /// Destination files written at the same time.
        #[arg(long, short = 'j', default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        jobs: u16,
        #[command(flatten)]
        common: CommonArgs,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Merge per-stage pipeline strategy files into one (merge_pipeline_strategys).
    #[command(after_help = "Example:\n  autopar ckpt merge-strategies strategies/ merged_strategy.ckpt")]
    MergeStrategies {
        /// Folder with one strategy file per pipeline stage (all .ckpt or all .json).
        src_dir: PathBuf,
        /// Merged file; .json writes JSON, anything else protobuf.
        dst_file: PathBuf,
    },
    /// Which ranks hold the same piece of each parameter and which one owns it: MindSpore's
    /// get_parameter_redundancy and remove_param_redundancy (the owners parameter_broadcast uses).
    #[command(after_help = "Examples:\n  \
        autopar ckpt redundancy strategy_rank0.ckpt\n  \
        autopar ckpt redundancy layout_rank4.txt --initial-rank 4 --json\n\n\
        LAYOUT is a strategy file (.ckpt or .json) or parameter_layout_dict lines (autopar plan --mindspore-layouts).")]
    Redundancy {
        /// Strategy file or parameter_layout_dict text.
        layout: PathBuf,
        /// The first global rank of the pipeline stage the layout describes.
        #[arg(long, default_value_t = 0)]
        initial_rank: usize,
        /// Ranks of the whole job (the size of `hccl_world_group`); default: up to the layout's
        /// last device.
        #[arg(long)]
        world_size: Option<usize>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a checkpoint's tensors, a strategy file's layouts or a group-info file's groups.
    #[command(
        after_help = "Examples:\n  autopar ckpt inspect rank_0/net_0.safetensors\n  autopar ckpt inspect strategy_rank0.ckpt --json"
    )]
    Inspect {
        /// The file.
        path: PathBuf,
        /// What the file is; by default told from its extension and first bytes.
        #[arg(long, value_enum, default_value_t = Kind::Auto)]
        kind: Kind,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint's model weights whole, as another framework loads them: --format hf, a
    /// folder Hugging Face's transformers reads with from_pretrained (model.safetensors and
    /// config.json; the llama and moe models).
    #[command(
        after_help = "Examples:\n  autopar ckpt export run/ckpt llama-hf --format hf --model llama --width 32 --depth 2 --heads 4 --kv-heads 2 --ffn-width 48 --num-classes 50"
    )]
    Export {
        /// The checkpoint: a file of whole tensors, a run's folder of per-rank checkpoints (rank_0,
        /// rank_1, ... with strategy.json beside them), or a Hugging Face checkpoint.
        #[arg(value_name = "CHECKPOINT|DIR")]
        src: PathBuf,
        /// The folder to write (made if missing; its files are replaced).
        out: PathBuf,
        /// The layout to write: hf (Hugging Face transformers).
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// The strategy file the per-rank checkpoints were saved under (default: strategy.json in the folder).
        #[arg(long, value_name = "FILE")]
        ckpt_strategy: Option<PathBuf>,
        #[command(flatten)]
        model: Box<super::common::ModelArgs>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ExportFormat {
    /// Hugging Face transformers: model.safetensors and config.json.
    Hf,
}

#[derive(Args, Debug)]
struct StrategyArgs {
    /// Strategy file the source checkpoints were saved with (none: one device, unsplit).
    #[arg(long, value_name = "FILE", help_heading = "Strategies")]
    src_strategy: Option<PathBuf>,
    /// Strategy file of the destination (none: one device, unsplit).
    #[arg(long, value_name = "FILE", help_heading = "Strategies")]
    dst_strategy: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct CommonArgs {
    /// Refuse tensors that are in one strategy but not the other. By default they are copied
    /// unchanged from the paired source rank, as MindSpore does, and listed on stderr.
    #[arg(long)]
    strict: bool,
    /// Append MindSpore's CRC-32 trailer to .ckpt outputs.
    #[arg(long)]
    crc: bool,
    /// Do not verify the CRCs stored in source files.
    #[arg(long)]
    no_verify_crc: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum FormatArg {
    Ckpt,
    Safetensors,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Auto,
    Checkpoint,
    Strategy,
    Group,
}

/// Runs an `autopar ckpt` subcommand.
pub fn run(args: CkptArgs) -> Result<ExitCode> {
    match args.command {
        CkptCommand::Redundancy { layout, initial_rank, world_size, json } => {
            let source = autopar_runtime::LayoutSource::load(&layout)?;
            let world = world_size.unwrap_or_else(|| (initial_rank + source.devices()).max(1));
            if initial_rank + source.devices() > world {
                bail!(
                    "the layout spans {} devices from rank {initial_rank}, beyond a job of {world} ranks\nhint: pass --world-size of at least {} (the whole job's ranks), or check --initial-rank",
                    source.devices(),
                    initial_rank + source.devices()
                );
            }
            let groups = source.redundancy(initial_rank, world)?;
            let owners = autopar_layout::redundancy::single_owners(&groups);
            if json {
                println!("{}", serde_json::to_string_pretty(&json!({ "redundancy": groups, "owners": owners }))?);
            } else {
                let text = |g: &Vec<usize>| format!("({})", g.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","));
                println!("groups of ranks holding the same piece:");
                for (name, gs) in &groups {
                    println!("  {name}: {}", gs.iter().map(text).collect::<Vec<_>>().join(" "));
                }
                println!("single owner of each piece, by rank:");
                for (rank, names) in &owners {
                    println!("  {rank}: {}", names.iter().cloned().collect::<Vec<_>>().join(", "));
                }
            }
        }
        CkptCommand::RankList { rank, strategies, minimal, json } => {
            let (src, dst) = (strategies.src_strategy.as_deref(), strategies.dst_strategy.as_deref());
            let list = if minimal {
                TransformPlanner::new(src, dst, false)?.minimal_rank_list(rank)?
            } else {
                rank_list_for_transform(rank, src, dst)?
            };
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!("{}", list.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(" "));
            }
        }
        CkptCommand::TransformRank { rank, out, files, src_dir, strategies, common } => {
            let mut map: BTreeMap<usize, PathBuf> = BTreeMap::new();
            if let Some(dir) = &src_dir {
                map = collect_rank_files(dir)?.0;
            }
            for f in &files {
                let (r, p) =
                    f.split_once('=').with_context(|| format!("--file {f:?} is not RANK=PATH\nhint: --file 3=ckpts/rank_3/net_3.ckpt"))?;
                let r: usize = r.trim().parse().with_context(|| format!("--file {f:?}: {r:?} is not a rank number"))?;
                map.insert(r, PathBuf::from(p));
            }
            if map.is_empty() {
                bail!("no source checkpoints given\nhint: pass --src-dir DIR or --file RANK=PATH (see `autopar ckpt rank-list`)");
            }
            let opts = options(&common, Format::Ckpt, String::new(), 1);
            let t = Instant::now();
            let report = transform_checkpoint_by_rank(
                rank,
                &map,
                &out,
                strategies.src_strategy.as_deref(),
                strategies.dst_strategy.as_deref(),
                &opts,
            )?;
            print_report(&report, t.elapsed().as_secs_f64(), false);
        }
        CkptCommand::Transform { src_dir, dst_dir, prefix, strategies, format, jobs, common, json } => {
            let format = match format {
                FormatArg::Ckpt => Format::Ckpt,
                FormatArg::Safetensors => Format::Safetensors,
            };
            let opts = options(&common, format, prefix, jobs as usize);
            let t = Instant::now();
            let report =
                transform_checkpoints(&src_dir, &dst_dir, strategies.src_strategy.as_deref(), strategies.dst_strategy.as_deref(), &opts)?;
            print_report(&report, t.elapsed().as_secs_f64(), json);
        }
        CkptCommand::MergeStrategies { src_dir, dst_file } => {
            let stages = merge_strategies(&src_dir, &dst_file)?;
            println!("merged stages {stages:?} into {}", dst_file.display());
        }
        CkptCommand::Inspect { path, kind, json } => inspect(&path, kind, json)?,
        CkptCommand::Export { src, out, format: ExportFormat::Hf, ckpt_strategy, model } => {
            let n = export_hf(&src, &out, ckpt_strategy, &model)?;
            println!("wrote {n} tensors and config.json to {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn options(c: &CommonArgs, format: Format, prefix: String, jobs: usize) -> TransformOptions {
    TransformOptions {
        format,
        prefix,
        jobs,
        strict: c.strict,
        progress: super::common::progress_enabled(),
        crc: c.crc,
        verify_crc: !c.no_verify_crc,
    }
}

fn print_report(r: &TransformReport, secs: f64, as_json: bool) {
    let gbs = r.bytes_written as f64 / secs.max(1e-9) / 1e9;
    if as_json {
        let v = json!({
            "files": r.files, "bytes_written": r.bytes_written, "seconds": secs, "gb_per_s": gbs,
            "one_strategy": r.one_strategy, "absent": r.absent, "copied": r.copied, "per_stage": r.per_stage,
        });
        println!("{v}");
        return;
    }
    if let Some(stage) = r.per_stage {
        println!("the source strategy holds pipeline stage {stage} of the destination's network: writing that stage's parameters to _part{stage} files");
    }
    println!("wrote {} file(s), {} bytes of tensors in {secs:.2}s ({gbs:.2} GB/s)", r.files.len(), r.bytes_written);
    for f in &r.files {
        println!("  {}", f.display());
    }
    if !r.one_strategy.is_empty() {
        eprintln!("in one strategy only, copied unchanged as MindSpore does (--strict refuses them): {}", r.one_strategy.join(", "));
    }
    if !r.absent.is_empty() {
        eprintln!("in the strategies but not in the source checkpoints: {}", r.absent.join(", "));
    }
    if !r.copied.is_empty() {
        println!("copied unchanged (in no strategy): {}", r.copied.join(", "));
    }
}

fn detect(path: &Path) -> Kind {
    // A ParallelStrategyMap opens with field 1 as a varint (current_stage); a checkpoint and a
    // group map with field 1 length-delimited.
    let strategy_bytes = || std::fs::read(path).ok().and_then(|b| b.first().copied()) == Some(0x08);
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => Kind::Checkpoint,
        Some("json") => Kind::Strategy,
        // Group maps and strategy files (strategy_ckpt_save_file) both take .pb.
        Some("pb") if strategy_bytes() => Kind::Strategy,
        Some("pb") => Kind::Group,
        _ if strategy_bytes() => Kind::Strategy,
        _ => Kind::Checkpoint,
    }
}

fn inspect(path: &Path, kind: Kind, as_json: bool) -> Result<()> {
    if !path.exists() {
        bail!("{} not found\nhint: check the path (ckpt inspect reads .ckpt and .safetensors checkpoints, strategy files and group-info files)", path.display());
    }
    let kind = if kind == Kind::Auto { detect(path) } else { kind };
    match kind {
        Kind::Checkpoint | Kind::Auto => match CheckpointFile::open(path) {
            Ok(f) => inspect_checkpoint(&f, as_json),
            Err(e)
                if path.extension().and_then(|x| x.to_str()) == Some("ckpt")
                    && GroupInfo::load(path).is_ok_and(|g| !g.groups.is_empty()) =>
            {
                drop(e);
                inspect_group(&GroupInfo::load(path)?, as_json)
            }
            Err(e) => Err(e.into()),
        },
        Kind::Strategy => inspect_strategy(&StrategyFile::load(path)?, as_json),
        Kind::Group => inspect_group(&GroupInfo::load(path)?, as_json),
    }
}

fn inspect_checkpoint(f: &CheckpointFile, as_json: bool) -> Result<()> {
    if as_json {
        let tensors: Vec<_> = f
            .tensors()
            .iter()
            .map(|t| json!({"name": t.name, "dtype": t.dtype.mindspore_name(), "shape": t.shape, "bytes": t.byte_len()}))
            .collect();
        println!("{}", json!({"path": f.path(), "format": f.format().extension(), "metadata": f.metadata(), "tensors": tensors}));
        return Ok(());
    }
    let total: u64 = f.tensors().iter().map(|t| t.byte_len()).sum();
    println!("{} ({}, {} tensors, {total} bytes)", f.path().display(), f.format().extension(), f.tensors().len());
    if !f.metadata().is_empty() {
        println!("metadata: {}", f.metadata().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    }
    let w = f.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    println!("{:<w$}  {:<8}  {:<20}  bytes", "name", "dtype", "shape");
    for t in f.tensors() {
        println!("{:<w$}  {:<8}  {:<20}  {}", t.name, t.dtype.mindspore_name(), format!("{:?}", t.shape), t.byte_len());
    }
    Ok(())
}

fn inspect_strategy(s: &StrategyFile, as_json: bool) -> Result<()> {
    let map = s.layout_map()?;
    if as_json {
        let layouts: serde_json::Map<String, serde_json::Value> = map
            .params
            .iter()
            .map(|(n, p)| {
                (
                    n.clone(),
                    json!({"dev_matrix": p.dev_matrix, "tensor_map": p.tensor_map.to_string(), "opt_weight_shard_step": p.opt_shard_step,
                           "opt_weight_shard_size": p.opt_shard_size, "stages": p.stages, "tensor_shape": p.tensor_shape}),
                )
            })
            .collect();
        let strategies: Vec<_> = s
            .strategy_items
            .iter()
            .map(|i| json!({"node_name": i.node_name, "stage": i.stage, "parallel_strategy": i.parallel_strategy}))
            .collect();
        println!("{}", json!({"current_stage": s.current_stage, "layouts": layouts, "strategies": strategies}));
        return Ok(());
    }
    println!("{} parameter layouts, {} operator strategies, stages {:?}", map.params.len(), s.strategy_items.len(), map.stages());
    let w = map.params.keys().map(|n| n.len()).max().unwrap_or(4).max(4);
    println!("{:<w$}  {:<12}  {:<14}  {:<9}  {:<7}  shape", "name", "dev_matrix", "tensor_map", "opt shard", "stages");
    for (n, p) in &map.params {
        let opt = if p.opt_shard_step == 0 { "-".to_string() } else { format!("{}/{}", p.opt_shard_step, p.opt_shard_size) };
        let shape = p.tensor_shape.as_ref().map_or("-".to_string(), |s| format!("{s:?}"));
        println!(
            "{:<w$}  {:<12}  {:<14}  {:<9}  {:<7}  {shape}",
            n,
            format!("{:?}", p.dev_matrix),
            p.tensor_map.to_string(),
            opt,
            format!("{:?}", p.stages)
        );
    }
    for i in &s.strategy_items {
        println!("strategy {} stage {} {:?}", i.node_name, i.stage, i.parallel_strategy);
    }
    Ok(())
}

fn inspect_group(g: &GroupInfo, as_json: bool) -> Result<()> {
    if as_json {
        let groups: serde_json::Map<String, serde_json::Value> = g.groups.iter().map(|(n, r)| (n.clone(), json!(r))).collect();
        println!("{}", json!({"groups": groups, "ckpt_restore_rank_list": g.restore_rank_list}));
        return Ok(());
    }
    for (n, r) in &g.groups {
        println!("{n}: {r:?}");
    }
    println!("ckpt_restore_rank_list: {:?}", g.restore_rank_list);
    Ok(())
}

/// `ckpt export --format hf`: every parameter of the model the flags describe (a llama or moe), read
/// whole from `src` one at a time, into `out/model.safetensors` (transformers' names, which are
/// the llama's own), and `out/config.json` with its sizes. Returns the tensors written.
fn export_hf(src: &std::path::Path, out: &std::path::Path, strategy: Option<PathBuf>, args: &super::common::ModelArgs) -> Result<usize> {
    use autopar_models::{model_by_name, Mode};
    let (name, mut opts) = super::common::model_options(args, &super::common::FileConfig::default())?;
    if name != "llama" && name != "moe" {
        bail!("--format hf writes Llama and Mixtral checkpoints (llama, moe), not {name}\nhint: pass --model llama or moe and its sizes");
    }
    super::common::hf_model_options(&name, src, &mut opts)?;
    let model = model_by_name(&name, &opts)?;
    let (graph, m) = model.build_graph(1, Mode::Eval, 0)?;
    let source = autopar_runtime::trainer::PieceSource::open(src, strategy)?;
    let mut reader = source.reader(0)?;
    let mut specs = Vec::new();
    for (param, &id) in &m.params {
        let shape = graph.node(id).ty.shape.clone();
        let Some((dtype, full)) = reader.full_shape(param)? else {
            bail!("{} holds no {param} {shape:?}\nhint: export the checkpoint of this model (the sizes given by the flags)", src.display());
        };
        if full != shape {
            bail!("{}: {param} is {full:?}, the model's is {shape:?}\nhint: give the sizes the checkpoint was trained with", src.display());
        }
        specs.push((param.clone(), dtype, shape));
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot make the folder {}", out.display()))?;
    let metadata: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let mut writer = autopar_checkpoint::SafetensorsWriter::create(&out.join("model.safetensors"), &metadata, &specs)?;
    let order: Vec<(String, Vec<usize>)> = writer.write_order().map(|(n, _, s)| (n.clone(), s.clone())).collect();
    for (param, shape) in &order {
        let region: Vec<std::ops::Range<usize>> = shape.iter().map(|&d| 0..d).collect();
        let (_, bytes) = reader.read_box(param, &region)?.with_context(|| format!("{param} vanished from {}", src.display()))?;
        writer.write_tensor(param, &bytes)?;
    }
    writer.finish()?;
    let moe = name == "moe";
    let c = if moe { autopar_models::moe_config(&opts)? } else { autopar_models::llama_config(&opts)? };
    let dtype = specs.first().map_or("float32", |s| match s.1 {
        autopar_checkpoint::DType::BFloat16 => "bfloat16",
        autopar_checkpoint::DType::Float16 => "float16",
        _ => "float32",
    });
    let mut config = json!({
        "architectures": [if moe { "MixtralForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if moe { "mixtral" } else { "llama" },
        "hidden_size": c.width,
        "intermediate_size": c.ffn_width,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.context,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": dtype,
    });
    if moe {
        config["num_local_experts"] = json!(c.experts);
        config["num_experts_per_tok"] = json!(c.top_k);
        config["router_jitter_noise"] = json!(0.0);
        if c.capacity_factor > 0.0 {
            eprintln!(
                "warning: the model was given capacity factor {}; transformers' Mixtral has none, so the exported model keeps every choice",
                c.capacity_factor
            );
        }
        config["output_router_logits"] = json!(c.aux_loss_coef > 0.0);
        config["router_aux_loss_coef"] = json!(if c.aux_loss_coef > 0.0 { c.aux_loss_coef } else { 0.001 });
    }
    autopar_checkpoint::io::write_atomic(&out.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    Ok(order.len())
}
