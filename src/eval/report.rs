//! What `curate eval` writes into its output folder, once the evaluation is done: `config.json`
//! (the inputs), `metrics.json` (metric name, as the eccv-caption package names it, -> `{"i2t": x,
//! "t2i": y}`, fractions as the package returns them, `null` where a protocol had no queries),
//! `metrics.md` (the same values x100 in a table, with counts and timings) and
//! `recall_at_k.svg` (COCO 5K and CxC recall@K curves, drawn with [`crate::report::plot`]).
//!
//! A trained run's zero-shot scores (`curate eval RUN_DIR`) are one more top-level key,
//! `"zeroshot": {"top1", "top2", "top5", "top10", "classes"}`, after the retrieval metrics, so
//! every other key keeps the `{"i2t", "t2i"}` shape; in the table they are rows `zeroshot_top1`
//! … `zeroshot_top10` with the value in the i2t column (an image ranks the class prompts).
//!
//! CUSA's uni-modal scores (`--uni-images`, `--sts`) are the last top-level key, `"unimodal":
//! {"heads": "uni" | "cross", "image_r1": x, "image_protocol": .., "image_queries": n, ..,
//! "sts_spearman": ρ, "sts_pairs": n, ..}` ([`super::unimodal::UniModalMetrics`]), and a table of
//! their own in `metrics.md` (and on stdout). An evaluation of uni-modal tables alone has no
//! retrieval metrics: no retrieval table and no `recall_at_k.svg`.
//!
//! The linear probe (`--probe`) comes after them, `"linear_probe": {"accuracy": x,
//! "mean_per_class_accuracy": y, "metric": .., "wd": .., ..}`
//! ([`super::linear_probe::ProbeMetrics`]), with a table of its own, and OTTER's
//! compositionality benchmark (`--compose`) last, `"compositionality": {"or", "ior", "tor",
//! "random_or", ..}` ([`super::compositionality::ComposeMetrics`]).

use std::fmt::Write;
use std::path::Path;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::compositionality::ComposeMetrics;
use super::linear_probe::ProbeMetrics;
use super::unimodal::UniModalMetrics;
use super::{Evaluation, Pair, ZeroShotMetrics};
use crate::error::{Error, Result};
use crate::io::write_atomic;

/// The metrics in report order as one JSON object, then the zero-shot, the uni-modal and the
/// linear-probe scores if any.
struct Ordered<'a>(
    &'a [(String, Pair)],
    Option<&'a ZeroShotMetrics>,
    Option<&'a UniModalMetrics>,
    Option<&'a ProbeMetrics>,
    Option<&'a ComposeMetrics>,
);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(
            self.0.len()
                + [self.1.is_some(), self.2.is_some(), self.3.is_some(), self.4.is_some()]
                    .map(usize::from)
                    .iter()
                    .sum::<usize>(),
        ))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        if let Some(z) = self.1 {
            m.serialize_entry("zeroshot", z)?;
        }
        if let Some(u) = self.2 {
            m.serialize_entry("unimodal", u)?;
        }
        if let Some(p) = self.3 {
            m.serialize_entry("linear_probe", p)?;
        }
        if let Some(c) = self.4 {
            m.serialize_entry("compositionality", c)?;
        }
        m.end()
    }
}

/// `metrics.json` text.
pub fn metrics_json(ev: &Evaluation) -> String {
    let ordered = Ordered(
        &ev.metrics,
        ev.zeroshot.as_ref(),
        ev.unimodal.as_ref(),
        ev.linear_probe.as_ref(),
        ev.compositionality.as_ref(),
    );
    let mut s = serde_json::to_string_pretty(&ordered).expect("metrics serialise");
    s.push('\n');
    s
}

/// R@1 + R@5 + R@10 of both directions of the metrics `{prefix}_r1`, `_r5`, `_r10`, in percent
/// (0 to 600), as the papers write RSUM.
pub fn rsum_of(ev: &Evaluation, prefix: &str) -> f64 {
    let names = ["r1", "r5", "r10"].map(|k| format!("{prefix}_{k}"));
    100.0
        * ev.metrics
            .iter()
            .filter(|(name, _)| names.contains(name))
            .map(|(_, p)| p.i2t.unwrap_or(0.0) + p.t2i.unwrap_or(0.0))
            .sum::<f64>()
}

