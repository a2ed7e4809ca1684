//! curate: turns raw image-text collections into training-ready Parquet — ingest the published
//! formats (CC3M, img2dataset, YFCC100M/15M, ImageNet-21k, generic tables), apply the
//! Bag-of-Words caption deformations of "A Fistful of Words", and report what was done.
//!
//! The data path: `cli` → `pipeline` → `stages` → (`text`, `io`, `schema`); `pipeline` writes
//! the `report` from its plan and run summary. The encoder stages (`encode_text`,
//! `encode_image`, `mine_pseudo_bow`) use `models`; `curate train` and `curate eval` are
//! `train` (with `losses`) and `eval`.
//!
//! The documentation is written for developers of curate: read it with
//! `cargo doc --no-deps --document-private-items`, where the links to private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

/// A line to stderr (messages, warnings, progress lines). Unlike `eprintln!` it never panics: a
/// closed stderr (`curate run ... 2>&1 | head -1`) must not stop a run half-way.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Text to stdout (tables of figures); as [`say!`], a closed stdout is no panic. `outln!` ends
/// the line.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

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
