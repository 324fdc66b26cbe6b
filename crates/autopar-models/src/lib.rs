//! # autopar-models: the model zoo
//!
//! MLP ([`Mlp`]), ResNet-18/34/50 with CIFAR and ImageNet stems ([`ResNet`]) and a GPT-style
//! decoder ([`Gpt`]), each a config struct implementing [`Model`]: it adds itself to a
//! [`GraphBuilder`] for a given batch size and [`Mode`] and returns a [`ModelGraph`] with the ids
//! of its input, labels, logits and loss. [`model_by_name`] picks one by its CLI name.
//!
//! ```
//! use autopar_models::{model_by_name, Mode, Model, ModelOptions};
//! let opts = ModelOptions { width: Some(8), num_classes: Some(10), ..Default::default() };
//! let model = model_by_name("resnet18", &opts).unwrap();
//! let (graph, m) = model.build_graph(4, Mode::Train, 1).unwrap();
//! assert_eq!(graph.node(m.logits).ty.shape, vec![4, 10]);
//! assert!(m.params.contains_key("layer1.0.bn1.moving_mean"));
//! ```
//!
//! Key decisions:
//! * **Names are the interface.** Parameters are dotted like MindSpore's model zoo and
//!   PyTorch (`fc1.weight [out, in]`, `layer1.0.conv1.weight`, `bn1.gamma`, `bn1.moving_mean`,
//!   `blocks.0.attn.q_proj.weight`), so checkpoints, strategy files and `--init` work by name. Ops
//!   are named after the layer that owns them (`fc1.matmul`, `layer1.0.conv1`,
//!   `blocks.0.attn.scores`), and [`ModelGraph::ops`] maps every op name to its node, so a user or
//!   the planner can attach `.shard(strategy)` annotations after building
//!   ([`ModelGraph::shard`]). Models annotate nothing themselves.
//! * **Nothing assumes one device.** The batch size is a build argument (a rank builds its local
//!   batch, the planner the global one), models hold no state outside the graph, and every
//!   parameter's values depend only on the builder's seed and the parameter's name.
//! * **Train and eval graphs share every parameter.** [`Mode`] switches batch norm between batch
//!   and running statistics and turns dropout off; names and shapes do not change, so one
//!   parameter store serves both. Running statistics are frozen (non-trainable) parameters that
//!   the executor updates in training.
//! * **One loss shape for every model.** `logits` is always `[N, C]` and `labels` flattens to
//!   `[N]` (the GPT's `N` is batch x context), so the trainer's loss and accuracy code is shared.
//! * **The GPT's token embedding is one parameter used twice** (lookup and LM head); autodiff
//!   sums both gradients. A causal mask is a frozen `[T, T]` parameter added to the scores.
//! * **Initialisation as the reference frameworks do it**: dense layers `U(+-1/sqrt(in))`
//!   (MindSpore 2 `nn.Dense`, PyTorch `nn.Linear`), convolutions He-normal, the GPT GPT-2's
//!   N(0, 0.02), and each residual block's last batch norm with gamma 0 (MindSpore's model zoo
//!   `_bn_last`), without which narrow ResNet-50s barely train in a few dozen steps.
//!
//! Throughput against PyTorch: `cargo bench -p autopar-models --bench models` (see
//! `benches/models.rs`).

#![warn(missing_docs)]

mod error;
mod gpt;
mod layers;
mod llama;
mod mlp;
mod resnet;

use std::collections::BTreeMap;
use std::fmt;

use autopar_graph::Strategy;
use autopar_graph::{DType, Graph, GraphBuilder, NodeId, OpKind};

pub use error::{ModelError, Result};
pub use gpt::{Gpt, GptConfig};
pub use layers::BatchNormConfig;
pub use llama::{Llama, LlamaConfig};
pub use mlp::{Mlp, MlpConfig};
pub use resnet::{Block, ResNet, ResNetConfig, Stem};

