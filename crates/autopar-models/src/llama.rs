//! A Llama-family decoder (Llama 2/3; with experts, Mixtral): a token embedding,
//! pre-RMSNorm blocks of causal grouped-query attention with rotary position embeddings and a
//! SwiGLU MLP, a final RMSNorm and an LM head; loss is the mean softmax cross-entropy of every
//! next token.
//!
//! Names and layouts are Hugging Face `transformers`' (`LlamaForCausalLM`), so its checkpoints
//! load by name: `model.embed_tokens.weight [vocab, width]`, per block `i`
//! `model.layers.<i>.input_layernorm.weight`,
//! `model.layers.<i>.self_attn.{q_proj, k_proj, v_proj, o_proj}.weight`,
//! `model.layers.<i>.post_attention_layernorm.weight`,
//! `model.layers.<i>.mlp.{gate_proj, up_proj, down_proj}.weight`, then `model.norm.weight` and
//! `lm_head.weight [vocab, width]` (or the embedding, tied). Dense weights are `[out, in]`
//! applied with MatMul `transpose_b`; no layer has a bias, and the model has no parameter
//! `transformers` lacks.
//!
//! Attention is one fused, causal [`Attention`](autopar_graph::ops::Attention) op per block,
//! which never holds the `[T, T]` scores whole. Grouped-query attention never repeats the keys
//! and values: the `H = G · KV` query heads are regrouped as `[N, KV, G, T, d]`, each key/value
//! head meeting its `G` query heads, and a split of the key/value heads splits their query
//! groups with them.
//! Initialisation is `transformers`': N(0, 0.02) for every projection and the embedding, ones
//! for the norms.

use autopar_graph::{DType, GraphBuilder, Initializer, NodeId};

use crate::error::{GraphContext, ModelError, Result};
use crate::layers::dense;
use crate::{check_decoder, positive, Mode, Model, ModelGraph};

/// Sizes of a [`Llama`].
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size: token ids are `0..vocab`, and the LM head has one logit per token.
    pub vocab: usize,
    /// Tokens per sequence (the context length).
    pub context: usize,
    /// Model width (`hidden_size`).
    pub width: usize,
    /// Query heads (`num_attention_heads`); must divide the width.
    pub heads: usize,
    /// Key/value heads (`num_key_value_heads`); must divide the query heads.
    pub kv_heads: usize,
    /// Transformer blocks (`num_hidden_layers`).
    pub layers: usize,
    /// The MLP's hidden size (`intermediate_size`).
    pub ffn_width: usize,
    /// The rotary embedding's base (`rope_theta`).
    pub rope_theta: f64,
    /// Epsilon added to the mean square in every RMSNorm (`rms_norm_eps`).
    pub rms_eps: f64,
    /// The LM head reuses the token embedding (`tie_word_embeddings`).
    pub tie_embeddings: bool,
    /// Experts of each block's MLP (Mixtral's `num_local_experts`); 0: one dense MLP.
    pub experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`), with weights renormalised over them.
    pub top_k: usize,
    /// Weight of the auxiliary load-balancing loss added to the training loss (transformers'
    /// `router_aux_loss_coef` with `output_router_logits`); 0: none.
    pub aux_loss_coef: f64,
    /// MindSpore's `capacity_factor`: each expert takes at most `ceil(top_k * tokens *
    /// capacity_factor / experts)` of the batch's tokens, and the choices beyond are dropped;
    /// 0: none (every choice kept, as Mixtral).
    pub capacity_factor: f64,
}

impl Default for LlamaConfig {
    /// vocab 256, context 64, width 128, 4 heads over 2 key/value heads, 4 blocks, MLP 344,
    /// theta 10000, eps 1e-6, untied.
    fn default() -> Self {
        Self {
            vocab: 256,
            context: 64,
            width: 128,
            heads: 4,
            kv_heads: 2,
            layers: 4,
            ffn_width: 344,
            rope_theta: 10000.0,
            rms_eps: 1e-6,
            tie_embeddings: false,
            experts: 0,
            top_k: 2,
            aux_loss_coef: 0.0,
            capacity_factor: 0.0,
        }
    }
}

/// A Llama-family decoder-only language model.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama {
    cfg: LlamaConfig,
}