fn pct(x: Option<f64>) -> String {
    x.map_or("—".to_owned(), |v| format!("{:.2}", 100.0 * v))
}

/// The metrics table (values x100; `mean` is the mean of the two directions, as PCME++ Table 1
/// reports them), then the uni-modal and the linear-probe ones if any.
pub fn markdown_table(ev: &Evaluation) -> String {
    let mut tables = Vec::new();
    if !ev.metrics.is_empty() || ev.zeroshot.is_some() {
        tables.push(retrieval_table(ev));
    }
    if let Some(u) = &ev.unimodal {
        tables.push(unimodal_table(u));
    }
    if let Some(p) = &ev.linear_probe {
        tables.push(probe_table(p));
    }
    if let Some(c) = &ev.compositionality {
        tables.push(compose_table(c));
    }
    tables.join("\n")
}

/// OTTER Table 7's overlap rates x100, the model's and a random image's.
fn compose_table(c: &ComposeMetrics) -> String {
    let mut s =
        format!("| compositionality ({} queries) | OR | IOR | TOR |\n| --- | ---: | ---: | ---: |\n", c.queries);
    let _ = writeln!(s, "| model | {} | {} | {} |", pct(Some(c.or)), pct(Some(c.ior)), pct(Some(c.tor)));
    let _ = writeln!(
        s,
        "| random image | {} | {} | {} |",
        pct(Some(c.random_or)),
        pct(Some(c.random_ior)),
        pct(Some(c.random_tor))
    );
    s
}

/// The linear probe's test scores x100.
fn probe_table(p: &ProbeMetrics) -> String {
    let mut s = String::from("| linear probe (test) | value | of |\n| --- | ---: | ---: |\n");
    let _ = writeln!(s, "| accuracy | {} | {} images |", pct(Some(p.accuracy)), p.test);
    let _ =
        writeln!(s, "| mean per-class accuracy | {} | {} classes |", pct(Some(p.mean_per_class_accuracy)), p.classes);
    s
}

/// CUSA's uni-modal scores x100 (R@1 in percent, Spearman's ρ x100 as SentEval tables give it).
fn unimodal_table(u: &UniModalMetrics) -> String {
    let mut s = format!("| uni-modal ({} heads) | value | of |\n| --- | ---: | ---: |\n", u.heads.name());
    if let Some(i) = &u.image {
        let _ = writeln!(
            s,
            "| image_r1 ({}) | {} | {} queries |",
            i.image_protocol,
            pct(Some(i.image_r1)),
            i.image_queries
        );
    }
    if let Some(t) = &u.sts {
        let _ = writeln!(s, "| sts_spearman | {} | {} pairs |", pct(t.sts_spearman), t.sts_pairs);
        for (name, d) in t.sts_datasets.iter().flatten() {
            let _ = writeln!(s, "| sts_spearman ({name}) | {} | {} pairs |", pct(d.spearman), d.pairs);
        }
        if let Some(sets) = &t.sts_datasets {
            let _ = writeln!(
                s,
                "| sts_spearman mean / wmean | {} / {} | {} datasets |",
                pct(t.sts_spearman_mean),
                pct(t.sts_spearman_wmean),
                sets.len()
            );
        }
    }
    s
}

fn retrieval_table(ev: &Evaluation) -> String {
    let mut s = String::from("| metric | i2t | t2i | mean |\n| --- | ---: | ---: | ---: |\n");
    for (name, p) in &ev.metrics {
        let mean = p.i2t.zip(p.t2i).map(|(a, b)| (a + b) / 2.0);
        let _ = writeln!(s, "| {name} | {} | {} | {} |", pct(p.i2t), pct(p.t2i), pct(mean));
    }
    if let Some(z) = &ev.zeroshot {
        for (name, v) in [
            ("zeroshot_top1", z.top1),
            ("zeroshot_top2", z.top2),
            ("zeroshot_top5", z.top5),
            ("zeroshot_top10", z.top10),
        ] {
            let _ = writeln!(s, "| {name} ({} classes) | {} | — | — |", z.classes, pct(Some(v)));
        }
    }
    s
}

