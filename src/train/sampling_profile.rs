//! `curate train --sample-profile FILE`: a sampling profile of the process's threads over
//! training steps 4 to 10 of a run (after the first steps, which compile the GPU kernels), written
//! as text. It shows where a step that waits on the host spends its time, per thread: on a GPU,
//! the main thread (which issues the operations) and cubecl's device thread (`DSD-…`, which
//! launches kernels and copies data). Sampling needs the `sampling-profile` build feature (the
//! pprof crate, which samples with SIGPROF); the report itself is plain Rust ([`report`]).
//!
//! It found the 2 s host-side block of a batch-128 ResNet-50 step on a GPU (README, "GPU
//! build"): half the device thread's samples in a host-to-device copy, the main thread's in
//! building a padded tensor on the host.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The first and the last step of this process that are sampled (1-based, counted from the
/// process's first step, so a resumed run is sampled alike).
pub const STEPS: (u64, u64) = (4, 10);

/// Samples per second of CPU time.
#[cfg(feature = "sampling-profile")]
const FREQUENCY: i32 = 997;

/// The sampler of one run: started before step [`STEPS`]`.0`, written after step `STEPS.1` (or
/// at the end of a shorter run, with what it has).
pub struct Sampler {
    path: PathBuf,
    steps: u64,
    #[cfg(feature = "sampling-profile")]
    guard: Option<pprof::ProfilerGuard<'static>>,
}

impl Sampler {
    /// A sampler writing to `path`; an error where this build cannot sample.
    pub fn new(path: PathBuf) -> Result<Sampler> {
        if cfg!(not(feature = "sampling-profile")) {
            return Err(Error::Data {
                message: "`--sample-profile` needs a build with the `sampling-profile` feature".into(),
                hint: Some(format!(
                    "cargo build --release --features {}sampling-profile (README, \"GPU build\", for cuda)",
                    if cfg!(feature = "cuda") { "cuda," } else { "" }
                )),
            });
        }
        Ok(Sampler {
            path,
            steps: 0,
            #[cfg(feature = "sampling-profile")]
            guard: None,
        })
    }

    /// Called as each step of this process starts.
    pub fn step_starts(&mut self) -> Result<()> {
        self.steps += 1;
        if self.steps == STEPS.0 {
            self.start()?;
        } else if self.steps == STEPS.1 + 1 {
            self.write()?;
        }
        Ok(())
    }

    /// Called when the run ends: writes the report if sampling started and is not written yet.
    pub fn finish(&mut self) -> Result<()> {
        self.write()
    }

    #[cfg(feature = "sampling-profile")]
    fn start(&mut self) -> Result<()> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            .build()
            .map_err(|e| Error::data(format!("cannot start the sampling profile: {e}")))?;
        self.guard = Some(guard);
        Ok(())
    }

    #[cfg(not(feature = "sampling-profile"))]
    fn start(&mut self) -> Result<()> {
        Ok(())
    }

    #[cfg(feature = "sampling-profile")]
    fn write(&mut self) -> Result<()> {
        let Some(guard) = self.guard.take() else { return Ok(()) };
        let profile =
            guard.report().build().map_err(|e| Error::data(format!("cannot read the sampling profile: {e}")))?;
        let stacks: Vec<Stack> = profile
            .data
            .iter()
            .map(|(frames, &count)| Stack {
                thread: frames.thread_name.clone(),
                frames: frames.frames.iter().flat_map(|f| f.iter().map(|s| s.name())).collect(),
                samples: count.max(0) as u64,
            })
            .collect();
        let steps = self.steps.min(STEPS.1) + 1 - STEPS.0;
        let text = format!(
            "sampling profile of {steps} training steps, {FREQUENCY} samples per CPU-second\n{}",
            report(&stacks)
        );
        std::fs::write(&self.path, text).map_err(|e| Error::io("cannot write the sampling profile", &self.path, e))
    }

    #[cfg(not(feature = "sampling-profile"))]
    fn write(&mut self) -> Result<()> {
        let _ = &self.path;
        Ok(())
    }
}

/// One sampled call stack: its thread, its frames innermost first, and how often it was seen.
#[derive(Debug, Clone)]
pub struct Stack {
    pub thread: String,
    pub frames: Vec<String>,
    pub samples: u64,
}

/// Rows per list in [`report`].
const TOP: usize = 40;

