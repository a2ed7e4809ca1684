//! curate: turns raw image-text collections into training-ready Parquet — ingest the published
//! formats (CC3M, img2dataset, YFCC100M/15M, ImageNet-21k, generic tables), apply the
//! Bag-of-Words caption deformations of "A Fistful of Words", and report what was done.
//!
//! Dependencies point one way: `cli` → `pipeline` → `stages` → (`text`, `io`, `schema`).

pub mod bench;
pub mod cli;
pub mod error;
pub mod eval;
pub mod io;
pub mod knn;
pub mod losses;
pub mod models;
pub mod pipeline;
pub mod report;
pub mod rng;
pub mod schema;
pub mod stages;
pub mod text;
pub mod train;

pub use error::{Error, Result};