/// What a researcher should know about the inputs before trusting the numbers (also said on
/// stderr by `curate eval`).
pub fn warnings(ev: &Evaluation) -> Vec<String> {
    let c = &ev.counts;
    let mut out = Vec::new();
    if c.zero_rows != [0, 0] {
        out.push(format!(
            "all-zero embeddings (no direction: every cosine with them is 0): {} image(s), {} caption(s)",
            c.zero_rows[0], c.zero_rows[1]
        ));
    }
    if c.captions_per_image[0] != c.captions_per_image[1] {
        out.push(format!(
            "images have {} to {} captions: each counts as a positive of its image and a distractor of the others; \
             COCO's 5K test split has exactly 5 per image (25,000), and the extra captions some loaders keep are \
             not part of it (spec §4.1)",
            c.captions_per_image[0], c.captions_per_image[1]
        ));
    }
    if let Some([extra, missing, other]) = c.original_gt.filter(|d| d.iter().any(|&n| n > 0)) {
        out.push(format!(
            "the caption table differs from the package's COCO ground truth (`original_caption_to_image.json`): \
             {extra} caption(s) it does not list, {missing} of its captions missing, {other} given another image; \
             the COCO metrics follow the table (spec §4.1: the 5K split is its 25,000 captions)"
        ));
    }
    if c.selection_set {
        out.push(
            "this is the set the run selected its model on (`eval.select_best`): these are validation figures, \
             not test figures; give `--images`/`--captions` for the test split"
                .to_owned(),
        );
    }
    if let Some(u) = &ev.unimodal {
        let (image, sts) = (u.image.as_ref(), u.sts.as_ref());
        if let Some(n) = image.map(|i| i.image_queries_without_positive).filter(|&n| n > 0) {
            out.push(format!(
                "uni-modal image retrieval: {n} query image(s) share their label with no image searched (never a hit, \
                 still counted in image_r1)"
            ));
        }
        if let Some(n) = image.map(|i| i.image_duplicate_paths).filter(|&n| n > 0) {
            out.push(format!(
                "uni-modal image retrieval: {n} row(s) repeat an earlier row's `path`: a query finds its twin as its \
                 nearest neighbour, which lifts image_r1 when their labels agree"
            ));
        }
        if let Some(n) = image.map(|i| i.image_rows_skipped).filter(|&n| n > 0) {
            out.push(format!("uni-modal image retrieval: {n} row(s) left out for a null `path`, `label` or `split`"));
        }
        if let Some(n) = sts.map(|t| t.sts_pairs_skipped).filter(|&n| n > 0) {
            out.push(format!("STS: {n} pair(s) left out for a null sentence or score"));
        }
        if sts.is_some_and(|t| t.sts_spearman.is_none()) {
            out.push(format!(
                "STS: every pair has the same cosine (to within {:e}, float32 rounding), so Spearman's ρ is undefined \
                 (null): does each pair hold two different sentences?",
                super::unimodal::COSINE_ROUNDING
            ));
        }
        if let Some(sets) = sts.and_then(|t| t.sts_datasets.as_ref()) {
            let undefined: Vec<&str> =
                sets.iter().filter(|(_, d)| d.spearman.is_none()).map(|(name, _)| name.as_str()).collect();
            if !undefined.is_empty() {
                out.push(format!(
                    "STS: ρ is undefined (one pair, or every cosine the same) for dataset(s) `{}`, so the mean and \
                     pair-weighted mean are null",
                    undefined.join("`, `")
                ));
            }
        }
    }
    if let Some(p) = &ev.linear_probe {
        out.extend(super::linear_probe::warnings(p, "path").into_iter().map(|w| format!("linear probe: {w}")));
    }
    if let Some(n) = ev.compositionality.as_ref().map(|c| c.rows_skipped).filter(|&n| n > 0) {
        out.push(format!("compositionality: {n} gallery row(s) left out for a null `path` or `attributes`"));
    }
    if let Some(n) = ev.compositionality.as_ref().map(|c| c.duplicate_paths).filter(|&n| n > 0) {
        out.push(format!(
            "compositionality: {n} gallery row(s) repeat an earlier row's `path`: a twin of the query image can be \
             retrieved and lifts IOR"
        ));
    }
    if c.coco_1k_fold_disagreements > 0 {
        out.push(format!(
            "COCO 1K: {} of {} caption(s) fall in another fold by the caption table's order than by the image table's; \
             the folds follow the image table's rows, and spec §4.4 defines them by the caption list in the package's \
             order: with both tables in that order (images as their captions first appear) the two agree",
            c.coco_1k_fold_disagreements, c.captions
        ));
    }
    out
}

