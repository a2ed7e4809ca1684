//! The run report: `report.json` (machine-readable), `report.md` (for people) and plots under
//! `plots/` — rows in/out, rejects by reason, and for the BoW stage the Fistful statistics
//! (Δ dataset size, mean words per caption before/after, vocabulary sizes, the removed top-`t`
//! words) with caption-length histograms and word rank–frequency plots before/after; for pseudo-BoW
//! mining the per-strategy class-word hit rates and example pseudo captions beside their images.

pub mod plot;

use std::fmt::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::io::write_atomic;
use crate::pipeline::execute::RunSummary;
use crate::pipeline::plan::Plan;
use crate::stages::bow::MAX_HIST_WORDS;

/// Every warning of a run, for `report.json` and the manifest: the run's own (see
/// [`RunSummary::warnings`]), then each stage's, named.
pub fn warnings(summary: &RunSummary, stages: &[(String, Value)]) -> Vec<String> {
    let mut out = summary.warnings();
    for (name, report) in stages {
        for w in report["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            out.push(format!("stage `{name}`: {w}"));
        }
    }
    out
}

/// The ends of the plot files' names (`{stage}_caption_length.svg`, ...): a run clears the
/// files in `plots/` with these names, and leaves the others.
pub const PLOT_SUFFIXES: [&str; 2] = ["_caption_length.svg", "_word_rank.svg"];

/// Writes the report files into `out`: `report.md`, `report.json` and, for the stages that
/// draw, `plots/*.svg`.
pub fn write(out: &Path, plan: &Plan, summary: &RunSummary, stages: &[(String, Value)]) -> Result<()> {
    // Created by the first stage that draws (a run without a BoW stage has no plots).
    let plots = out.join("plots");
    let mut md = String::new();
    let _ = writeln!(md, "# curate report: `{}`\n", plan.name);
    let _ = writeln!(md, "Pipeline file `{}`; output `{}`.\n", plan.pipeline_file.display(), plan.output_dir.display());
    let _ = writeln!(md, "| rows | count |\n| --- | ---: |");
    let _ = writeln!(md, "| read | {} |", summary.rows_read);
    let _ = writeln!(md, "| written | {} |", summary.rows_written);
    let _ = writeln!(md, "| rejected | {} |", summary.rejected());
    let _ = writeln!(md, "| skipped | {} |\n", summary.skipped.values().sum::<u64>());
    for w in summary.warnings() {
        let _ = writeln!(md, "**Warning:** {w}.\n");
    }
    if !summary.rejects.is_empty() || !summary.skipped.is_empty() {
        let _ = writeln!(md, "| stage/reason | rows |\n| --- | ---: |");
        for (k, v) in &summary.rejects {
            let _ = writeln!(md, "| rejected: `{k}` | {v} |");
        }
        for (k, v) in &summary.skipped {
            let _ = writeln!(md, "| skipped: `{k}` | {v} |");
        }
        let _ = writeln!(md, "\nRejected rows, with their reason and raw input, are in `rejects/`.\n");
    }

    // Each stage's type, by its name (the resolved config lists both).
    let types: std::collections::HashMap<&str, &str> = plan.resolved["stage"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|st| Some((st["name"].as_str()?, st["type"].as_str()?)))
        .collect();
    let mut stage_json = serde_json::Map::new();
    for (name, report) in stages {
        let mut report = report.clone();
        match types.get(name.as_str()).copied() {
            Some(crate::stages::bow::TYPE) => bow_section(&mut md, &plots, name, &mut report)?,
            Some(crate::stages::mine_pseudo_bow::TYPE) => pseudo_bow_section(&mut md, out, name, &report),
            _ => {}
        }
        stage_json.insert(name.clone(), report);
    }
    let doc = json!({
        "pipeline": plan.name,
        "rows": {
            "read": summary.rows_read,
            "written": summary.rows_written,
            "rejected": summary.rejected(),
            "skipped": summary.skipped.values().sum::<u64>(),
        },
        "warnings": warnings(summary, stages),
        "rejects_by_reason": summary.rejects,
        "skipped_by_reason": summary.skipped,
        "stages": stage_json,
    });
    let text = serde_json::to_string_pretty(&doc).expect("serializes") + "\n";
    write_atomic(&out.join("report.json"), text.as_bytes())?;
    write_atomic(&out.join("report.md"), md.as_bytes())
}