/// Training (batch statistics, dropout on) or evaluation (running statistics, dropout off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Training: batch norm uses batch statistics and dropout is on.
    Train,
    /// Evaluation: batch norm uses running statistics and dropout is off.
    Eval,
}

impl Mode {
    /// Whether this is [`Mode::Train`].
    pub fn is_training(self) -> bool {
        self == Mode::Train
    }
}

/// What [`Model::build`] added to the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelGraph {
    /// The model's CLI name (`resnet18`).
    pub model: String,
    /// Samples per batch the graph was built for.
    pub batch: usize,
    /// Training or evaluation graph.
    pub mode: Mode,
    /// The input: `[N, ...sample shape]` of [`Model::input_dtype`].
    pub x: NodeId,
    /// Integer labels (i64): `[N]`, or `[N, T]` for the GPT.
    pub labels: NodeId,
    /// `[N, C]` (the GPT's rows are the `N * T` positions in row-major order).
    pub logits: NodeId,
    /// Scalar mean softmax cross-entropy.
    pub loss: NodeId,
    /// Every op the model added (not inputs or parameters), by name.
    pub ops: BTreeMap<String, NodeId>,
    /// Every parameter the model added (trainable and frozen), by name.
    pub params: BTreeMap<String, NodeId>,
}

impl ModelGraph {
    /// The node of op `name`, or an error naming the model and the op.
    pub fn op(&self, name: &str) -> Result<NodeId> {
        self.ops.get(name).copied().ok_or_else(|| ModelError::UnknownOp { model: self.model.clone(), name: name.to_string() })
    }

    /// The ops whose names start with `prefix` (`"layer3."`, `"blocks.2."`), in name order: the
    /// ops of one block, for a strategy or a pipeline stage per block.
    pub fn ops_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, NodeId)> + 'a {
        self.ops
            .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            .take_while(move |(n, _)| n.starts_with(prefix))
            .map(|(n, &id)| (n.as_str(), id))
    }

    /// Annotates op `name` with a sharding strategy (MindSpore's `op.shard(strategy)`), checked
    /// against the op's input shapes.
    pub fn shard(&self, b: &mut GraphBuilder, name: &str, strategy: Strategy) -> Result<NodeId> {
        let id = self.op(name)?;
        b.shard(id, strategy).map_err(|error| ModelError::Graph { model: self.model.clone(), error: Box::new(error) })
    }

    /// Same as [`ModelGraph::shard`] on a finished graph.
    pub fn shard_graph(&self, graph: &mut Graph, name: &str, strategy: Strategy) -> Result<NodeId> {
        let id = self.op(name)?;
        graph.set_strategy(id, strategy).map_err(|error| ModelError::Graph { model: self.model.clone(), error: Box::new(error) })?;
        Ok(id)
    }

    /// Parameter element counts of this model in `graph`.
    pub fn parameter_count(&self, graph: &Graph) -> ParamCount {
        let mut count = ParamCount::default();
        for &id in self.params.values() {
            if let OpKind::Parameter(p) = &graph.node(id).op {
                let n: usize = p.shape.iter().product();
                if p.trainable {
                    count.trainable += n;
                    count.trainable_tensors += 1;
                } else {
                    count.frozen += n;
                    count.frozen_tensors += 1;
                }
            }
        }
        count
    }

    /// Collects what `model` added to `b` since node `start`.
    /// `ids` are `[x, labels, logits, loss]`.
    pub(crate) fn collect(model: &str, b: &GraphBuilder, start: usize, mode: Mode, ids: [NodeId; 4]) -> Self {
        let [x, labels, logits, loss] = ids;
        let batch = b.graph().node(x).ty.shape[0];
        let mut ops = BTreeMap::new();
        let mut params = BTreeMap::new();
        for (i, node) in b.graph().nodes().iter().enumerate().skip(start) {
            match node.op {
                OpKind::Parameter(_) => {
                    params.insert(node.name.clone(), NodeId(i));
                }
                OpKind::Input(_) => {}
                _ => {
                    ops.insert(node.name.clone(), NodeId(i));
                }
            }
        }
        Self { model: model.to_string(), batch, mode, x, labels, logits, loss, ops, params }
    }
}

