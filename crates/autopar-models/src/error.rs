//! The one error type of this crate.

use autopar_graph::GraphError;
use thiserror::Error;

/// What can go wrong while choosing, configuring or building a model.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelError {
    /// The name given is not one of the zoo's models (`MODEL_NAMES`).
    #[error("unknown model {name:?}\n  valid models: {valid}\n  hint: pass one of the valid names, e.g. `model=resnet18`")]
    UnknownModel {
        /// The name that was asked for.
        name: String,
        /// The valid model names, comma-separated.
        valid: String,
    },

    /// A configuration value is out of range or malformed (a zero size, a wrong input shape, ...).
    #[error("model {model}: {field} = {value} is invalid; expected {expected}")]
    BadConfig {
        /// The model's CLI name.
        model: String,
        /// The configuration field or option at fault (`width`, `input_shape`).
        field: &'static str,
        /// The value that was given, as text.
        value: String,
        /// What was expected, in words.
        expected: String,
    },

    /// An option was given that the chosen model does not take (e.g. `heads` for a ResNet).
    #[error("model {model}: option {option} does not apply to this model\n  hint: {model} takes {accepted}")]
    UnusedOption {
        /// The model's CLI name.
        model: String,
        /// The option that does not apply.
        option: &'static str,
        /// The options the model does take, in words.
        accepted: &'static str,
    },

    /// The model built no op of that name (see `ModelGraph::ops`).
    #[error("model {model}: no op named {name:?}\n  hint: ModelGraph::ops lists the op names this model builds")]
    UnknownOp {
        /// The model's CLI name.
        model: String,
        /// The op name that was looked up.
        name: String,
    },

    /// Building or annotating the model's graph failed.
    /// (Its text includes the graph's error, so that error is not also given as its cause.)
    #[error("model {model}: {error}")]
    Graph {
        /// The model's CLI name.
        model: String,
        /// The graph builder's error.
        error: Box<GraphError>,
    },
}

/// `std::result::Result` with [`ModelError`] as the default error type.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Attaches the model's name to a graph error.
pub(crate) trait GraphContext<T> {
    fn model(self, model: &str) -> Result<T>;
}

impl<T> GraphContext<T> for std::result::Result<T, GraphError> {
    fn model(self, model: &str) -> Result<T> {
        self.map_err(|error| ModelError::Graph { model: model.to_string(), error: Box::new(error) })
    }
}
