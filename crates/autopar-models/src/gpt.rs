//! A GPT-style decoder: token and position embeddings, pre-LayerNorm blocks of causal
//! multi-head self-attention and a GELU MLP, a final LayerNorm and an LM head that reuses the
//! token embedding (weight tying); loss is the mean softmax cross-entropy of every next token.
//!
//! Names (dotted like PyTorch, LayerNorm parameters as MindSpore's `gamma`/`beta`):
//! `wte.weight [vocab, width]` (lookup `wte.gather` and LM head `lm_head.matmul`),
//! `wpe.weight [context, width]`, the frozen `causal_mask [context, context]`, and per block `i`
//! `blocks.<i>.ln1.{gamma, beta}`, `blocks.<i>.attn.{q_proj, v_proj, out_proj}.{weight, bias}`,
//! `blocks.<i>.attn.k_proj.weight`, `blocks.<i>.ln2.{gamma, beta}`,
//! `blocks.<i>.mlp.{fc1, fc2}.{weight, bias}`; then `ln_f.{gamma, beta}`. Dense weights are
//! `[out, in]` applied with MatMul `transpose_b`.
//!
//! The key projection has no bias (as in Whisper): a key bias adds the same amount to every
//! score of a query's row, which the softmax cancels, so its gradient is zero in exact
//! arithmetic. It would only hold rounding noise, which Adam-style optimizers normalise into
//! full-size updates that differ from one summation order to the next.
//!
//! The residual stream is kept as `[N * T, width]` so every projection is one 2-D MatMul;
//! attention reshapes to `[N, heads, T, head_dim]` for two BatchMatMuls (`attn.scores`,
//! `attn.context`). Initialisation follows GPT-2: N(0, 0.02) for embeddings and projections,
//! N(0, 0.02 / sqrt(2 * layers)) for the projections into the residual stream, zero biases.

use autopar_graph::{derive_seed, DType, GraphBuilder, Initializer, NodeId, ParamSpec};

use crate::error::{GraphContext, ModelError, Result};
use crate::layers::{dense, layer_norm};
use crate::{check_decoder, positive, Mode, Model, ModelGraph};

/// Sizes of a [`Gpt`].
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size: token ids are `0..vocab`, and the LM head has one logit per token.
    pub vocab: usize,
    /// Tokens per sequence (the context length; also the position-embedding rows).
    pub context: usize,
    /// Model width (embedding size).
    pub width: usize,
    /// Attention heads; must divide the width.
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// MLP hidden size as a multiple of the width.
    pub mlp_ratio: usize,
    /// Dropout on embeddings, attention probabilities and residual branches in training.
    pub dropout: f64,
    /// Seed of the dropout masks (mixed with each dropout op's name).
    pub dropout_seed: u64,
    /// Epsilon added to the variance in every LayerNorm.
    pub ln_eps: f64,
    /// The LM head reuses `wte.weight`; when false it has its own `lm_head.weight`.
    pub tie_embeddings: bool,
}

impl Default for GptConfig {
    /// vocab 256, context 64, width 128, 4 heads, 4 blocks, no dropout, tied embeddings.
    fn default() -> Self {
        Self {
            vocab: 256,
            context: 64,
            width: 128,
            heads: 4,
            layers: 4,
            mlp_ratio: 4,
            dropout: 0.0,
            dropout_seed: 0,
            ln_eps: 1e-5,
            tie_embeddings: true,
        }
    }
}

impl GptConfig {
    /// GPT-2 small: vocab 50257, context 1024, width 768, 12 heads, 12 blocks (124M parameters).
    pub fn gpt2_small() -> Self {
        Self { vocab: 50257, context: 1024, width: 768, heads: 12, layers: 12, ..Self::default() }
    }
}

/// A decoder-only transformer language model.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt {
    cfg: GptConfig,
}