impl Llama {
    /// Checks the configuration: every size positive, `heads` dividing `width`, `kv_heads`
    /// dividing `heads`, an even head size, `rope_theta` above 1 and `rms_eps` positive;
    /// otherwise [`ModelError::BadConfig`].
    pub fn new(cfg: LlamaConfig) -> Result<Self> {
        let sizes = [
            ("vocab", cfg.vocab),
            ("context", cfg.context),
            ("width", cfg.width),
            ("heads", cfg.heads),
            ("kv_heads", cfg.kv_heads),
            ("layers", cfg.layers),
            ("ffn_width", cfg.ffn_width),
        ];
        check_decoder("llama", &sizes, cfg.width, cfg.heads, ("rms_eps", cfg.rms_eps))?;
        let bad = |field, value: String, expected: String| Err(ModelError::BadConfig { model: "llama".into(), field, value, expected });
        if !cfg.heads.is_multiple_of(cfg.kv_heads) {
            return bad("kv_heads", cfg.kv_heads.to_string(), format!("a divisor of the {} query heads", cfg.heads));
        }
        if !(cfg.width / cfg.heads).is_multiple_of(2) {
            return bad(
                "heads",
                cfg.heads.to_string(),
                format!("a head size (width / heads = {}) that is even, for the rotary embedding", cfg.width / cfg.heads),
            );
        }
        if cfg.rope_theta.is_nan() || cfg.rope_theta <= 1.0 {
            return bad("rope_theta", cfg.rope_theta.to_string(), "a base greater than 1, such as 10000".into());
        }
        if !cfg.aux_loss_coef.is_finite() || cfg.aux_loss_coef < 0.0 {
            return bad("aux_loss_coef", cfg.aux_loss_coef.to_string(), "a finite weight of 0 or more".into());
        }
        if cfg.aux_loss_coef > 0.0 && cfg.experts == 0 {
            return bad("aux_loss_coef", cfg.aux_loss_coef.to_string(), "0 for a model without experts (the moe model has them)".into());
        }
        if !cfg.capacity_factor.is_finite() || cfg.capacity_factor < 0.0 || (cfg.capacity_factor > 0.0 && cfg.experts == 0) {
            let expected = if cfg.experts == 0 {
                "0 for a model without experts (the moe model has them)"
            } else {
                "a finite factor above 0 (0: no capacity)"
            };
            return bad("capacity_factor", cfg.capacity_factor.to_string(), expected.into());
        }
        if cfg.experts > 0 && (cfg.top_k == 0 || cfg.top_k > cfg.experts) {
            return bad("top_k", cfg.top_k.to_string(), format!("between 1 and the {} experts", cfg.experts));
        }
        Ok(Self { cfg })
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    fn head_dim(&self) -> usize {
        self.cfg.width / self.cfg.heads
    }

    /// RMSNorm over the last dimension with its weight `<name>.weight` (ones).
    fn norm(&self, b: &mut GraphBuilder, name: &str, x: NodeId) -> autopar_graph::Result<NodeId> {
        let w = b.parameter(&format!("{name}.weight"), &[self.cfg.width], Initializer::Ones)?;
        b.rms_norm(name, x, w, -1, self.cfg.rms_eps)
    }

    /// `[N * T, heads * d] -> [N, heads, T, d]`.
    fn split_heads(&self, b: &mut GraphBuilder, name: &str, x: NodeId, n: usize, heads: usize) -> autopar_graph::Result<NodeId> {
        let (t, d) = (self.cfg.context as i64, self.head_dim() as i64);
        let r = b.reshape(&format!("{name}.split"), x, &[n as i64, t, heads as i64, d])?;
        b.transpose(&format!("{name}.heads"), r, &[0, 2, 1, 3])
    }

    fn attention(&self, b: &mut GraphBuilder, p: &dyn Fn(&str) -> String, a: NodeId, n: usize) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let (hd, kv) = (self.head_dim(), c.kv_heads);
        let g = c.heads / kv;
        let (ni, t, hdi, kvi, gi) = (n as i64, c.context as i64, hd as i64, kv as i64, g as i64);
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let q = dense(b, &p("self_attn.q_proj"), a, c.heads * hd, init.clone(), None)?;
        let k = dense(b, &p("self_attn.k_proj"), a, kv * hd, init.clone(), None)?;
        let v = dense(b, &p("self_attn.v_proj"), a, kv * hd, init.clone(), None)?;
        let q = self.split_heads(b, &p("self_attn.q"), q, n, c.heads)?;
        let k = self.split_heads(b, &p("self_attn.k"), k, n, kv)?;
        let v = self.split_heads(b, &p("self_attn.v"), v, n, kv)?;
        let q = b.rotary_embedding(&p("self_attn.q_rope"), q, c.rope_theta)?;
        let k = b.rotary_embedding(&p("self_attn.k_rope"), k, c.rope_theta)?;
        // Query head h = kv * G + g meets key/value head kv: [N, KV, G, T, d].
        let q = b.reshape(&p("self_attn.q_groups"), q, &[ni, kvi, gi, t, hdi])?;
        let ctx = b.attention(&p("self_attn.attention"), q, k, v, 1.0 / (hd as f64).sqrt(), true)?;
        let ctx = b.reshape(&p("self_attn.context_heads"), ctx, &[ni, c.heads as i64, t, hdi])?;
        let ctx = b.transpose(&p("self_attn.merge"), ctx, &[0, 2, 1, 3])?;
        let ctx = b.reshape(&p("self_attn.merge.flat"), ctx, &[ni * t, c.width as i64])?;
        dense(b, &p("self_attn.o_proj"), ctx, c.width, init, None)
    }

