//! Progress on stderr: one bar per pass over the input, with rows, rows/s and ETA (a spinner
//! while the row count is still unknown). Hidden unless enabled (`--progress`), so logs and
//! pipes stay clean.

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    enabled: bool,
    total_passes: usize,
}

/// The bar of one pass (a no-op when progress is off).
pub struct PassBar(Option<ProgressBar>);

impl Progress {
    pub fn new(enabled: bool, total_passes: usize) -> Self {
        Progress { enabled, total_passes }
    }

    pub fn pass(&self, no: usize, label: &str, total_rows: Option<u64>) -> PassBar {
        if !self.enabled {
            return PassBar(None);
        }
        let bar = match total_rows {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template(
                    "{prefix} {msg} [{bar:30}] {human_pos}/{human_len} rows, {per_sec}, eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            ),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{prefix} {msg} {spinner} {human_pos} rows, {per_sec}, {elapsed}")
                    .expect("valid template"),
            ),
        };
        bar.set_prefix(format!("[{no}/{}]", self.total_passes));
        bar.set_message(label.to_owned());
        PassBar(Some(bar))
    }
}

impl PassBar {
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            let rate = b.per_sec();
            b.finish_with_message(format!("{} done ({} rows/s)", b.message(), HumanCount(rate as u64)));
        }
    }
}
