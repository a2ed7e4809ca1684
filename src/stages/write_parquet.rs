//! `write_parquet`: the settings of the pipeline's output table — its folder under
//! `output_dir`, the rows per shard (of the data and of `rejects/`) and the columns. The shards
//! are written by `io::parquet::ShardedWriter` (temporary name, renamed when complete), and an
//! earlier run's output is cleared by `pipeline::execute`.

use serde::{Deserialize, Serialize};

pub const TYPE: &str = "write_parquet";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteParquetConfig {
    /// Folder for the data shards, relative to `output_dir` (not one of [`RESERVED_DIRS`],
    /// which the run fills itself).
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

/// The folder of `output_dir` a run moves an earlier run's shards into, and deletes while it
/// runs.
pub const STALE_DIR: &str = ".curate-stale";

/// Folders of `output_dir` the run fills itself, and what it puts there: the data cannot go
/// there.
pub const RESERVED_DIRS: [(&str, &str); 3] = [
    ("rejects", "writes its rejects"),
    ("plots", "writes its plots"),
    (STALE_DIR, "moves an earlier run's shards, and deletes them,"),
];

impl WriteParquetConfig {
    /// Why `dir` cannot hold the data shards, if it cannot: it must be a plain relative folder
    /// inside `output_dir`, apart from the folders and files the run writes itself.
    pub fn dir_problem(&self) -> Option<String> {
        let path = std::path::Path::new(&self.dir);
        let plain = path.components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if self.dir.trim().is_empty() || !plain {
            return Some(format!("`dir` must be a folder inside `output_dir` (like `data`), got {:?}", self.dir));
        }
        if let Some(long) = path.components().map(|c| c.as_os_str()).find(|c| c.len() > 255) {
            return Some(format!(
                "`dir` has a folder name of {} bytes (`{}…`), over the 255 a name may have",
                long.len(),
                long.to_string_lossy().chars().take(16).collect::<String>()
            ));
        }
        let first = path.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned());
        let first = first.as_deref();
        if let Some(file) = crate::pipeline::execute::RUN_FILES.iter().find(|f| first == Some(**f)) {
            return Some(format!("`dir` cannot be `{file}`: the run writes its file `{file}` there"));
        }
        RESERVED_DIRS
            .iter()
            .find(|(r, _)| first == Some(*r))
            .map(|(r, what)| format!("`dir` cannot be `{r}`: the run {what} there"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_goes_to_a_plain_folder_of_its_own() {
        let problem =
            |dir: &str| WriteParquetConfig { dir: dir.into(), rows_per_shard: 1, columns: None }.dir_problem();
        for ok in ["data", "out/bow_data", "rejected"] {
            assert_eq!(problem(ok), None, "{ok}");
        }
        for bad in ["", " ", "/abs/data", "../data", "a/../b", "./data"] {
            assert!(problem(bad).is_some_and(|p| p.contains("must be a folder inside")), "{bad:?}");
        }
        assert_eq!(problem(&"d".repeat(255)), None);
        let long = format!("data/{}", "d".repeat(256));
        assert!(problem(&long).is_some_and(|p| p.contains("a folder name of 256 bytes")), "{long}");
        for reserved in [
            "rejects",
            "plots",
            "plots/x",
            ".curate-stale",
            ".curate-stale/data",
            "config.json",
            "manifest.json/x",
            "report.json",
            "report.md",
            ".curate-checkpoint",
        ] {
            assert!(problem(reserved).is_some_and(|p| p.contains("cannot be")), "{reserved}");
        }
    }
}