/// Numbers of parameter elements and tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamCount {
    /// Elements of trainable parameters.
    pub trainable: usize,
    /// Elements of frozen (non-trainable) parameters: running statistics, the causal mask.
    pub frozen: usize,
    /// Number of trainable parameter tensors.
    pub trainable_tensors: usize,
    /// Number of frozen parameter tensors.
    pub frozen_tensors: usize,
}

impl fmt::Display for ParamCount {
    /// `11.17M trainable (62 tensors), 9.6K frozen (40 tensors)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} trainable ({} tensors), {} frozen ({} tensors)",
            human(self.trainable),
            self.trainable_tensors,
            human(self.frozen),
            self.frozen_tensors
        )
    }
}

fn human(n: usize) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", n as f64 / 1e3),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

/// A model of the zoo: a configuration that builds its graph.
pub trait Model: fmt::Debug + Send + Sync {
    /// The CLI name (`mlp`, `resnet18`, `resnet34`, `resnet50`, `gpt`).
    fn name(&self) -> &str;
    /// The shape of one input sample (`[3, 32, 32]`, `[784]`, `[T]` tokens).
    fn input_shape(&self) -> Vec<usize>;
    /// The input's element type (f32 images and features, the default; i64 token ids).
    fn input_dtype(&self) -> DType {
        DType::F32
    }
    /// The shape of one sample's labels (`[]`, one class per sample, the default; `[T]` next
    /// tokens for the GPT).
    fn label_shape(&self) -> Vec<usize> {
        Vec::new()
    }
    /// Number of classes (the vocabulary for the GPT).
    fn num_classes(&self) -> usize;
    /// One line for logs and summaries: `resnet18 (basic blocks 2-2-2-2, cifar stem, width 64,
    /// 10 classes, input [3, 32, 32])`.
    fn describe(&self) -> String;
    /// Adds the model for `batch` samples to `b`; marks the loss and the logits as outputs.
    fn build(&self, b: &mut GraphBuilder, batch: usize, mode: Mode) -> Result<ModelGraph>;

    /// Builds the model alone in a fresh graph whose parameters draw from `seed`.
    fn build_graph(&self, batch: usize, mode: Mode, seed: u64) -> Result<(Graph, ModelGraph)> {
        let mut b = GraphBuilder::new(seed);
        let m = self.build(&mut b, batch, mode)?;
        Ok((b.finish(), m))
    }
}

/// The names [`model_by_name`] accepts.
pub const MODEL_NAMES: [&str; 7] = ["mlp", "resnet18", "resnet34", "resnet50", "gpt", "llama", "moe"];

/// The models whose samples are token sequences (`[T]` ids in, next-token ids out).
pub const LANGUAGE_MODELS: [&str; 3] = ["gpt", "llama", "moe"];

