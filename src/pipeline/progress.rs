//! Progress on stderr: one bar per pass over the input, with rows, rows/s and ETA (a spinner
//! while the row count is still unknown). On where stderr is a terminal (`--progress auto`,
//! the default), off in pipes and logs so they stay clean; with `--progress always` where
//! stderr is not a terminal (a log file, a Slurm job), it writes a plain line every
//! [`LOG_EVERY`] and one when each pass ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Time between two lines of progress in a log.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    enabled: bool,
    terminal: bool,
    total_passes: usize,
}

/// The bar of one pass (a no-op when progress is off).
pub struct PassBar(Option<Shown>);

enum Shown {
    Bar(ProgressBar, Mutex<Since>),
    Log(LogLines),
}

/// Where a pass's rate is counted from: its start, or, in a resumed run, the first row it
/// does not take over from the killed run (those rows came at the speed of a read alone).
#[derive(Clone, Copy)]
struct Since {
    rows: u64,
    at: Instant,
}

impl Since {
    fn rate(&self, rows: u64) -> (u64, f64) {
        let secs = self.at.elapsed().as_secs_f64();
        ((rows.saturating_sub(self.rows) as f64 / secs.max(1e-9)) as u64, secs)
    }
}

/// Progress of one pass as lines of text.
struct LogLines {
    prefix: String,
    label: String,
    total: Option<u64>,
    rows: AtomicU64,
    since: Mutex<Since>,
    last: Mutex<Instant>,
}

impl LogLines {
    fn line(&self, done: bool) -> String {
        let rows = self.rows.load(Ordering::Relaxed);
        let (rate, secs) = self.since.lock().expect("progress lock").rate(rows);
        let rate = HumanCount(rate);
        let of = self.total.map(|t| format!("/{}", HumanCount(t))).unwrap_or_default();
        let state = if done { "done" } else { "at" };
        format!("{} {}: {state} {}{of} rows, {rate} rows/s, {secs:.1} s", self.prefix, self.label, HumanCount(rows))
    }
}

/// `{rate}`: rows per second, whole.
fn rate(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = write!(w, "{} rows/s", HumanCount(state.per_sec() as u64));
}

impl Progress {
    pub fn new(enabled: bool, total_passes: usize) -> Self {
        Progress { enabled, terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()), total_passes }
    }

    pub fn pass(&self, no: usize, label: &str, total_rows: Option<u64>) -> PassBar {
        if !self.enabled {
            return PassBar(None);
        }
        let prefix = format!("[{no}/{}]", self.total_passes);
        if !self.terminal {
            let now = Instant::now();
            return PassBar(Some(Shown::Log(LogLines {
                prefix,
                label: label.to_owned(),
                total: total_rows,
                rows: AtomicU64::new(0),
                since: Mutex::new(Since { rows: 0, at: now }),
                last: Mutex::new(now),
            })));
        }
        let template = match total_rows {
            Some(_) => "{prefix} {msg} [{bar:30}] {human_pos}/{human_len} rows, {rate}, eta {eta}",
            None => "{prefix} {msg} {spinner} {human_pos} rows, {rate}, {elapsed}",
        };
        let style = ProgressStyle::with_template(template)
            .expect("valid template")
            .with_key("rate", rate)
            .progress_chars("=> ");
        // Everything is set before the bar is first drawn.
        let bar = ProgressBar::hidden();
        bar.set_length(total_rows.unwrap_or(0));
        if total_rows.is_none() {
            bar.unset_length();
        }
        bar.set_style(style);
        bar.set_prefix(prefix);
        bar.set_message(label.to_owned());
        bar.set_draw_target(ProgressDrawTarget::stderr());
        PassBar(Some(Shown::Bar(bar, Mutex::new(Since { rows: 0, at: Instant::now() }))))
    }

    /// A pass that turned out not to be needed: said so, in its place in the count.
    pub fn skipped(&self, no: usize, label: &str, why: &str) {
        if self.enabled {
            say!("[{no}/{}] {label}: not needed ({why})", self.total_passes);
        }
    }
}

impl PassBar {
    /// The rows so far were taken over from a killed run: the rate counts from here.
    pub fn rate_from_here(&self) {
        match &self.0 {
            Some(Shown::Bar(b, since)) => {
                *since.lock().expect("progress lock") = Since { rows: b.position(), at: Instant::now() };
                b.reset_eta();
            }
            Some(Shown::Log(l)) => {
                *l.since.lock().expect("progress lock") =
                    Since { rows: l.rows.load(Ordering::Relaxed), at: Instant::now() };
            }
            None => {}
        }
    }

    pub fn inc(&self, n: u64) {
        match &self.0 {
            Some(Shown::Bar(b, _)) => b.inc(n),
            Some(Shown::Log(l)) => {
                l.rows.fetch_add(n, Ordering::Relaxed);
                let mut last = l.last.lock().expect("progress lock");
                if last.elapsed() >= LOG_EVERY {
                    *last = Instant::now();
                    say!("{}", l.line(false));
                }
            }
            None => {}
        }
    }

    pub fn finish(&self) {
        match &self.0 {
            Some(Shown::Bar(b, since)) => {
                let secs = b.elapsed().as_secs_f64();
                let (rate, _) = since.lock().expect("progress lock").rate(b.position());
                let line = format!("{} rows in {secs:.1} s ({} rows/s)", HumanCount(b.position()), HumanCount(rate));
                b.set_style(ProgressStyle::with_template("{prefix} {msg}").expect("valid template"));
                b.finish_with_message(format!("{}: {line}", b.message()));
            }
            Some(Shown::Log(l)) => say!("{}", l.line(true)),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_gets_lines_with_rows_and_a_whole_rate() {
        let p = Progress { enabled: true, terminal: false, total_passes: 3 };
        let bar = p.pass(2, "bow: fit pass 2", Some(1_000_000));
        let Some(Shown::Log(log)) = &bar.0 else { panic!("a log, not a bar, where stderr is no terminal") };
        bar.inc(123_456);
        let line = log.line(false);
        assert!(line.starts_with("[2/3] bow: fit pass 2: at 123,456/1,000,000 rows, "), "{line}");
        let rate = line.split(", ").nth(1).unwrap();
        assert!(rate.ends_with(" rows/s") && !rate.contains('.'), "whole rows/s: {line}");
        assert!(log.line(true).contains(": done 123,456/1,000,000 rows"));
        // Rows taken over from a killed run count in the position, not in the rate.
        bar.rate_from_here();
        let line = log.line(false);
        assert!(line.contains("at 123,456/1,000,000 rows, 0 rows/s"), "{line}");
        // Off: nothing at all.
        let off = Progress { enabled: false, terminal: false, total_passes: 3 };
        assert!(off.pass(1, "x", None).0.is_none());
    }
}