impl Gpt {
    /// Checks the configuration: every size positive, `heads` dividing `width`, `dropout` in `[0, 1)` and `ln_eps`
    /// positive; otherwise [`ModelError::BadConfig`].
    pub fn new(cfg: GptConfig) -> Result<Self> {
        let sizes = [
            ("vocab", cfg.vocab),
            ("context", cfg.context),
            ("width", cfg.width),
            ("heads", cfg.heads),
            ("layers", cfg.layers),
            ("mlp_ratio", cfg.mlp_ratio),
        ];
        check_decoder("gpt", &sizes, cfg.width, cfg.heads, ("ln_eps", cfg.ln_eps))?;
        if !(0.0..1.0).contains(&cfg.dropout) {
            let value = cfg.dropout.to_string();
            return Err(ModelError::BadConfig { model: "gpt".into(), field: "dropout", value, expected: "a probability in [0, 1)".into() });
        }
        Ok(Self { cfg })
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    fn dropout(&self, b: &mut GraphBuilder, name: &str, x: NodeId, training: bool) -> autopar_graph::Result<NodeId> {
        if training && self.cfg.dropout > 0.0 {
            b.dropout(name, x, self.cfg.dropout, derive_seed(self.cfg.dropout_seed, name))
        } else {
            Ok(x)
        }
    }

    /// `[N * T, d] -> [N, H, T, d / H]`.
    fn split_heads(&self, b: &mut GraphBuilder, name: &str, x: NodeId, n: usize) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let r = b.reshape(&format!("{name}.split"), x, &[n as i64, c.context as i64, c.heads as i64, (c.width / c.heads) as i64])?;
        b.transpose(&format!("{name}.heads"), r, &[0, 2, 1, 3])
    }

    fn block(&self, b: &mut GraphBuilder, i: usize, h: NodeId, mask: NodeId, n: usize, training: bool) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let p = |s: &str| format!("blocks.{i}.{s}");
        b.block(&p(""));
        let std = 0.02;
        let proj = Initializer::Normal { mean: 0.0, std };
        let resid = Initializer::Normal { mean: 0.0, std: std / ((2 * c.layers) as f64).sqrt() };
        let zeros = Some(Initializer::Zeros);

        // Causal self-attention.
        let a = layer_norm(b, &p("ln1"), h, c.ln_eps)?;
        let q = dense(b, &p("attn.q_proj"), a, c.width, proj.clone(), zeros.clone())?;
        let k = dense(b, &p("attn.k_proj"), a, c.width, proj.clone(), None)?;
        let v = dense(b, &p("attn.v_proj"), a, c.width, proj.clone(), zeros.clone())?;
        let q = self.split_heads(b, &p("attn.q"), q, n)?;
        let k = self.split_heads(b, &p("attn.k"), k, n)?;
        let v = self.split_heads(b, &p("attn.v"), v, n)?;
        let s = b.batch_matmul(&p("attn.scores"), q, k, false, true)?;
        let s = b.scale(&p("attn.scale"), s, 1.0 / ((c.width / c.heads) as f64).sqrt())?;
        let s = b.add(&p("attn.mask"), s, mask)?;
        let probs = b.softmax(&p("attn.softmax"), s, -1)?;
        let probs = self.dropout(b, &p("attn.dropout"), probs, training)?;
        let ctx = b.batch_matmul(&p("attn.context"), probs, v, false, false)?;
        let ctx = b.transpose(&p("attn.merge"), ctx, &[0, 2, 1, 3])?;
        let ctx = b.reshape(&p("attn.merge.flat"), ctx, &[(n * c.context) as i64, c.width as i64])?;
        let o = dense(b, &p("attn.out_proj"), ctx, c.width, resid.clone(), zeros.clone())?;
        let o = self.dropout(b, &p("attn.resid_dropout"), o, training)?;
        let h = b.add(&p("add1"), h, o)?;