/// Overrides of a model's defaults, as a CLI or a config file gives them. `None` keeps the
/// model's default; an option a model has no use for is an error naming it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelOptions {
    /// Shape of one sample: `[784]` or `[1, 28, 28]` (mlp), `[3, 32, 32]` (resnet), `[T]` (gpt:
    /// the context length).
    pub input_shape: Option<Vec<usize>>,
    /// Classes, or the vocabulary size for the gpt.
    pub num_classes: Option<usize>,
    /// Hidden width (mlp: every hidden layer), base channels (resnet: 64), model width (gpt).
    pub width: Option<usize>,
    /// Hidden layers (mlp) or transformer blocks (gpt).
    pub depth: Option<usize>,
    /// Attention heads (gpt, llama: the query heads).
    pub heads: Option<usize>,
    /// Key/value heads of grouped-query attention (llama).
    pub kv_heads: Option<usize>,
    /// The MLP's hidden size (llama).
    pub ffn_width: Option<usize>,
    /// The rotary position embedding's base (llama).
    pub rope_theta: Option<f64>,
    /// Epsilon of the RMSNorms (llama).
    pub rms_eps: Option<f64>,
    /// The LM head reuses the token embedding (llama; the gpt's always does).
    pub tie_embeddings: Option<bool>,
    /// Experts of each block's MLP (moe).
    pub experts: Option<usize>,
    /// Experts each token is routed to (moe).
    pub top_k: Option<usize>,
    /// Weight of the auxiliary load-balancing loss (moe).
    pub aux_loss_coef: Option<f64>,
    /// Expert capacity factor (moe).
    pub capacity_factor: Option<f64>,
    /// ResNet stem.
    pub stem: Option<Stem>,
}

/// The model `name` (one of [`MODEL_NAMES`]) with `opts` applied to its defaults:
/// `mlp` 784-512-512-10; `resnet18`/`resnet34` CIFAR stem, 10 classes, 3x32x32; `resnet50` the
/// tutorial's ImageNet stem, 10 classes, 3x224x224; `gpt` vocab 256, context 64, width 128,
/// 4 heads, 4 blocks.
pub fn model_by_name(name: &str, opts: &ModelOptions) -> Result<Box<dyn Model>> {
    let unused = |option: &'static str, accepted: &'static str| Err(ModelError::UnusedOption { model: name.to_string(), option, accepted });
    let lower = name.to_ascii_lowercase();
    if lower != "moe" && MODEL_NAMES.contains(&lower.as_str()) {
        for (option, given) in [
            ("experts", opts.experts.is_some()),
            ("top_k", opts.top_k.is_some()),
            ("aux_loss_coef", opts.aux_loss_coef.is_some()),
            ("capacity_factor", opts.capacity_factor.is_some()),
        ] {
            if given {
                return unused(
                    option,
                    "experts, top_k, aux_loss_coef and capacity_factor only as the moe model (a llama whose MLPs are experts)",
                );
            }
        }
    }
    if !["llama", "moe"].contains(&lower.as_str()) && MODEL_NAMES.contains(&lower.as_str()) {
        for (option, given) in
            [("kv_heads", opts.kv_heads.is_some()), ("ffn_width", opts.ffn_width.is_some()), ("rope_theta", opts.rope_theta.is_some())]
        {
            if given {
                let accepted = match lower.as_str() {
                    "mlp" => "input_shape, num_classes, width and depth",
                    "gpt" => "input_shape ([context]), num_classes (vocab), width, depth and heads",
                    _ => "input_shape, num_classes, width and stem",
                };
                return unused(option, accepted);
            }
        }
    }
    match lower.as_str() {
        "mlp" => {
            const ACCEPTS: &str = "input_shape, num_classes, width and depth";
            if opts.heads.is_some() {
                return unused("heads", ACCEPTS);
            }
            if opts.stem.is_some() {
                return unused("stem", ACCEPTS);
            }
            let mut cfg = MlpConfig::default();
            if let Some(s) = &opts.input_shape {
                cfg.input_shape = s.clone();
            }
            if let Some(c) = opts.num_classes {
                cfg.num_classes = c;
            }
            let width = opts.width.unwrap_or(cfg.hidden[0]);
            let depth = opts.depth.unwrap_or(cfg.hidden.len());
            cfg.hidden = vec![width; depth];
            Ok(Box::new(Mlp::new(cfg)?))
        }
        n @ ("resnet18" | "resnet34" | "resnet50") => {
            const ACCEPTS: &str = "input_shape, num_classes, width and stem";
            if opts.depth.is_some() {
                return unused("depth", "input_shape, num_classes, width and stem (the depth is in the name: resnet18/34/50)");
            }
            if opts.heads.is_some() {
                return unused("heads", ACCEPTS);
            }
            let mut cfg = match n {
                "resnet18" => ResNetConfig::resnet18(10),
                "resnet34" => ResNetConfig::resnet34(10),
                _ => ResNetConfig::resnet50_tutorial(),
            };
            if let Some(stem) = opts.stem {
                cfg.stem = stem;
                if opts.input_shape.is_none() {
                    cfg.input_shape = stem.default_input_shape();
                }
            }
            if let Some(s) = &opts.input_shape {
                cfg.input_shape = s.clone();
            }
            if let Some(c) = opts.num_classes {
                cfg.num_classes = c;
            }
            if let Some(w) = opts.width {
                cfg.width = w;
            }
            Ok(Box::new(ResNet::new(cfg)?))
        }
        "gpt" => {
            if opts.stem.is_some() {
                return unused("stem", "input_shape ([context]), num_classes (vocab), width, depth and heads");
            }
            let mut cfg = GptConfig::default();
            decoder_options(name, opts, [&mut cfg.context, &mut cfg.vocab, &mut cfg.width, &mut cfg.layers, &mut cfg.heads])?;
            Ok(Box::new(Gpt::new(cfg).map_err(by_option)?))
        }
        "llama" => Ok(Box::new(Llama::new(llama_config(opts)?).map_err(by_option)?)),
        "moe" => Ok(Box::new(Llama::new(moe_config(opts)?).map_err(by_option)?)),
        _ => Err(ModelError::UnknownModel { name: name.to_string(), valid: MODEL_NAMES.join(", ") }),
    }
}

