//! `write_parquet`: the pipeline's output table, as Parquet shards under
//! `<output_dir>/<dir>/part-NNNNN.parquet`, plus `<output_dir>/rejects.parquet`. Every file is
//! written to a temporary name and renamed when complete; shards left from an earlier, larger
//! run are removed so the folder holds exactly this run's output.

use serde::{Deserialize, Serialize};

pub const TYPE: &str = "write_parquet";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteParquetConfig {
    /// Folder for the data shards, relative to `output_dir`.
    #[serde(default = "default_dir")]
    pub dir: String,
    /// Rows per shard file.
    #[serde(default = "default_rows_per_shard")]
    pub rows_per_shard: usize,
    /// Columns to write, in order; default: all.
    #[serde(default)]
    pub columns: Option<Vec<String>>,
}

fn default_dir() -> String {
    "data".into()
}
fn default_rows_per_shard() -> usize {
    1_000_000
}