/// `word` as a Markdown code span, so that a word like `<b>` or `*a*` shows as written: fenced
/// by one backtick more than its longest run of them, padded where it starts or ends with one.
fn code_span(word: &str) -> String {
    let longest = word.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if word.starts_with('`') || word.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{word}{pad}{fence}")
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default()
}

/// `path` as seen from the folder `from` (both relative to the working directory or absolute),
/// for links in `report.md`; `path` unchanged when there is no relative form.
fn relative_to(from: &Path, path: &str) -> String {
    let (Ok(from), Ok(to)) = (std::path::absolute(from), std::path::absolute(path)) else { return path.to_owned() };
    let (a, b): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return path.to_owned();
    }
    let mut rel = std::path::PathBuf::new();
    for _ in common..a.len() {
        rel.push("..");
    }
    for c in &b[common..] {
        rel.push(c);
    }
    rel.to_string_lossy().into_owned()
}

/// Pseudo-BoW mining: settings, the per-strategy label-word hit rates and example captions
/// beside their images.
fn pseudo_bow_section(md: &mut String, out: &Path, name: &str, r: &Value) {
    let u = |k: &str| r[k].as_u64().unwrap_or(0);
    let _ = writeln!(md, "## Stage `{name}` (pseudo-BoW mining)\n");
    let _ = writeln!(
        md,
        "Run `{}` (frozen); aligned set: {} captions (`{}`), {} distinct content words; c = {} crops, \
         k = {} neighbours, p = {} words, strategy `{}`, Top_t = {}.\n",
        r["run"].as_str().unwrap_or(""),
        u("aligned_captions"),
        r["aligned_caption_column"].as_str().unwrap_or(""),
        u("aligned_vocabulary"),
        u("crops"),
        u("neighbors"),
        u("words"),
        r["strategy"].as_str().unwrap_or(""),
        u("top_words"),
    );
    let _ = writeln!(
        md,
        "- images in: {}, mined: {}, no candidate word: {}; mean words per caption {}",
        u("images_in"),
        u("images_mined"),
        u("no_candidate_word"),
        r["mean_words"].as_f64().map_or_else(|| "n/a".to_owned(), |m| format!("{m:.2}"))
    );
    let _ = writeln!(
        md,
        "- exact search: {:.0} crops/s ({:.2} s); crop embedding {:.2} s\n",
        r["crops_per_second_searched"].as_f64().unwrap_or(0.0),
        r["search_seconds"].as_f64().unwrap_or(0.0),
        r["crop_embed_seconds"].as_f64().unwrap_or(0.0)
    );
    let strategies = r["strategies"].as_object().cloned().unwrap_or_default();
    if u("labelled_images") > 0 {
        let _ = writeln!(
            md,
            "True class words (`{}`, kept aside) among the p words, {} labelled images:\n",
            r["label_column"].as_str().unwrap_or(""),
            u("labelled_images")
        );
        let _ =
            writeln!(md, "| strategy | a class word | all class words | no candidate |\n| --- | ---: | ---: | ---: |");
        for (s, v) in &strategies {
            let pct = |k: &str| 100.0 * v[k].as_f64().unwrap_or(f64::NAN);
            let mark = if Some(s.as_str()) == r["strategy"].as_str() { " (used)" } else { "" };
            let _ = writeln!(
                md,
                "| `{s}`{mark} | {:.1}% | {:.1}% | {} |",
                pct("label_word_hit_rate"),
                pct("all_label_words_rate"),
                v["no_candidate"].as_u64().unwrap_or(0)
            );
        }
        let _ = writeln!(md);
    }
    let examples = r["examples"].as_array().cloned().unwrap_or_default();
    if !examples.is_empty() {
        let names: Vec<String> = strategies.keys().cloned().collect();
        let _ = writeln!(md, "Examples (first images of the input):\n");
        let _ = write!(md, "| image | true class |");
        for n in &names {
            let _ = write!(md, " `{n}` |");
        }
        let _ = write!(md, "\n| --- | --- |");
        for _ in &names {
            let _ = write!(md, " --- |");
        }
        let _ = writeln!(md);
        for e in &examples {
            let id = e["sample_id"].as_str().unwrap_or("");
            let image = match e["image"].as_str() {
                Some(p) => format!("![{id}]({})<br>`{id}`", relative_to(out, p)),
                None => format!("`{id}`"),
            };
            let _ = write!(md, "| {image} | {} |", e["label"].as_str().unwrap_or(""));
            for n in &names {
                let _ = write!(md, " {} |", e["captions"][n].as_str().unwrap_or(""));
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
    }
}

/// Base captions below which the report says its figures are not the paper's (CC3M's 10% base
/// holds ~290k).
const PAPER_SCALE_BASE: u64 = 100_000;

/// The BoW statistics: Markdown section, plots, and the report JSON with the full
/// rank–frequency arrays replaced by log-spaced `[rank, count]` samples.
fn bow_section(md: &mut String, plots: &Path, name: &str, r: &mut Value) -> Result<()> {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let u = |k: &str| r[k].as_u64().unwrap_or(0);
    let _ = writeln!(md, "## Stage `{name}` (Bag-of-Words, mode `{}`)\n", r["mode"].as_str().unwrap_or(""));
    let operators = r["operators"].as_str().unwrap_or("").to_owned();
    let _ = writeln!(md, "Operators: {operators}; seed {}.\n", u("seed"));
    for w in r["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let _ = writeln!(md, "**Warning:** {w}\n");
    }
    // A mean (or Δ) over no caption is `null` in the JSON, "n/a" here.
    let mean = |k: &str, n: &str| if u(n) == 0 { "n/a".to_owned() } else { format!("{:.2}", f(k)) };
    let _ = writeln!(md, "| | before | after |\n| --- | ---: | ---: |");
    let _ = writeln!(md, "| captions | {} | {} |", u("captions_in"), u("captions_out"));
    let _ = writeln!(
        md,
        "| mean words per caption | {} | {} |",
        mean("mean_words_before", "captions_in"),
        mean("mean_words_after", "captions_out")
    );
    let _ = writeln!(md, "| vocabulary (distinct words) | {} | {} |\n", u("vocabulary_before"), u("vocabulary_after"));
    let delta = match u("captions_in") {
        0 => "n/a".to_owned(),
        _ => format!("{:+.1}%", 100.0 * f("delta_dataset_size")),
    };
    let only = r["mode"] == "only";
    let _ = writeln!(md, "- Δ dataset size: **{delta}**");
    let _ = writeln!(
        md,
        "- \"after\" is the whole output: {}the surviving deformed captions",
        if only { "" } else { "the base captions, intact, and " }
    );
    let base = if only { String::new() } else { format!("base captions kept intact: {}; ", u("base")) };
    let _ = writeln!(
        md,
        "- {base}deformed: {} in, {} out ({} emptied and dropped)",
        u("deformed_in"),
        u("deformed_out"),
        u("emptied")
    );
    let _ = writeln!(
        md,
        "- surviving deformed captions: {} words each on average, {} distinct words",
        mean("mean_words_deformed_after", "deformed_out"),
        u("vocabulary_deformed_after")
    );
    if !only {
        let _ = writeln!(
            md,
            "- base vocabulary: {} {}",
            u("base_vocabulary"),
            r["base_vocabulary_unit"].as_str().unwrap_or("words")
        );
    }
    // LimitToBaseVocab and RmTopFreq(t) act on the base set's words by count, not share: on a
    // sample, far fewer words survive than on CC3M, and the figures are not the paper's.
    let matched = operators.contains("LimitToBaseVocab") || operators.contains("RmTopFreq");
    if !only && matched && u("base") < PAPER_SCALE_BASE {
        let _ = writeln!(
            md,
            "- note: LimitToBaseVocab and RmTopFreq(t) depend on the base set's size in captions; with {} base \
             captions (CC3M's: ~290,000) Δ and words per caption are not comparable to the paper's tables",
            u("base")
        );
    }
    let top: Vec<String> = r["top_removed"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|w| {
                    Some(format!("{} ({})", code_span(w["word"].as_str()?), w["base_df"].as_u64().unwrap_or(0)))
                })
                .collect()
        })
        .unwrap_or_default();
    if !top.is_empty() {
        let shown: Vec<&str> = top.iter().take(100).map(String::as_str).collect();
        let more = if top.len() > shown.len() {
            format!(" … ({} in all; full list in `report.json`)", top.len())
        } else {
            String::new()
        };
        let unit = r["base_vocabulary_unit"].as_str().unwrap_or("words");
        let _ = writeln!(
            md,
            "- removed top-{} {unit}, most frequent first (base captions holding it): {}{more}",
            top.len(),
            shown.join(", ")
        );
    }
    std::fs::create_dir_all(plots).map_err(|e| Error::io("cannot create folder", plots, e))?;
    let (hb, ha) = (u64s(&r["length_histogram_before"]), u64s(&r["length_histogram_after"]));
    let svg = plot::histogram(
        &format!("Caption length ({name})"),
        &operators,
        "words per caption",
        &[("before", &hb), ("after", &ha)],
        Some(MAX_HIST_WORDS),
    );
    let p = plots.join(format!("{name}{}", PLOT_SUFFIXES[0]));
    write_atomic(&p, svg.as_bytes())?;
    let (fb, fa) = (u64s(&r["rank_frequency_before"]), u64s(&r["rank_frequency_after"]));
    let fd = u64s(&r["rank_frequency_deformed_after"]);
    // In "mostly" mode "after" holds the intact base captions too: the deformed ones alone show
    // what the operators did. (In "only" mode they are all of "after".)
    let mut series = vec![("before", fb.as_slice()), ("after", fa.as_slice())];
    if !only {
        series.push(("deformed only", fd.as_slice()));
    }
    let svg = plot::rank_frequency(&format!("Word rank–frequency ({name})"), &operators, &series);
    let q = plots.join(format!("{name}{}", PLOT_SUFFIXES[1]));
    write_atomic(&q, svg.as_bytes())?;
    let _ = writeln!(md, "\n![caption length](plots/{name}_caption_length.svg)\n");
    if hb.len().max(ha.len()) > MAX_HIST_WORDS {
        let _ = writeln!(md, "(The last bin, {MAX_HIST_WORDS}+, counts captions of {MAX_HIST_WORDS} words or more.)\n");
    }
    let _ = writeln!(md, "![word rank](plots/{name}_word_rank.svg)\n");
    for (key, counts) in
        [("rank_frequency_before", fb), ("rank_frequency_after", fa), ("rank_frequency_deformed_after", fd)]
    {
        let sampled: Vec<[u64; 2]> =
            plot::log_ranks(counts.len()).into_iter().map(|rk| [rk as u64, counts[rk - 1]]).collect();
        r[key] = json!(sampled);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::code_span;

    /// Removed words are shown as written in `report.md`: `<b>` is no HTML tag, `*a*` no
    /// emphasis, and a word with backticks gets a longer fence (CommonMark code spans).
    #[test]
    fn removed_words_are_code_spans_that_show_any_word_as_written() {
        assert_eq!(code_span("dog"), "`dog`");
        assert_eq!(code_span("<b>"), "`<b>`");
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("a``b`"), "``` a``b` ```");
        assert_eq!(code_span("`"), "`` ` ``");
    }
}