/// `metrics.md`: the table, then what was evaluated and how long it took.
pub fn markdown(ev: &Evaluation) -> String {
    let c = &ev.counts;
    let mut s = String::from("# curate eval\n\nValues x100 (metrics.json holds the fractions).\n\n");
    s.push_str(&markdown_table(ev));
    s.push('\n');
    let retrieval = !ev.metrics.is_empty();
    if retrieval {
        let _ = writeln!(s, "- galleries: {} images, {} captions, width {}", c.images, c.captions, c.dim);
        // A protocol without queries (no COCO 1K fold in a gallery of under five images) has no RSUM.
        let rsum = |prefix: &str| {
            let names = ["r1", "r5", "r10"].map(|k| format!("{prefix}_{k}"));
            let any = ev.metrics.iter().any(|(n, p)| names.contains(n) && (p.i2t.is_some() || p.t2i.is_some()));
            if any {
                format!("{:.2}", rsum_of(ev, prefix))
            } else {
                "— (no queries)".to_owned()
            }
        };
        let _ = writeln!(
            s,
            "- RSUM (R@1 + R@5 + R@10, both directions, in %): COCO 5K {}, COCO 1K {} (PCME++ Table 1's \
             \"RSUM (1K)\": the fold means)",
            rsum("coco_5k"),
            rsum("coco_1k")
        );
    }
    if ev.zeroshot.is_some() {
        let _ = writeln!(s, "- zero-shot: each image ranks the class prompts (flat hit@k), hence the i2t column");
    }
    if retrieval {
        let _ = writeln!(
            s,
            "- COCO 1K: {} fold(s) of consecutive image rows{}; {} image(s) outside the folds; {} image(s) without captions (distractors only)",
            c.coco_1k_folds,
            match c.coco_1k_folds_without_queries {
                0 => String::new(),
                n => format!(" ({n} with no captioned image, so no query: left out of the 1K means)"),
            },
            c.images_outside_folds,
            c.images_without_captions
        );
    }
    if c.cxc_queries != [0, 0] || c.eccv_queries != [0, 0] {
        let _ = writeln!(
            s,
            "- queries i2t/t2i: CxC {}/{}, ECCV Caption {}/{}; positives absent from the gallery (counted, never retrieved): CxC {}, ECCV {}",
            c.cxc_queries[0], c.cxc_queries[1], c.eccv_queries[0], c.eccv_queries[1], c.positives_absent[0], c.positives_absent[1]
        );
    }
    if retrieval {
        let _ = writeln!(
            s,
            "- exact score ties of a positive with another gallery item, among the ranks computed exactly (broken by gallery row): i2t {}, t2i {}",
            c.tied_pairs[0], c.tied_pairs[1]
        );
    }
    if let Some(u) = &ev.unimodal {
        let heads = match u.heads {
            super::unimodal::Heads::Uni => "CUSA's uni-modal heads",
            super::unimodal::Heads::Cross => "the cross-modal embeddings (the run has no uni-modal heads)",
        };
        let _ = writeln!(s, "- uni-modal: scored with {heads}, L2-normalised");
        if let Some(i) = &u.image {
            let _ = writeln!(
                s,
                "- uni-modal image retrieval ({}): {} queries, {} images searched, nearest neighbour by cosine \
                 (each query without itself); queries whose nearest image tied exactly with another (the lower \
                 row taken): {}",
                i.image_protocol, i.image_queries, i.image_gallery, i.image_ties
            );
        }
        if let Some(t) = &u.sts {
            let _ = writeln!(
                s,
                "- STS: Spearman's ρ of the cosine against the gold scores (ties ranked by their average), {} pairs",
                t.sts_pairs
            );
        }
    }
    if let Some(p) = &ev.linear_probe {
        let _ = writeln!(
            s,
            "- linear probe: multinomial logistic regression on the image tower's pooled {}-d features (frozen tower, \
             evaluation view: no augmentation); weight decay {:.4e} (scikit-learn's C = {:.4e}) chosen by validation {} {} over {} \
             rows ({}), then fitted on {} train + validation rows of {} classes",
            p.feature_dim,
            p.wd,
            1.0 / p.wd,
            p.metric.name(),
            pct(Some(p.val_score)),
            p.val,
            if p.val_from == "table" { "the table's `val` rows" } else { "held out from `train`" },
            p.train + p.val,
            p.classes
        );
    }
    if let Some(c) = &ev.compositionality {
        let _ = writeln!(
            s,
            "- compositionality (OTTER App. D): {} queries (seed {}) drawn from the {} ordered image pairs sharing at \
             least {} of {} attributes, {} gallery images; query = L2-normalised image embedding + L2-normalised \
             embedding of the text naming the second image's other attributes (on average {:.1} image and {:.1} \
             text attributes), nearest gallery image by cosine other than the query image ({} were the second \
             image); the random row draws any image but the query image",
            c.queries,
            c.seed,
            c.qualifying_pairs,
            c.min_shared,
            c.attributes,
            c.images,
            c.mean_image_attributes,
            c.mean_text_attributes,
            c.retrieved_partner
        );
    }
    for w in warnings(ev) {
        let _ = writeln!(s, "- warning: {w}");
    }
    let t: Vec<String> = ev.timings_s.iter().map(|(k, v)| format!("{k} {v:.2} s")).collect();
    let _ = writeln!(s, "- timings: {}", t.join(", "));
    if retrieval {
        s.push_str("\n![recall@K](recall_at_k.svg)\n");
    }
    s
}

