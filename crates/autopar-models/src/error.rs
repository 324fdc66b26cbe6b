//! The one error type of this crate.

use autopar_graph::GraphError;
use thiserror::Error;

/// What can go wrong while choosing, configuring or building a model.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelError {
    #[error("unknown model {name:?}\n  valid models: {valid}\n  hint: pass one of the valid names, e.g. --model resnet18")]
    UnknownModel { name: String, valid: String },

    #[error("model {model}: {field} = {value} is invalid; expected {expected}")]
    BadConfig { model: String, field: &'static str, value: String, expected: String },

    #[error("model {model}: option {option} does not apply to this model\n  hint: {model} takes {accepted}")]
    UnusedOption { model: String, option: &'static str, accepted: &'static str },

    #[error("model {model}: no op named {name:?}\n  hint: ModelGraph::ops lists the op names this model builds")]
    UnknownOp { model: String, name: String },

    #[error("model {model}: {source}")]
    Graph {
        model: String,
        #[source]
        source: Box<GraphError>,
    },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Attaches the model's name to a graph error.
pub(crate) trait GraphContext<T> {
    fn model(self, model: &str) -> Result<T>;
}

impl<T> GraphContext<T> for std::result::Result<T, GraphError> {
    fn model(self, model: &str) -> Result<T> {
        self.map_err(|source| ModelError::Graph { model: model.to_string(), source: Box::new(source) })
    }
}