/// The Llama configuration `opts` describe (`llama`'s defaults where they say nothing), checked
/// as [`Llama::new`] checks it, a refused size named by its option.
pub fn llama_config(opts: &ModelOptions) -> Result<LlamaConfig> {
    if opts.stem.is_some() {
        return Err(ModelError::UnusedOption {
            model: "llama".into(),
            option: "stem",
            accepted: "input_shape ([context]), num_classes (vocab), width, depth, heads, kv_heads, ffn_width and rope_theta",
        });
    }
    let mut cfg = LlamaConfig::default();
    decoder_options("llama", opts, [&mut cfg.context, &mut cfg.vocab, &mut cfg.width, &mut cfg.layers, &mut cfg.heads])?;
    // As transformers: without a key/value head count, every query head has its own.
    if let Some(h) = opts.heads {
        cfg.kv_heads = h;
    }
    if let Some(h) = opts.kv_heads {
        cfg.kv_heads = h;
    }
    if let Some(f) = opts.ffn_width {
        cfg.ffn_width = f;
    }
    if let Some(t) = opts.rope_theta {
        cfg.rope_theta = t;
    }
    if let Some(e) = opts.rms_eps {
        cfg.rms_eps = e;
    }
    if let Some(t) = opts.tie_embeddings {
        cfg.tie_embeddings = t;
    }
    Llama::new(cfg.clone()).map_err(by_option)?;
    Ok(cfg)
}

/// The mixture of experts `opts` describe: [`llama_config`] with `experts` (default 4),
/// `top_k` (default 2), `aux_loss_coef` (default 0) and `capacity_factor` (default 0: none).
pub fn moe_config(opts: &ModelOptions) -> Result<LlamaConfig> {
    if opts.experts == Some(0) {
        return Err(ModelError::BadConfig {
            model: "moe".into(),
            field: "experts",
            value: "0".into(),
            expected: "at least 1 (a dense MLP is the llama model)".into(),
        });
    }
    let cfg = LlamaConfig {
        experts: opts.experts.unwrap_or(4),
        top_k: opts.top_k.unwrap_or(2),
        aux_loss_coef: opts.aux_loss_coef.unwrap_or(0.0),
        capacity_factor: opts.capacity_factor.unwrap_or(0.0),
        ..llama_config(opts)?
    };
    Llama::new(cfg.clone()).map_err(by_option)?;
    Ok(cfg)
}