/// Recall@K for K = 1.. the gallery size, sampled evenly in log scale.
pub fn recall_curve(best: &[Option<u32>], gallery: usize) -> Vec<(f64, f64)> {
    if best.is_empty() {
        return Vec::new();
    }
    // Cumulative count of best ranks: hits at K = queries whose best rank is below K.
    let mut hist = vec![0u64; gallery.max(1) + 1];
    for r in best.iter().flatten() {
        hist[(*r as usize).min(gallery)] += 1;
    }
    let mut cum = Vec::with_capacity(hist.len());
    let mut acc = 0u64;
    for h in &hist {
        acc += h;
        cum.push(acc);
    }
    crate::report::plot::log_ranks(gallery.max(1))
        .into_iter()
        .map(|k| (k as f64, cum[k - 1] as f64 / best.len() as f64))
        .collect()
}

/// The recall@K plot.
pub fn plot(ev: &Evaluation) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = ev
        .best_ranks
        .iter()
        .map(|(label, best)| {
            let gallery = if label.ends_with("i2t") { ev.counts.captions } else { ev.counts.images };
            (label.clone(), recall_curve(best, gallery))
        })
        .collect();
    let refs: Vec<(&str, Vec<(f64, f64)>)> = series.iter().map(|(l, p)| (l.as_str(), p.clone())).collect();
    crate::report::plot::log_x_lines("Recall@K (full galleries)", "K", "recall", &refs)
}

/// What [`write()`] writes: an earlier evaluation's are removed when a new one starts.
pub const RESULT_FILES: [&str; 3] = ["metrics.json", "metrics.md", "recall_at_k.svg"];

/// Before the work: refuses an output folder that holds something other than an evaluation (a
/// `config.json` that is not one, a training run's or a pipeline's, or a training run's
/// `model.bpk`: the evaluation's `config.json` would replace it), and makes the folder, so that
/// a place that cannot be one fails now rather than after the work.
pub fn check_out(out: &Path) -> Result<()> {
    let config = std::fs::read_to_string(out.join("config.json")).ok();
    let evaluation = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v["command"].as_str() == Some("eval"))
    };
    let foreign = match config.as_deref() {
        Some(text) if !evaluation(text) => Some("a `config.json` that is not an evaluation's"),
        _ if out.join("model.bpk").is_file() => Some("a training run's `model.bpk`"),
        _ => None,
    };
    if let Some(what) = foreign {
        return Err(Error::Data {
            message: format!("`{}` holds {what}: the evaluation would write over it", out.display()),
            hint: Some("give `--out` a folder of its own (the default is `eval/` inside the run)".into()),
        });
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io("cannot create folder", out, e))
}

/// Writes `config.json` (once the evaluation is done, just before its results): the version,
/// the command and the inputs (`run`: [`super::EmbeddingsRun`] or
/// [`super::trained::Resolved`]). An earlier evaluation's results in `out` are removed first, so
/// none stay beside a `config.json` that is not theirs.
pub fn write_config<T: Serialize>(out: &Path, run: &T) -> Result<()> {
    #[derive(Serialize)]
    struct Config<'a, T> {
        curate_version: &'a str,
        command: &'a str,
        #[serde(flatten)]
        run: &'a T,
    }
    let c = Config { curate_version: env!("CARGO_PKG_VERSION"), command: "eval", run };
    // Made before anything is removed: a config that cannot be written leaves the earlier results.
    let text = serde_json::to_string_pretty(&c).map_err(|e| Error::data(e.to_string()))?;
    for name in RESULT_FILES {
        let path = out.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io("cannot remove", &path, e)),
            _ => {}
        }
    }
    write_atomic(&out.join("config.json"), format!("{text}\n").as_bytes())
}