        // MLP.
        let m = layer_norm(b, &p("ln2"), h, c.ln_eps)?;
        let m = dense(b, &p("mlp.fc1"), m, c.mlp_ratio * c.width, proj, zeros.clone())?;
        let m = b.gelu(&p("mlp.gelu"), m)?;
        let m = dense(b, &p("mlp.fc2"), m, c.width, resid, zeros)?;
        let m = self.dropout(b, &p("mlp.dropout"), m, training)?;
        b.add(&p("add2"), h, m)
    }

    fn build_inner(&self, b: &mut GraphBuilder, n: usize, training: bool) -> autopar_graph::Result<(NodeId, NodeId, NodeId, NodeId)> {
        let c = &self.cfg;
        let t = c.context;
        let tokens = b.input("tokens", &[n, t], DType::I64)?;
        let labels = b.input("labels", &[n, t], DType::I64)?;
        let emb = Initializer::Normal { mean: 0.0, std: 0.02 };
        let wte = b.parameter("wte.weight", &[c.vocab, c.width], emb.clone())?;
        let wpe = b.parameter("wpe.weight", &[t, c.width], emb.clone())?;
        let mask = b.parameter_with("causal_mask", ParamSpec::new(&[t, t], Initializer::CausalMask { masked: -1e9 }).frozen())?;
        let tok = b.gather("wte.gather", wte, tokens, 0)?;
        let h = b.add("embed.add", tok, wpe)?;
        let h = self.dropout(b, "embed.dropout", h, training)?;
        let mut h = b.reshape("embed.flat", h, &[(n * t) as i64, c.width as i64])?;
        for i in 0..c.layers {
            h = self.block(b, i, h, mask, n, training)?;
        }
        let h = layer_norm(b, "ln_f", h, c.ln_eps)?;
        let head = if c.tie_embeddings { wte } else { b.parameter("lm_head.weight", &[c.vocab, c.width], emb)? };
        let logits = b.matmul_t("lm_head.matmul", h, head, false, true)?;
        let flat_labels = b.reshape("labels.flat", labels, &[(n * t) as i64])?;
        let loss = b.softmax_cross_entropy("loss", logits, flat_labels)?;
        b.output(loss)?;
        b.output(logits)?;
        Ok((tokens, labels, logits, loss))
    }
}