    /// Block `i`; a mixture of experts adds its router's per-expert sums to `balance`.
    fn block(&self, b: &mut GraphBuilder, i: usize, h: NodeId, n: usize, balance: &mut Vec<[NodeId; 2]>) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let p = |s: &str| format!("model.layers.{i}.{s}");
        b.block(&p(""));
        let a = self.norm(b, &p("input_layernorm"), h)?;
        let o = self.attention(b, &p, a, n)?;
        let h = b.add(&p("add1"), h, o)?;

        let m = self.norm(b, &p("post_attention_layernorm"), h)?;
        let m = if c.experts > 0 { self.experts(b, &p, m, n, balance)? } else { self.mlp(b, &p, m)? };
        b.add(&p("add2"), h, m)
    }

    /// SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
    fn mlp(&self, b: &mut GraphBuilder, p: &dyn Fn(&str) -> String, m: NodeId) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let gate = dense(b, &p("mlp.gate_proj"), m, c.ffn_width, init.clone(), None)?;
        let up = dense(b, &p("mlp.up_proj"), m, c.ffn_width, init.clone(), None)?;
        let gate = b.silu(&p("mlp.silu"), gate)?;
        let m = b.mul(&p("mlp.swiglu"), gate, up)?;
        dense(b, &p("mlp.down_proj"), m, c.width, init, None)
    }

    /// Mixtral's mixture of SwiGLU experts under the names of transformers' checkpoint files
    /// (`block_sparse_moe.gate.weight [E, d]`, per expert `e`
    /// `block_sparse_moe.experts.<e>.{w1, w3}.weight [F, d]` (gate, up) and `w2.weight [d, F]`):
    /// the router's softmax, each token's `top_k` experts weighted by their renormalised
    /// probabilities (under a capacity factor, the choices each expert has room for, as
    /// MindSpore's MoE grants them). Every expert runs on every token and the weights (zero for
    /// the experts a token did not choose) combine them: one product into all the experts' gate and up
    /// projections (their weights concatenated), one out of their down projections.
    ///
    /// With an auxiliary loss, `balance` gains the block's `[assignments, probabilities]`, each
    /// `[E]` summed over the tokens: how many chose each expert, and its router probabilities.
    fn experts(
        &self,
        b: &mut GraphBuilder,
        p: &dyn Fn(&str) -> String,
        m: NodeId,
        n: usize,
        balance: &mut Vec<[NodeId; 2]>,
    ) -> autopar_graph::Result<NodeId> {
        let c = &self.cfg;
        let (rows, e, f) = (n * c.context, c.experts, c.ffn_width);
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let logits = dense(b, &p("block_sparse_moe.gate"), m, e, init.clone(), None)?;
        let probs = b.softmax(&p("block_sparse_moe.router.softmax"), logits, -1)?;
        // MindSpore's expert capacity over the batch's tokens.
        let capacity = (c.capacity_factor > 0.0).then(|| ((c.top_k * rows) as f64 * c.capacity_factor / e as f64).ceil() as usize);
        let weights = b.router_top_k(&p("block_sparse_moe.router.top_k"), probs, c.top_k, true, capacity)?;
        if c.aux_loss_coef > 0.0 {
            let chosen = b.router_top_k_mask(&p("block_sparse_moe.router.chosen"), probs, c.top_k)?;
            let chosen = b.reduce_sum(&p("block_sparse_moe.router.chosen.sum"), chosen, &[0], false)?;
            let mass = b.reduce_sum(&p("block_sparse_moe.router.probs.sum"), probs, &[0], false)?;
            balance.push([chosen, mass]);
        }
        let (mut into, mut out) = (Vec::new(), Vec::new());
        for j in 0..e {
            let w = |b: &mut GraphBuilder, which: &str, shape: &[usize]| {
                b.parameter(&p(&format!("block_sparse_moe.experts.{j}.{which}.weight")), shape, init.clone())
            };
            into.push(w(b, "w1", &[f, c.width])?);
            into.push(w(b, "w3", &[f, c.width])?);
            out.push(w(b, "w2", &[c.width, f])?);
        }
        // [E * 2F, d]: each expert's gate rows, then its up rows.
        let w13 = b.concat(&p("block_sparse_moe.experts.w13"), &into, 0)?;
        let h = b.matmul_t(&p("block_sparse_moe.experts.gate_up"), m, w13, false, true)?;
        let h = b.reshape(&p("block_sparse_moe.experts.by_expert"), h, &[rows as i64, e as i64, 2 * f as i64])?;
        let gate = b.slice(&p("block_sparse_moe.experts.gate"), h, &[0, 0, 0], &[rows, e, f])?;
        let up = b.slice(&p("block_sparse_moe.experts.up"), h, &[0, 0, f], &[rows, e, f])?;
        let gate = b.silu(&p("block_sparse_moe.experts.silu"), gate)?;
        let act = b.mul(&p("block_sparse_moe.experts.swiglu"), gate, up)?;
        let weights = b.reshape(&p("block_sparse_moe.router.weights"), weights, &[rows as i64, e as i64, 1])?;
        let act = b.mul(&p("block_sparse_moe.experts.weighted"), act, weights)?;
        let act = b.reshape(&p("block_sparse_moe.experts.weighted.flat"), act, &[rows as i64, (e * f) as i64])?;
        // [d, E * F]: the experts' down projections side by side.
        let w2 = b.concat(&p("block_sparse_moe.experts.w2"), &out, 1)?;
        b.matmul_t(&p("block_sparse_moe.experts.down"), act, w2, false, true)
    }

    /// Mixtral's auxiliary load-balancing loss (Switch Transformer's), weighted by
    /// `aux_loss_coef`: over every block's `rows` tokens together, each expert's share of the
    /// assignments `f_e` times its mean router probability `P_e`, summed and times the expert
    /// count: `coef * E * sum_e f_e P_e`. None without experts or a weight.
    fn balance_loss(&self, b: &mut GraphBuilder, balance: &[[NodeId; 2]], rows: usize) -> autopar_graph::Result<Option<NodeId>> {
        let c = &self.cfg;
        let Some(&[mut chosen, mut mass]) = balance.first() else { return Ok(None) };
        for (i, &[f, p]) in balance.iter().enumerate().skip(1) {
            chosen = b.add(&format!("aux_loss.chosen.{i}"), chosen, f)?;
            mass = b.add(&format!("aux_loss.probs.{i}"), mass, p)?;
        }
        let product = b.mul("aux_loss.product", chosen, mass)?;
        let total = b.reduce_sum("aux_loss.sum", product, &[0], false)?;
        // f_e and P_e are sums over blocks x rows: divide by that count twice.
        let count = (balance.len() * rows) as f64;
        let weight = c.aux_loss_coef * c.experts as f64 / (count * count);
        b.scale("aux_loss", total, weight).map(Some)
    }

    fn build_inner(&self, b: &mut GraphBuilder, n: usize) -> autopar_graph::Result<(NodeId, NodeId, NodeId, NodeId)> {
        let c = &self.cfg;
        let t = c.context;
        let tokens = b.input("tokens", &[n, t], DType::I64)?;
        let labels = b.input("labels", &[n, t], DType::I64)?;
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        let wte = b.parameter("model.embed_tokens.weight", &[c.vocab, c.width], init.clone())?;
        let tok = b.gather("model.embed_tokens.gather", wte, tokens, 0)?;
        let mut h = b.reshape("model.embed_tokens.flat", tok, &[(n * t) as i64, c.width as i64])?;
        let mut balance = Vec::new();
        for i in 0..c.layers {
            h = self.block(b, i, h, n, &mut balance)?;
        }
        let h = self.norm(b, "model.norm", h)?;
        let head = if c.tie_embeddings { wte } else { b.parameter("lm_head.weight", &[c.vocab, c.width], init)? };
        let logits = b.matmul_t("lm_head.matmul", h, head, false, true)?;
        let flat_labels = b.reshape("labels.flat", labels, &[(n * t) as i64])?;
        let mut loss = b.softmax_cross_entropy("loss", logits, flat_labels)?;
        if let Some(aux) = self.balance_loss(b, &balance, n * t)? {
            loss = b.add("loss.with_aux", loss, aux)?;
        }
        b.output(loss)?;
        b.output(logits)?;
        Ok((tokens, labels, logits, loss))
    }
}