/// The sizes every decoder language model takes from `opts`, over its defaults: `[context,
/// vocab, width, layers, heads]` from `input_shape` (`[context]`), `num_classes`, `width`,
/// `depth` and `heads`.
fn decoder_options(model: &str, opts: &ModelOptions, sizes: [&mut usize; 5]) -> Result<()> {
    let [context, vocab, width, layers, heads] = sizes;
    if let Some(s) = &opts.input_shape {
        *context = context_of(model, s)?;
    }
    for (slot, given) in [(vocab, opts.num_classes), (width, opts.width), (layers, opts.depth), (heads, opts.heads)] {
        if let Some(v) = given {
            *slot = v;
        }
    }
    Ok(())
}

/// The checks every decoder's configuration passes: each size positive, `heads` dividing
/// `width`, and a positive normalisation epsilon (`eps_field`).
pub(crate) fn check_decoder(
    model: &str,
    sizes: &[(&'static str, usize)],
    width: usize,
    heads: usize,
    eps: (&'static str, f64),
) -> Result<()> {
    for &(field, v) in sizes {
        positive(model, field, v)?;
    }
    let bad = |field, value: String, expected: String| Err(ModelError::BadConfig { model: model.into(), field, value, expected });
    if !width.is_multiple_of(heads) {
        return bad("heads", heads.to_string(), format!("a divisor of the width {width}"));
    }
    if eps.1.is_nan() || eps.1 <= 0.0 {
        return bad(eps.0, eps.1.to_string(), "a positive number".into());
    }
    Ok(())
}

/// A language model's context length from its one-dimensional input shape `[T]`.
fn context_of(model: &str, shape: &[usize]) -> Result<usize> {
    match shape {
        [t] => Ok(*t),
        _ => Err(ModelError::BadConfig {
            model: model.to_string(),
            field: "input_shape",
            value: format!("{shape:?}"),
            expected: "[context], one token sequence per sample".into(),
        }),
    }
}

/// A refused size named by the option that set it (a language model's `layers` by `depth`).
fn by_option(e: ModelError) -> ModelError {
    match e {
        ModelError::BadConfig { model, field, value, expected } => {
            let field = match field {
                "layers" => "depth",
                "vocab" => "num_classes",
                "context" => "input_shape",
                f => f,
            };
            ModelError::BadConfig { model, field, value, expected }
        }
        e => e,
    }
}

/// Whether weight decay should apply to parameter `name`: not to biases, normalisation scales
/// and shifts (`gamma`, `beta`) or running statistics, as in MindSpore's ResNet tutorial
/// (`'beta' not in x.name and 'gamma' not in x.name and 'bias' not in x.name`). Fits
/// `autopar_runtime`'s weight-decay filter (`fn(&str) -> bool`).
pub fn decays(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    !matches!(last, "bias" | "gamma" | "beta" | "moving_mean" | "moving_variance") && name != "causal_mask"
}

/// Checks a size is positive.
pub(crate) fn positive(model: &str, field: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(ModelError::BadConfig { model: model.to_string(), field, value: "0".into(), expected: "a positive number".into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_model_name_is_an_error_listing_the_valid_names() {
        let err = model_by_name("resnet101", &ModelOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("unknown model \"resnet101\""), "{msg}");
        assert!(msg.contains("valid models: mlp, resnet18, resnet34, resnet50, gpt"), "{msg}");
    }

    #[test]
    fn every_valid_name_gives_a_model_of_that_name() {
        for name in MODEL_NAMES {
            let m = model_by_name(name, &ModelOptions::default()).unwrap();
            assert_eq!(m.name(), name);
        }
        assert_eq!(model_by_name("ResNet18", &ModelOptions::default()).unwrap().name(), "resnet18");
    }

    #[test]
    fn options_that_do_not_apply_to_a_model_are_rejected_by_name() {
        let err = model_by_name("resnet50", &ModelOptions { heads: Some(4), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::UnusedOption { option: "heads", .. }), "{err}");
        let err = model_by_name("gpt", &ModelOptions { stem: Some(Stem::Cifar), ..Default::default() }).unwrap_err();
        assert!(err.to_string().starts_with("model gpt: option stem does not apply"), "{err}");
        let err = model_by_name("gpt", &ModelOptions { input_shape: Some(vec![3, 32, 32]), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::BadConfig { field: "input_shape", .. }), "{err}");
        let err = model_by_name("gpt", &ModelOptions { kv_heads: Some(2), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("option kv_heads does not apply") && err.to_string().contains("gpt takes input_shape"), "{err}");
        let err = model_by_name("mlp", &ModelOptions { rope_theta: Some(1e4), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::UnusedOption { option: "rope_theta", .. }), "{err}");
        let err = model_by_name("llama", &ModelOptions { stem: Some(Stem::Cifar), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::UnusedOption { option: "stem", .. }), "{err}");
    }

    #[test]
    fn llama_options_set_its_sizes_and_heads_alone_give_one_key_value_head_per_query_head() {
        let opts = ModelOptions {
            input_shape: Some(vec![12]),
            num_classes: Some(40),
            width: Some(32),
            depth: Some(2),
            heads: Some(8),
            kv_heads: Some(2),
            ffn_width: Some(48),
            rope_theta: Some(500000.0),
            ..Default::default()
        };
        let m = model_by_name("llama", &opts).unwrap();
        assert_eq!(m.describe(), "llama (vocab 40, context 12, width 32, 8 heads, 2 key/value heads, 2 blocks, MLP 48, rope theta 500000)");
        let (g, mg) = m.build_graph(1, Mode::Train, 0).unwrap();
        assert_eq!(g.node(mg.params["model.layers.1.self_attn.k_proj.weight"]).ty.shape, vec![8, 32]);
        let m = model_by_name("llama", &ModelOptions { heads: Some(8), ..Default::default() }).unwrap();
        assert!(m.describe().contains("8 heads, 8 key/value heads"), "{}", m.describe());
        let err = model_by_name("llama", &ModelOptions { depth: Some(0), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::BadConfig { field: "depth", .. }), "{err}");
        let err = model_by_name("llama", &ModelOptions { heads: Some(8), kv_heads: Some(3), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ModelError::BadConfig { field: "kv_heads", .. }), "{err}");
    }

    #[test]
    fn options_override_the_defaults() {
        let opts = ModelOptions {
            input_shape: Some(vec![1, 28, 28]),
            num_classes: Some(7),
            width: Some(32),
            depth: Some(3),
            ..Default::default()
        };
        let m = model_by_name("mlp", &opts).unwrap();
        let (g, mg) = m.build_graph(2, Mode::Train, 0).unwrap();
        assert_eq!(g.node(mg.params["fc1.weight"]).ty.shape, vec![32, 784]);
        assert_eq!(g.node(mg.params["fc4.weight"]).ty.shape, vec![7, 32]);
        let m = model_by_name("gpt", &ModelOptions { input_shape: Some(vec![16]), num_classes: Some(50), ..Default::default() }).unwrap();
        assert_eq!((m.input_shape(), m.num_classes(), m.label_shape()), (vec![16], 50, vec![16]));
        let m = model_by_name("resnet18", &ModelOptions { stem: Some(Stem::ImageNet), ..Default::default() }).unwrap();
        assert_eq!(m.input_shape(), vec![3, 224, 224]);
    }

    #[test]
    fn ops_can_be_sharded_by_name_after_building() {
        let m = model_by_name("mlp", &ModelOptions::default()).unwrap();
        let mut b = GraphBuilder::new(0);
        let mg = m.build(&mut b, 8, Mode::Train).unwrap();
        mg.shard(&mut b, "fc1.matmul", Strategy::new(vec![vec![2, 1], vec![4, 1]])).unwrap();
        assert_eq!(b.graph().node(mg.ops["fc1.matmul"]).strategy.as_ref().unwrap().to_string(), "((2, 1), (4, 1))");
        let err = mg.shard(&mut b, "fc9.matmul", Strategy::new(vec![vec![2, 1], vec![4, 1]])).unwrap_err();
        assert!(matches!(err, ModelError::UnknownOp { .. }), "{err}");
        let err = mg.shard(&mut b, "fc1.matmul", Strategy::new(vec![vec![3, 1], vec![1, 1]])).unwrap_err();
        assert!(err.to_string().starts_with("model mlp: MatMul fc1.matmul: strategy"), "{err}");
    }

    #[test]
    fn weight_decay_skips_biases_normalisation_parameters_and_buffers() {
        for name in ["fc1.weight", "layer1.0.conv1.weight", "wte.weight", "blocks.0.attn.q_proj.weight", "end_point.weight"] {
            assert!(decays(name), "{name}");
        }
        for name in ["fc1.bias", "bn1.gamma", "layer1.0.bn1.beta", "ln_f.gamma", "bn1.moving_mean", "causal_mask"] {
            assert!(!decays(name), "{name}");
        }
    }

    /// A size the options set is refused under the option's name, not the config field's.
    #[test]
    fn a_refused_gpt_size_is_named_by_its_option() {
        let err = |o: ModelOptions| match model_by_name("gpt", &o) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err(ModelOptions { depth: Some(0), ..Default::default() }).contains("depth = 0"));
        assert!(err(ModelOptions { num_classes: Some(0), ..Default::default() }).contains("num_classes = 0"));
        assert!(err(ModelOptions { heads: Some(3), ..Default::default() }).contains("heads = 3"));
    }

    #[test]
    fn the_ops_of_one_block_are_found_by_prefix() {
        let m = model_by_name("gpt", &ModelOptions { depth: Some(2), ..Default::default() }).unwrap();
        let (_, mg) = m.build_graph(1, Mode::Train, 0).unwrap();
        let block1: Vec<&str> = mg.ops_under("blocks.1.").map(|(n, _)| n).collect();
        assert!(block1.contains(&"blocks.1.attn.scores") && block1.contains(&"blocks.1.mlp.fc2.matmul"), "{block1:?}");
        assert!(block1.iter().all(|n| n.starts_with("blocks.1.")));
        assert_eq!((mg.batch, mg.mode), (1, Mode::Train));
        assert_eq!(block1.len(), mg.ops.keys().filter(|n| n.starts_with("blocks.1.")).count());
        assert_eq!(mg.ops_under("nothing.").count(), 0);
    }

    #[test]
    fn every_model_describes_itself_in_one_line() {
        let d = model_by_name("resnet50", &ModelOptions::default()).unwrap().describe();
        assert_eq!(d, "resnet50 (bottleneck blocks 3-4-6-3, imagenet stem, width 64, 10 classes, input [3, 224, 224])");
        let d = model_by_name("mlp", &ModelOptions::default()).unwrap().describe();
        assert_eq!(d, "mlp (784-512-512-10, ReLU)");
        let d = model_by_name("gpt", &ModelOptions::default()).unwrap().describe();
        assert_eq!(d, "gpt (vocab 256, context 64, width 128, 4 heads, 4 blocks, tied embeddings)");
    }

    #[test]
    fn parameter_counts_print_compactly() {
        let c = ParamCount { trainable: 11_173_962, frozen: 9_600, trainable_tensors: 62, frozen_tensors: 40 };
        assert_eq!(c.to_string(), "11.17M trainable (62 tensors), 9.6K frozen (40 tensors)");
    }
}
