//! Pipelines: a TOML file of stages, compiled into a checked [`plan::Plan`] before any data is
//! read, then executed in streaming passes. `config` holds the file and its `--set`
//! overrides with locations, `plan` the compiler, `execute` the runner, `checkpoint` the
//! resuming of a killed run, `progress` the bars, `introspect` the key names of each stage's
//! config (for "did you mean").

pub mod checkpoint;
pub mod config;
pub mod execute;
pub mod introspect;
pub mod plan;
pub mod progress;

pub use execute::{run, RunOptions, RunSummary};
pub use plan::{compile, Plan};