impl Model for Llama {
    fn name(&self) -> &str {
        if self.cfg.experts > 0 {
            "moe"
        } else {
            "llama"
        }
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
        let tied = if c.tie_embeddings { ", tied embeddings" } else { "" };
        let capacity = if c.capacity_factor > 0.0 { format!(", capacity factor {}", c.capacity_factor) } else { String::new() };
        let experts = if c.experts > 0 { format!(", {} experts, top {}{capacity}", c.experts, c.top_k) } else { String::new() };
        format!(
            "{} (vocab {}, context {}, width {}, {} heads, {} key/value heads, {} blocks, MLP {}{experts}, rope theta {}{tied})",
            self.name(),
            c.vocab,
            c.context,
            c.width,
            c.heads,
            c.kv_heads,
            c.layers,
            c.ffn_width,
            c.rope_theta
        )
    }
    fn build(&self, b: &mut GraphBuilder, batch: usize, mode: Mode) -> Result<ModelGraph> {
        positive(self.name(), "batch size", batch)?;
        let start = b.graph().len();
        let name = self.name().to_string();
        let (x, labels, logits, loss) = self.build_inner(b, batch).model(&name)?;
        Ok(ModelGraph::collect(&name, b, start, mode, [x, labels, logits, loss]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> LlamaConfig {
        LlamaConfig { vocab: 11, context: 6, width: 16, heads: 4, kv_heads: 2, layers: 2, ffn_width: 24, ..LlamaConfig::default() }
    }

    #[test]
    fn parameter_names_and_shapes_are_transformers_own() {
        let c = small();
        let (g, m) = Llama::new(c.clone()).unwrap().build_graph(3, Mode::Train, 0).unwrap();
        let shape = |n: &str| g.node(m.params[n]).ty.shape.clone();
        assert_eq!(shape("model.embed_tokens.weight"), vec![11, 16]);
        assert_eq!(shape("model.layers.1.self_attn.q_proj.weight"), vec![16, 16]);
        assert_eq!(shape("model.layers.1.self_attn.k_proj.weight"), vec![8, 16]);
        assert_eq!(shape("model.layers.1.self_attn.v_proj.weight"), vec![8, 16]);
        assert_eq!(shape("model.layers.1.self_attn.o_proj.weight"), vec![16, 16]);
        assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), vec![24, 16]);
        assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), vec![16, 24]);
        assert_eq!(shape("model.layers.0.input_layernorm.weight"), vec![16]);
        assert_eq!(shape("model.norm.weight"), vec![16]);
        assert_eq!(shape("lm_head.weight"), vec![11, 16]);
        let (d, f, kvd) = (16, 24, 8);
        let per_block = 2 * d * d + 2 * kvd * d + 3 * d * f + 2 * d;
        assert_eq!(m.parameter_count(&g).trainable, 2 * 11 * d + c.layers * per_block + d);
        // Two query heads per key/value head: [N, KV, G, T, d].
        assert_eq!(g.node(m.ops["model.layers.0.self_attn.attention"]).ty.shape, vec![3, 2, 2, 6, 4]);
        assert!(!m.params.contains_key("causal_mask"));
        assert_eq!(g.node(m.logits).ty.shape, vec![18, 11]);
    }

    #[test]
    fn bad_sizes_name_their_field() {
        let field = |c: LlamaConfig| match Llama::new(c) {
            Err(ModelError::BadConfig { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(LlamaConfig { kv_heads: 3, ..small() }), "kv_heads");
        assert_eq!(field(LlamaConfig { heads: 3, ..small() }), "heads");
        assert_eq!(field(LlamaConfig { width: 12, heads: 4, kv_heads: 1, ..small() }), "heads"); // head size 3
        assert_eq!(field(LlamaConfig { rope_theta: 1.0, ..small() }), "rope_theta");
        assert_eq!(field(LlamaConfig { ffn_width: 0, ..small() }), "ffn_width");
        assert_eq!(field(LlamaConfig { rms_eps: 0.0, ..small() }), "rms_eps");
        assert_eq!(field(LlamaConfig { aux_loss_coef: 0.1, ..small() }), "aux_loss_coef"); // no experts
        assert_eq!(field(LlamaConfig { aux_loss_coef: -1.0, experts: 2, top_k: 1, ..small() }), "aux_loss_coef");
        assert_eq!(field(LlamaConfig { capacity_factor: 1.5, ..small() }), "capacity_factor"); // no experts
        assert_eq!(field(LlamaConfig { capacity_factor: f64::NAN, experts: 2, top_k: 1, ..small() }), "capacity_factor");
    }

    #[test]
    fn a_mixture_of_experts_has_mixtrals_names_and_routes_each_token_to_top_k() {
        let cfg = LlamaConfig { experts: 3, top_k: 2, ..small() };
        let model = Llama::new(cfg.clone()).unwrap();
        assert_eq!(model.name(), "moe");
        let (g, m) = model.build_graph(2, Mode::Train, 0).unwrap();
        let shape = |n: &str| g.node(m.params[n]).ty.shape.clone();
        assert_eq!(shape("model.layers.0.block_sparse_moe.gate.weight"), vec![3, 16]);
        assert_eq!(shape("model.layers.1.block_sparse_moe.experts.2.w1.weight"), vec![24, 16]);
        assert_eq!(shape("model.layers.1.block_sparse_moe.experts.2.w3.weight"), vec![24, 16]);
        assert_eq!(shape("model.layers.1.block_sparse_moe.experts.2.w2.weight"), vec![16, 24]);
        assert!(!m.params.keys().any(|k| k.contains("mlp.")), "no dense MLP");
        let router = &g.node(m.ops["model.layers.0.block_sparse_moe.router.top_k"]).op;
        assert!(matches!(router, autopar_graph::OpKind::RouterTopK(r) if r.k == 2 && r.renormalize && r.capacity.is_none()));
        // MindSpore's capacity: ceil(top_k x tokens x factor / experts), here 2 x (2 x 6) x 1.3 / 3.
        let rows = 2 * cfg.context;
        let (g, m) = Llama::new(LlamaConfig { capacity_factor: 1.3, ..cfg.clone() }).unwrap().build_graph(2, Mode::Train, 0).unwrap();
        let router = &g.node(m.ops["model.layers.0.block_sparse_moe.router.top_k"]).op;
        let want = ((2 * rows) as f64 * 1.3 / 3.0).ceil() as usize;
        assert!(matches!(router, autopar_graph::OpKind::RouterTopK(r) if r.capacity == Some(want)), "{router:?}, want {want}");
        let err = Llama::new(LlamaConfig { top_k: 4, ..cfg }).unwrap_err();
        assert!(matches!(err, ModelError::BadConfig { field: "top_k", .. }), "{err}");
    }
}