/// Writes `metrics.json`, `metrics.md` and, with retrieval metrics, `recall_at_k.svg` into `out`.
pub fn write(out: &Path, ev: &Evaluation) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io("cannot create folder", out, e))?;
    write_atomic(&out.join("metrics.json"), metrics_json(ev).as_bytes())?;
    write_atomic(&out.join("metrics.md"), markdown(ev).as_bytes())?;
    // Uni-modal tables alone: no recall curve to draw ([`write_config`] removed an earlier one).
    if ev.metrics.is_empty() {
        return Ok(());
    }
    write_atomic(&out.join("recall_at_k.svg"), plot(ev).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_replaces_an_earlier_evaluations_results() {
        // Once the work starts, an evaluation that fails must not leave the results of an earlier
        // one beside its own config.json.
        let out = tempfile::tempdir().unwrap();
        for name in RESULT_FILES {
            std::fs::write(out.path().join(name), "earlier").unwrap();
        }
        std::fs::write(out.path().join("other.txt"), "kept").unwrap();
        write_config(out.path(), &serde_json::json!({"similarity": "cosine"})).unwrap();
        for name in RESULT_FILES {
            assert!(!out.path().join(name).exists(), "{name}");
        }
        let config = std::fs::read_to_string(out.path().join("config.json")).unwrap();
        assert!(config.contains("\"command\": \"eval\"") && config.contains("\"similarity\": \"cosine\""), "{config}");
        assert!(out.path().join("other.txt").is_file());
    }

    #[cfg(unix)]
    #[test]
    fn a_config_that_cannot_be_written_leaves_the_earlier_results() {
        use std::os::unix::ffi::OsStrExt;
        let out = tempfile::tempdir().unwrap();
        for name in RESULT_FILES {
            std::fs::write(out.path().join(name), "earlier").unwrap();
        }
        let not_utf8 = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"img\xff.parquet"));
        assert!(write_config(out.path(), &not_utf8).is_err());
        for name in RESULT_FILES {
            assert_eq!(std::fs::read_to_string(out.path().join(name)).unwrap(), "earlier", "{name}");
        }
        assert!(!out.path().join("config.json").exists());
    }

    #[test]
    fn a_protocol_without_queries_has_no_rsum_in_the_report() {
        let both = |v: f64| Pair { i2t: Some(v), t2i: Some(v) };
        let mut metrics: Vec<(String, Pair)> =
            ["r1", "r5", "r10"].iter().zip([0.25, 0.5, 1.0]).map(|(k, v)| (format!("coco_5k_{k}"), both(v))).collect();
        metrics.extend(["r1", "r5", "r10"].map(|k| (format!("coco_1k_{k}"), Pair::default())));
        let counts = crate::eval::Counts { images: 2, captions: 10, dim: 4, ..Default::default() };
        let mut ev = Evaluation { metrics, counts, ..Default::default() };
        let md = markdown(&ev);
        assert!(md.contains("COCO 5K 350.00, COCO 1K — (no queries) ("), "{md}");
        // With one direction of one recall there, the sum is of what is there.
        ev.metrics[4].1 = Pair { i2t: Some(0.5), t2i: None };
        let md = markdown(&ev);
        assert!(md.contains("COCO 5K 350.00, COCO 1K 50.00 ("), "{md}");
    }

    #[test]
    fn recall_curve_counts_best_ranks_below_k() {
        // best ranks 0, 2, none -> R@1 = 1/3, R@3 = 2/3, never 1 (the third has no positive).
        let c = recall_curve(&[Some(0), Some(2), None], 4);
        assert_eq!(c.first(), Some(&(1.0, 1.0 / 3.0)));
        assert_eq!(c.iter().find(|p| p.0 == 3.0).map(|p| p.1), Some(2.0 / 3.0));
        assert_eq!(c.last().map(|p| p.1), Some(2.0 / 3.0));
    }
}