impl Model for Gpt {
    fn name(&self) -> &str {
        "gpt"
    }
    fn input_shape(&self) -> Vec<usize> {
        vec![self.cfg.context]
    }
    fn input_dtype(&self) -> DType {
        DType::I64
    }
    fn label_shape(&self) -> Vec<usize> {
        vec![self.cfg.context]
    }
    fn num_classes(&self) -> usize {
        self.cfg.vocab
    }
    fn describe(&self) -> String {
        let c = &self.cfg;
        let tied = if c.tie_embeddings { "tied" } else { "untied" };
        let dropout = if c.dropout > 0.0 { format!(", dropout {}", c.dropout) } else { String::new() };
        format!(
            "gpt (vocab {}, context {}, width {}, {} heads, {} blocks, {tied} embeddings{dropout})",
            c.vocab, c.context, c.width, c.heads, c.layers
        )
    }
    fn build(&self, b: &mut GraphBuilder, batch: usize, mode: Mode) -> Result<ModelGraph> {
        positive("gpt", "batch size", batch)?;
        let start = b.graph().len();
        let (x, labels, logits, loss) = self.build_inner(b, batch, mode.is_training()).model("gpt")?;
        Ok(ModelGraph::collect("gpt", b, start, mode, [x, labels, logits, loss]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::OpKind;

    fn small() -> GptConfig {
        GptConfig { vocab: 11, context: 6, width: 8, heads: 2, layers: 2, ..GptConfig::default() }
    }

    #[test]
    fn gpt2_small_has_124_million_parameters_with_tied_embeddings() {
        let (g, m) = Gpt::new(GptConfig::gpt2_small()).unwrap().build_graph(1, Mode::Train, 0).unwrap();
        let count = m.parameter_count(&g);
        // GPT-2's 124,439,808 less its 12 x 768 key biases, which have no effect.
        assert_eq!(count.trainable, 124_439_808 - 12 * 768);
        assert_eq!((count.frozen, count.frozen_tensors), (1024 * 1024, 1));
    }

    #[test]
    fn parameter_names_shapes_and_count_follow_the_config() {
        let c = small();
        let (g, m) = Gpt::new(c.clone()).unwrap().build_graph(3, Mode::Train, 0).unwrap();
        let shape = |n: &str| g.node(m.params[n]).ty.shape.clone();
        assert_eq!(shape("wte.weight"), vec![11, 8]);
        assert_eq!(shape("wpe.weight"), vec![6, 8]);
        assert_eq!(shape("causal_mask"), vec![6, 6]);
        assert_eq!(shape("blocks.1.attn.q_proj.weight"), vec![8, 8]);
        assert_eq!(shape("blocks.1.mlp.fc1.weight"), vec![32, 8]);
        assert_eq!(shape("blocks.1.mlp.fc2.weight"), vec![8, 32]);
        assert_eq!(shape("ln_f.gamma"), vec![8]);
        assert!(!m.params.contains_key("lm_head.weight"));
        let d = c.width;
        let per_block = 4 * (d * d + d) - d + 2 * (4 * d * d) + 4 * d + d + 2 * 2 * d;
        let expected = c.vocab * d + c.context * d + c.layers * per_block + 2 * d;
        assert_eq!(m.parameter_count(&g).trainable, expected);
        assert_eq!(m.params.len(), 3 + c.layers * 15 + 2);
        assert!(m.params.contains_key("blocks.1.attn.k_proj.weight") && !m.params.contains_key("blocks.1.attn.k_proj.bias"));
        // Shapes through the graph.
        assert_eq!(g.node(m.x).ty, autopar_graph::TensorType::new(vec![3, 6], DType::I64));
        assert_eq!(g.node(m.ops["blocks.0.attn.scores"]).ty.shape, vec![3, 2, 6, 6]);
        assert_eq!(g.node(m.ops["blocks.0.attn.context"]).ty.shape, vec![3, 2, 6, 4]);
        assert_eq!(g.node(m.logits).ty.shape, vec![18, 11]);
        assert!(matches!(&g.node(m.params["causal_mask"]).op, OpKind::Parameter(p) if !p.trainable));
    }

    #[test]
    fn the_token_embedding_feeds_both_the_lookup_and_the_lm_head() {
        let (g, m) = Gpt::new(small()).unwrap().build_graph(2, Mode::Train, 0).unwrap();
        let wte = m.params["wte.weight"];
        let users: Vec<&str> = g.nodes().iter().filter(|n| n.inputs.contains(&wte)).map(|n| n.name.as_str()).collect();
        assert_eq!(users, vec!["wte.gather", "lm_head.matmul"]);
        let (g, m) = Gpt::new(GptConfig { tie_embeddings: false, ..small() }).unwrap().build_graph(2, Mode::Train, 0).unwrap();
        assert_eq!(g.node(m.ops["lm_head.matmul"]).inputs[1], m.params["lm_head.weight"]);
    }

    #[test]
    fn dropout_appears_only_in_training_and_only_when_asked() {
        let cfg = GptConfig { dropout: 0.1, ..small() };
        let (_, m) = Gpt::new(cfg.clone()).unwrap().build_graph(2, Mode::Train, 0).unwrap();
        assert!(m.ops.contains_key("blocks.1.attn.dropout") && m.ops.contains_key("embed.dropout"));
        let (_, m) = Gpt::new(cfg).unwrap().build_graph(2, Mode::Eval, 0).unwrap();
        assert!(!m.ops.keys().any(|k| k.contains("dropout")));
        let (_, m) = Gpt::new(small()).unwrap().build_graph(2, Mode::Train, 0).unwrap();
        assert!(!m.ops.keys().any(|k| k.contains("dropout")));
    }

    #[test]
    fn heads_must_divide_the_width() {
        let err = Gpt::new(GptConfig { heads: 3, ..small() }).unwrap_err();
        assert_eq!(err.to_string(), "model gpt: heads = 3 is invalid; expected a divisor of the width 8");
        let err = Gpt::new(GptConfig { dropout: 1.0, ..small() }).unwrap_err();
        assert!(matches!(err, ModelError::BadConfig { field: "dropout", .. }), "{err}");
    }
}