/// The report of `stacks`: the threads by samples; for each of the four busiest, the functions
/// by samples of their own (the innermost frame) and by samples under them (any frame, once per
/// stack); then the most sampled stacks. Threads of the same name (rayon's workers) are one.
pub fn report(stacks: &[Stack]) -> String {
    let mut per_thread: HashMap<&str, u64> = HashMap::new();
    let mut own: HashMap<(&str, &str), u64> = HashMap::new();
    let mut under: HashMap<(&str, &str), u64> = HashMap::new();
    for s in stacks {
        *per_thread.entry(&s.thread).or_default() += s.samples;
        if let Some(leaf) = s.frames.first() {
            *own.entry((&s.thread, leaf)).or_default() += s.samples;
        }
        let mut seen = HashSet::new();
        for f in &s.frames {
            if seen.insert(f.as_str()) {
                *under.entry((&s.thread, f)).or_default() += s.samples;
            }
        }
    }
    let threads = by_count(per_thread.into_iter().collect());
    let total: u64 = threads.iter().map(|t| t.1).sum();
    let mut out = format!("{total} samples; by thread:\n");
    for (t, n) in &threads {
        out += &format!("{n:>8}  {t}\n");
    }
    for (t, n) in threads.iter().take(4) {
        for (what, table) in [("own samples", &own), ("samples under the function", &under)] {
            out += &format!("\n== thread {t} ({n} samples): functions by {what}\n");
            let rows = by_count(table.iter().filter(|((tt, _), _)| tt == t).map(|((_, f), &c)| (*f, c)).collect());
            for (f, c) in rows.into_iter().take(TOP) {
                out += &format!("{c:>8}  {f}\n");
            }
        }
    }
    out += "\n== the most sampled stacks (innermost frame first)\n";
    let mut order: Vec<&Stack> = stacks.iter().collect();
    order.sort_by(|a, b| {
        b.samples.cmp(&a.samples).then_with(|| a.thread.cmp(&b.thread)).then_with(|| a.frames.cmp(&b.frames))
    });
    for s in order.into_iter().take(TOP) {
        out += &format!("-- {} samples, thread {}\n", s.samples, s.thread);
        for f in &s.frames {
            out += &format!("     {f}\n");
        }
    }
    out
}

/// `rows` by count, highest first (ties by name, so the report is stable).
fn by_count(mut rows: Vec<(&str, u64)>) -> Vec<(&str, u64)> {
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(thread: &str, frames: &[&str], samples: u64) -> Stack {
        Stack { thread: thread.into(), frames: frames.iter().map(|f| f.to_string()).collect(), samples }
    }

    #[test]
    fn the_report_counts_own_and_inclusive_samples_per_thread() {
        let stacks = [
            stack("main", &["memcpy", "upload", "train"], 5),
            stack("main", &["launch", "forward", "train"], 3),
            stack("DSD-0-0", &["cuMemcpy", "write", "serve"], 7),
            stack("main", &["memcpy", "clone", "train"], 2),
            // A recursive frame counts once per stack under itself.
            stack("DSD-0-0", &["compile", "compile", "serve"], 1),
        ];
        let r = report(&stacks);
        // Rows are a right-aligned count, two spaces, the name.
        let rows = |rows: &[(u64, &str)]| rows.iter().map(|(c, f)| format!("{c:>8}  {f}\n")).collect::<String>();
        let section = |title: &str| {
            let start = r.find(title).unwrap_or_else(|| panic!("{title} in {r}"));
            let body = &r[start + title.len()..];
            body[..body.find("\n\n").map_or(body.len(), |i| i + 1)].to_string()
        };
        assert!(r.starts_with(&format!("18 samples; by thread:\n{}", rows(&[(10, "main"), (8, "DSD-0-0")]))), "{r}");
        let own = section("== thread main (10 samples): functions by own samples\n");
        assert_eq!(own, rows(&[(7, "memcpy"), (3, "launch")]));
        let under = section("== thread main (10 samples): functions by samples under the function\n");
        assert_eq!(
            under,
            rows(&[(10, "train"), (7, "memcpy"), (5, "upload"), (3, "forward"), (3, "launch"), (2, "clone")])
        );
        let dsd = section("== thread DSD-0-0 (8 samples): functions by samples under the function\n");
        assert_eq!(dsd, rows(&[(8, "serve"), (7, "cuMemcpy"), (7, "write"), (1, "compile")]));
        let top = "== the most sampled stacks (innermost frame first)\n-- 7 samples, thread DSD-0-0\n     cuMemcpy\n";
        assert!(r.contains(top), "{r}");
    }

    #[test]
    fn sampling_starts_at_the_fourth_step_and_writes_after_the_tenth() {
        let path = std::env::temp_dir().join(format!("curate-sampling-{}.txt", std::process::id()));
        let _ = std::fs::remove_file(&path);
        match Sampler::new(path.clone()) {
            Err(e) => {
                // Built without the feature: the flag is refused, naming the feature.
                let e = e.to_string();
                let names_the_build = e.contains("--features ") && e.contains("sampling-profile (README");
                assert!(cfg!(not(feature = "sampling-profile")) && names_the_build, "{e}");
            }
            Ok(mut s) => {
                for step in 1..=STEPS.1 {
                    s.step_starts().unwrap();
                    assert_eq!(s.steps, step);
                    assert!(!path.exists(), "written before step {}", STEPS.1 + 1);
                }
                s.step_starts().unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(text.starts_with("sampling profile of 7 training steps"), "{text}");
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
}
