//! `curate eval` (issue 5): equality with the eccv-caption package on a seeded random case made
//! by `tests/fixtures/eval/make_eval_fixtures.py`, hand-computed cases (exact ties, positives
//! absent from the gallery, empty and missing COCO 1K folds) and the input errors.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
use arrow_schema::{Field, Schema};
use curate::eval::embeddings::{self, Captions, Images, Matrix};
use curate::eval::{
    evaluate, evaluate_scored, Annotations, Evaluation, Pair, PositivePairs, Precision, Scoring, Similarity,
};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval").join(rel)
}

fn metric(ev: &Evaluation, name: &str) -> Pair {
    ev.metrics.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no metric `{name}`")).1
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-12)
}

fn images(ids: &[i64], dim: usize, data: &[f32]) -> Images {
    Images { ids: ids.to_vec(), embeddings: Matrix::new(ids.len(), dim, data.to_vec()) }
}

fn captions(ids: &[i64], image_ids: &[i64], dim: usize, data: &[f32]) -> Captions {
    Captions {
        ids: ids.to_vec(),
        image_ids: image_ids.to_vec(),
        embeddings: Matrix::new(ids.len(), dim, data.to_vec()),
    }
}

/// `curate eval` on the eccv-caption fixture into `out`, with `extra` flags.
fn eval_fixture(out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["eval", "--image-embeddings"])
        .arg(fixture("images.parquet"))
        .arg("--caption-embeddings")
        .arg(fixture("captions.parquet"))
        .arg("--eccv-annotations")
        .arg(fixture(""))
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Asserts that `out/metrics.json` has the package's metrics, each within 1e-6; returns how
/// many values were compared.
fn assert_package_metrics(out: &Path) -> usize {
    let got = read_json(&out.join("metrics.json"));
    let want = read_json(&fixture("expected_metrics.json"))["metrics"].clone();
    let (got, want) = (got.as_object().unwrap(), want.as_object().unwrap());
    assert_eq!(
        got.keys().collect::<std::collections::BTreeSet<_>>(),
        want.keys().collect::<std::collections::BTreeSet<_>>(),
        "same metric names as the package"
    );
    let mut compared = 0;
    for (name, w) in want {
        for dir in ["i2t", "t2i"] {
            let (g, w) = (got[name][dir].as_f64().unwrap(), w[dir].as_f64().unwrap());
            assert!((g - w).abs() <= 1e-6, "{name} {dir}: curate {g}, eccv-caption {w}");
            compared += 1;
        }
    }
    compared
}

#[test]
fn cli_matches_the_eccv_caption_package() {
    let out = tempfile::tempdir().unwrap();
    let run = eval_fixture(out.path(), &["--similarity", "dot", "--threads", "2"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.starts_with("| metric | i2t | t2i | mean |"), "{stdout}");
    assert_eq!(assert_package_metrics(out.path()), 28, "the package's 14 metrics, both directions");
    for f in ["config.json", "metrics.md", "recall_at_k.svg"] {
        assert!(out.path().join(f).is_file(), "{f} written");
    }
    let md = std::fs::read_to_string(out.path().join("metrics.md")).unwrap();
    assert!(md.contains("| eccv_map_at_r |") && md.contains("exact score ties"), "{md}");
    // An evaluation into the same folder whose input is not there (annotations) fails before
    // writing anything: the earlier evaluation stays as it was.
    let before: Vec<Vec<u8>> = ["config.json", "metrics.json", "metrics.md", "recall_at_k.svg"]
        .iter()
        .map(|f| std::fs::read(out.path().join(f)).unwrap())
        .collect();
    let failed = Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["eval", "--image-embeddings"])
        .arg(fixture("images.parquet"))
        .arg("--caption-embeddings")
        .arg(fixture("captions.parquet"))
        .arg("--eccv-annotations")
        .arg(out.path().join("nowhere"))
        .arg("--out")
        .arg(out.path())
        .args(["--similarity", "cosine"])
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(2), "{}", String::from_utf8_lossy(&failed.stderr));
    let after: Vec<Vec<u8>> = ["config.json", "metrics.json", "metrics.md", "recall_at_k.svg"]
        .iter()
        .map(|f| std::fs::read(out.path().join(f)).unwrap())
        .collect();
    assert!(before == after, "the earlier evaluation is untouched");
}

#[test]
fn exact_ties_are_broken_by_gallery_row() {
    // Every score is 1: np.argsort(-s, kind="stable") ranks the gallery in row order.
    // Captions by row: 11 (image 2), 10 (image 1), 12 (image 1), 13 (image 2).
    // i2t: image 1's best caption is at rank 1, image 2's at rank 0 -> R@1 = 0.5, R@5 = 1.
    // t2i: image row 0 (id 1) always first -> captions of image 1 hit, of image 2 not -> 0.5.
    let im = images(&[1, 2], 1, &[1.0, 1.0]);
    let cap = captions(&[11, 10, 12, 13], &[2, 1, 1, 2], 1, &[1.0; 4]);
    let ev = evaluate(&im, &cap, None, Similarity::Dot).unwrap();
    let r1 = metric(&ev, "coco_5k_r1");
    assert!(close(r1.i2t, 0.5) && close(r1.t2i, 0.5), "{r1:?}");
    let r5 = metric(&ev, "coco_5k_r5");
    assert!(close(r5.i2t, 1.0) && close(r5.t2i, 1.0), "{r5:?}");
    assert_eq!(ev.counts.tied_pairs, [4, 4]);
    // Two images: no COCO 1K fold at all.
    assert_eq!(metric(&ev, "coco_1k_r1"), Pair { i2t: None, t2i: None });
    let json = curate::eval::report::metrics_json(&ev);
    assert!(json.contains("\"coco_1k_r1\": {\n    \"i2t\": null,"), "{json}");
    // Cosine gives the same ranking here (all rows have norm 1).
    let ev = evaluate(&im, &cap, None, Similarity::Cosine).unwrap();
    assert!(close(metric(&ev, "coco_5k_r1").i2t, 0.5));
}

#[test]
fn absent_positives_still_count_in_r() {
    // Scores (dot): image 1 = [1, 0] ranks captions 10 (.9), 12 (.6), 13 (.4), 11 (.1);
    // image 2 = [0, 1] ranks 11, 13, 12, 10. Caption 13 = [.4, .6] ranks image 2, image 1.
    let im = images(&[1, 2], 2, &[1.0, 0.0, 0.0, 1.0]);
    let cap = captions(&[10, 11, 12, 13], &[1, 2, 1, 2], 2, &[0.9, 0.1, 0.1, 0.9, 0.6, 0.4, 0.4, 0.6]);
    let pairs = |v: &[(i64, &[i64])]| PositivePairs(v.iter().map(|(k, p)| (*k, p.to_vec())).collect());
    let ann = Annotations {
        // Image 1: 99 is absent (never retrieved); image 2 has nothing absent but a positive
        // twice (a set: R = 1).
        cxc_i2t: pairs(&[(1, &[99]), (2, &[11])]),
        cxc_t2i: pairs(&[(10, &[1])]),
        eccv_i2t: pairs(&[(1, &[12, 99, 13]), (2, &[10, 10])]),
        eccv_t2i: pairs(&[(13, &[1, 77])]),
        original_t2i: None,
    };
    let ev = evaluate(&im, &cap, Some(&ann), Similarity::Dot).unwrap();
    // CxC: image 1 can never hit; image 2 hits at rank 0; caption 10 hits.
    let c = metric(&ev, "cxc_r10");
    assert!(close(c.i2t, 0.5) && close(c.t2i, 1.0), "{c:?}");
    // ECCV i2t, image 1: R = 3, positives at ranks 1, 2 -> AP@R = (1/2 + 2/3) / 3, RP = 2/3;
    // image 2: R = 1, positive at rank 3 -> 0, 0. t2i, caption 13: R = 2 (77 absent), image 1
    // at rank 1 -> AP@R = (1/2) / 2, RP = 1/2, R@1 = 0.
    // (eccv_caption._metrics.compute_eccv_metrics on the same lists gives these values.)
    let map = metric(&ev, "eccv_map_at_r");
    assert!(close(map.i2t, (0.5 + 2.0 / 3.0) / 3.0 / 2.0) && close(map.t2i, 0.25), "{map:?}");
    let rp = metric(&ev, "eccv_rprecision");
    assert!(close(rp.i2t, 1.0 / 3.0) && close(rp.t2i, 0.5), "{rp:?}");
    let r1 = metric(&ev, "eccv_r1");
    assert!(close(r1.i2t, 0.0) && close(r1.t2i, 0.0), "{r1:?}");
    assert!(close(metric(&ev, "eccv_r5").i2t, 1.0));
    assert_eq!(ev.counts.positives_absent, [1, 2]);
}

#[test]
fn folds_follow_image_rows_and_skip_an_empty_fold() {
    // Seven images (1-d values 1..7) -> five folds of one image; rows 5 and 6 in no fold.
    // Image row 2 has no caption: fold 2 has no query in either direction and is left out.
    // All captions are [1]: t2i ranks images by value (row 6 first); i2t ties everywhere, so
    // captions rank by row (caption rows belong to images 0, 1, 3, 4, 5, 6).
    let im = images(&[100, 101, 102, 103, 104, 105, 106], 1, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let cap = captions(&[0, 1, 3, 4, 5, 6], &[100, 101, 103, 104, 105, 106], 1, &[1.0; 6]);
    let ev = evaluate(&im, &cap, None, Similarity::Dot).unwrap();
    // 5K i2t: image k's caption at rank = its caption row -> R@1 = 1/6, R@5 = 5/6.
    // 5K t2i: image row r at rank 6 - r -> rows 6 hits R@1; rows 3..6 hit R@5 -> 1/6, 4/6.
    let (r1, r5) = (metric(&ev, "coco_5k_r1"), metric(&ev, "coco_5k_r5"));
    assert!(close(r1.i2t, 1.0 / 6.0) && close(r1.t2i, 1.0 / 6.0), "{r1:?}");
    assert!(close(r5.i2t, 5.0 / 6.0) && close(r5.t2i, 4.0 / 6.0), "{r5:?}");
    // 1K: each fold's gallery is its one image and its caption -> every query hits.
    let k1 = metric(&ev, "coco_1k_r1");
    assert!(close(k1.i2t, 1.0) && close(k1.t2i, 1.0), "{k1:?}");
    assert_eq!((ev.counts.coco_1k_folds, ev.counts.images_outside_folds), (5, 2));
    assert_eq!(ev.counts.images_without_captions, 1);
    // The empty fold is said to be left out of the means, in `metrics.md`.
    assert_eq!(ev.counts.coco_1k_folds_without_queries, 1);
    let md = curate::eval::report::markdown(&ev);
    assert!(
        md.contains("5 fold(s) of consecutive image rows (1 with no captioned image, so no query: left out"),
        "{md}"
    );
}

#[test]
fn coco_1k_ranks_within_the_fold_only() {
    // Ten images, two per fold; image rows 2k and 2k+1 hold values 1 and 2... scaled by fold so
    // that, across the 5K gallery, the last fold outranks every other. Captions [1] each.
    // 5K t2i: only the captions of image row 9 hit at R@1 (1/10). 1K t2i: within each fold the
    // image with the larger value wins -> captions of odd rows hit (1/2).
    let vals: Vec<f32> = (0..10).map(|r| (r / 2 * 10 + r % 2 + 1) as f32).collect();
    let ids: Vec<i64> = (0..10).collect();
    let im = images(&ids, 1, &vals);
    let cap = captions(&ids.iter().map(|i| i + 100).collect::<Vec<_>>(), &ids, 1, &[1.0; 10]);
    let ev = evaluate(&im, &cap, None, Similarity::Dot).unwrap();
    assert!(close(metric(&ev, "coco_5k_r1").t2i, 0.1));
    assert!(close(metric(&ev, "coco_1k_r1").t2i, 0.5));
    // i2t: all caption scores of a query tie -> ranked by row; within fold f the captions are
    // rows 2f, 2f+1 -> image 2f hits at rank 0, image 2f+1 at rank 1 (R@1 1/2, R@5 1).
    assert!(close(metric(&ev, "coco_1k_r1").i2t, 0.5));
    assert!(close(metric(&ev, "coco_1k_r5").i2t, 1.0));
    assert!(close(metric(&ev, "coco_5k_r1").i2t, 0.1));
}

#[test]
fn dot_products_that_can_pass_float32s_range_are_refused_in_float32() {
    // Norms 2e19 and 2e19: their product (4e38) is past f32::MAX (3.4e38); at 1e19 it is not.
    let ids: Vec<i64> = (0..2).collect();
    let cap_ids: Vec<i64> = ids.iter().map(|i| i + 100).collect();
    let im = images(&ids, 1, &[2e19, 1.0]);
    let cap = captions(&cap_ids, &ids, 1, &[2e19, 1.0]);
    let e = evaluate(&im, &cap, None, Similarity::Dot).unwrap_err().to_string();
    assert!(e.contains("past float32's range") && e.contains("--precision f64"), "{e}");
    // In float64, or by cosine, the same embeddings are scored.
    let f64_scoring = curate::eval::Scoring {
        similarity: Similarity::Dot,
        precision: curate::eval::Precision::F64,
        ..Default::default()
    };
    assert!(curate::eval::evaluate_scored(&im, &cap, None, &f64_scoring).is_ok());
    assert!(evaluate(&im, &cap, None, Similarity::Cosine).is_ok());
    let small = captions(&cap_ids, &ids, 1, &[1e19, 1.0]);
    assert!(evaluate(&images(&ids, 1, &[1e19, 1.0]), &small, None, Similarity::Dot).is_ok());
}

#[test]
fn folds_that_the_caption_order_would_draw_otherwise_are_warned_of() {
    // Ten images with one caption each, the captions in image-id order. An image table in the
    // same order draws the same folds (no warning); reversed, every caption's fold by the image
    // rows differs from its block in the caption list but the middle fold's two.
    let ids: Vec<i64> = (0..10).collect();
    let cap = captions(&ids.iter().map(|i| i + 100).collect::<Vec<_>>(), &ids, 1, &[1.0; 10]);
    let vals: Vec<f32> = (0..10).map(|r| r as f32).collect();
    let same = evaluate(&images(&ids, 1, &vals), &cap, None, Similarity::Dot).unwrap();
    assert_eq!(same.counts.coco_1k_fold_disagreements, 0);
    assert!(curate::eval::report::warnings(&same).is_empty());
    let reversed: Vec<i64> = ids.iter().rev().copied().collect();
    let ev = evaluate(&images(&reversed, 1, &vals), &cap, None, Similarity::Dot).unwrap();
    assert_eq!(ev.counts.coco_1k_fold_disagreements, 8);
    let w = curate::eval::report::warnings(&ev);
    assert!(w.len() == 1 && w[0].contains("8 of 10 caption(s)") && w[0].contains("§4.4"), "{w:?}");
}

#[test]
fn images_with_other_caption_counts_are_warned_of() {
    // COCO's 5K split has 5 captions per image; a loader's extra sixth is a positive and a
    // distractor the protocol does not have. Equal counts (here 1 each) are not concerned.
    let ids: Vec<i64> = (0..4).collect();
    let vals: Vec<f32> = (0..4).map(|r| r as f32).collect();
    let one = captions(&[100, 101, 102, 103], &ids, 1, &[1.0; 4]);
    let ev = evaluate(&images(&ids, 1, &vals), &one, None, Similarity::Dot).unwrap();
    assert_eq!(ev.counts.captions_per_image, [1, 1]);
    assert!(curate::eval::report::warnings(&ev).is_empty());
    let extra = captions(&[100, 101, 102, 103, 104], &[0, 1, 2, 3, 3], 1, &[1.0; 5]);
    let ev = evaluate(&images(&ids, 1, &vals), &extra, None, Similarity::Dot).unwrap();
    assert_eq!(ev.counts.captions_per_image, [1, 2]);
    let w = curate::eval::report::warnings(&ev);
    assert!(w.len() == 1 && w[0].starts_with("images have 1 to 2 captions") && w[0].contains("§4.1"), "{w:?}");
}

#[test]
fn a_caption_table_is_checked_against_the_packages_coco_ground_truth() {
    // `original_caption_to_image.json` beside the CxC/ECCV files: captions it does not list, of
    // its captions those the table lacks, and those the two give different images, are counted
    // and warned of; a table that agrees is not.
    let ids: Vec<i64> = (0..3).collect();
    let im = images(&ids, 1, &[1.0, 2.0, 3.0]);
    let cap = captions(&[10, 11, 12, 13], &[0, 1, 2, 2], 1, &[1.0; 4]);
    let pairs = |v: &[(i64, i64)]| PositivePairs(v.iter().map(|&(c, i)| (c, vec![i])).collect());
    let with = |gt: PositivePairs| Annotations { original_t2i: Some(gt), ..Annotations::default() };
    let same = with(pairs(&[(10, 0), (11, 1), (12, 2), (13, 2)]));
    let ev = evaluate(&im, &cap, Some(&same), Similarity::Dot).unwrap();
    assert_eq!(ev.counts.original_gt, Some([0, 0, 0]));
    let w = curate::eval::report::warnings(&ev);
    assert!(!w.iter().any(|w| w.contains("ground truth")), "{w:?}");
    // 13 is an extra, 14 missing from the table, 11 another image's.
    let other = with(pairs(&[(10, 0), (11, 2), (12, 2), (14, 1)]));
    let ev = evaluate(&im, &cap, Some(&other), Similarity::Dot).unwrap();
    assert_eq!(ev.counts.original_gt, Some([1, 1, 1]));
    let w = curate::eval::report::warnings(&ev);
    assert!(
        w.iter().any(|w| w.contains("1 caption(s) it does not list, 1 of its captions missing, 1 given another image")),
        "{w:?}"
    );
    // Without the file, nothing is checked.
    let ev = evaluate(&im, &cap, Some(&Annotations::default()), Similarity::Dot).unwrap();
    assert_eq!(ev.counts.original_gt, None);
}

fn emb(rows: usize, dim: usize) -> ArrayRef {
    let mut b = FixedSizeListBuilder::new(Float32Builder::new(), dim as i32);
    for r in 0..rows {
        for k in 0..dim {
            b.values().append_value((r * dim + k) as f32);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

/// A `FixedSizeList<Float32, 2>` column of `rows`.
fn vectors(rows: &[[f32; 2]]) -> ArrayRef {
    let mut b = FixedSizeListBuilder::new(Float32Builder::new(), 2);
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn write(dir: &Path, name: &str, cols: Vec<(&str, ArrayRef)>) -> PathBuf {
    write_with_nulls(dir, name, cols, false)
}

/// `cols` written to `dir/name`, every column nullable (the uni-modal tables count their nulls).
fn write_nullable(dir: &Path, name: &str, cols: Vec<(&str, ArrayRef)>) -> PathBuf {
    write_with_nulls(dir, name, cols, true)
}

fn write_with_nulls(dir: &Path, name: &str, cols: Vec<(&str, ArrayRef)>, nullable: bool) -> PathBuf {
    let fields: Vec<Field> = cols.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), nullable)).collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    let path = dir.join(name);
    curate::io::parquet::write_file(&path, schema, &[batch], &[]).unwrap();
    path
}

#[test]
fn input_errors_name_the_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ids = |v: &[i64]| -> ArrayRef { Arc::new(Int64Array::from(v.to_vec())) };

    let p = write(d, "no_emb.parquet", vec![("coco_image_id", ids(&[1, 2]))]);
    let e = embeddings::read_images(&p).unwrap_err().to_string();
    assert!(e.contains("no column `embedding`") && e.contains("no_emb.parquet"), "{e}");

    let p = write(
        d,
        "int32.parquet",
        vec![("coco_image_id", Arc::new(Int32Array::from(vec![1, 2]))), ("embedding", emb(2, 3))],
    );
    let e = embeddings::read_images(&p).unwrap_err().to_string();
    assert!(e.contains("`coco_image_id`") && e.contains("not Int64"), "{e}");

    let p = write(d, "dup.parquet", vec![("coco_image_id", ids(&[1, 2, 1])), ("embedding", emb(3, 3))]);
    let e = embeddings::read_images(&p).unwrap_err().to_string();
    assert!(e.contains("coco_image_id 1 appears twice (rows 0 and 2)"), "{e}");

    let p = write(
        d,
        "wide.parquet",
        vec![("coco_image_id", Arc::new(Int64Array::from(vec![1, 2]))), ("embedding", emb(2, 3))],
    );
    let ip = p.clone();
    let im = embeddings::read_images(&p).unwrap();
    let cp = write(
        d,
        "caps.parquet",
        vec![("coco_caption_id", ids(&[5, 6])), ("coco_image_id", ids(&[1, 2])), ("embedding", emb(2, 4))],
    );
    let cap = embeddings::read_captions(&cp).unwrap();
    let e = embeddings::check_pair(&im, &cap, &ip, &cp).unwrap_err().to_string();
    assert!(e.contains("embedding widths differ") && e.contains("has 3") && e.contains("has 4"), "{e}");

    // An empty table (no rows, so no width) is nothing to evaluate, not a width mismatch.
    let ep = write(d, "empty.parquet", vec![("coco_image_id", ids(&[])), ("embedding", emb(0, 16))]);
    let empty = embeddings::read_images(&ep).unwrap();
    let e = embeddings::check_pair(&empty, &cap, &ep, &cp).unwrap_err().to_string();
    let want = format!("nothing to evaluate: 0 image(s) in `{}`, 2 caption(s) in `{}`", ep.display(), cp.display());
    assert!(e.contains(&want) && !e.contains("widths differ"), "{e}");

    let cp = write(
        d,
        "orphan.parquet",
        vec![("coco_caption_id", ids(&[5, 6])), ("coco_image_id", ids(&[1, 9])), ("embedding", emb(2, 3))],
    );
    let cap = embeddings::read_captions(&cp).unwrap();
    let e = embeddings::check_pair(&im, &cap, &ip, &cp).unwrap_err().to_string();
    assert!(e.contains("caption 6, image 9"), "{e}");

    // An annotation query outside the gallery, and a folder without the annotation files.
    let cap = captions(&[5, 6], &[1, 2], 3, &[0.0; 6]);
    let ann = Annotations { eccv_i2t: PositivePairs(vec![(555, vec![5])]), ..Annotations::default() };
    let e = evaluate(&im, &cap, Some(&ann), Similarity::Dot).unwrap_err().to_string();
    assert!(e.contains("query 555 of `eccv_image_to_caption.json` is not in the gallery"), "{e}");
    assert!(e.contains("embed all of it") && !e.contains("swapped"), "{e}");
    // A caption id as an image query: the files may be swapped.
    let ann = Annotations { eccv_i2t: PositivePairs(vec![(5, vec![1])]), ..Annotations::default() };
    let e = evaluate(&im, &cap, Some(&ann), Similarity::Dot).unwrap_err().to_string();
    assert!(e.contains("query 5 of `eccv_image_to_caption.json`") && e.contains("swapped"), "{e}");
    // An ECCV query without positives is named by its COCO id (R = 0: mAP@R is undefined).
    let first = im.ids[0];
    let ann = Annotations { eccv_i2t: PositivePairs(vec![(first, vec![])]), ..Annotations::default() };
    let e = evaluate(&im, &cap, Some(&ann), Similarity::Dot).unwrap_err().to_string();
    assert!(e.contains(&format!("`eccv_image_to_caption.json`: query {first} has no positives")), "{e}");
    let e = Annotations::read_dir(d).unwrap_err().to_string();
    assert!(e.contains("lacks cxc_image_to_caption.json") && e.contains("eccv-caption"), "{e}");
    // A folder that is not there, or a file: said so, not listed as lacking every file.
    let e = Annotations::read_dir(&d.join("nope")).unwrap_err().to_string();
    assert!(e.contains("nope` does not exist (`--eccv-annotations` names the folder"), "{e}");
    std::fs::write(d.join("a_file.json"), "{}").unwrap();
    let e = Annotations::read_dir(&d.join("a_file.json")).unwrap_err().to_string();
    assert!(e.contains("a_file.json` is not a folder") && !e.contains("lacks"), "{e}");
}

#[test]
fn float64_scores_agree_with_the_package_where_float32_does() {
    // The fixture has no near ties: float64 scores (PCME++'s evaluation) rank as float32 ones.
    let out = tempfile::tempdir().unwrap();
    let run = eval_fixture(out.path(), &["--similarity", "dot", "--precision", "f64"]);
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(assert_package_metrics(out.path()), 28, "the package's 14 metrics, both directions");
    assert_eq!(read_json(&out.path().join("config.json"))["precision"], "f64");
}

#[test]
fn csd_ranks_by_the_closed_form_distance_with_each_items_uncertainty() {
    // Two images, three captions (2-d unit means). By cosine every query hits at rank 0. CSD
    // (spec cusa-and-pcmepp.md §3.11) ranks i2t by 2 μ_v·μ_t − ‖σ²_t‖₁ and t2i by
    // 2 μ_v·μ_t − ‖σ²_v‖₁:
    //   i2t, image 1: caption 10 (own) 2·1 − 3 = −1, caption 20 0 − 0 = 0, caption 21 1.2 → miss
    //   i2t, image 2: caption 20 (own) 2 is first → hit                        R@1 i2t = 1/2
    //   t2i, caption 10: image 1 2 − 0, image 2 0 − 10 → hit
    //   t2i, caption 20: image 1 0 − 0, image 2 2 − 10 → miss; caption 21: 1.2 vs −8.4 → miss
    //                                                                          R@1 t2i = 1/3
    let im = images(&[1, 2], 2, &[2.0, 0.0, 0.0, 1.0]);
    let cap = captions(&[10, 20, 21], &[1, 2, 2], 2, &[1.0, 0.0, 0.0, 1.0, 0.6, 0.8]);
    let (iu, cu) = ([0.0, 10.0], [3.0, 0.0, 0.0]);
    let cosine = evaluate(&im, &cap, None, Similarity::Cosine).unwrap();
    let r1 = metric(&cosine, "coco_5k_r1");
    assert!(close(r1.i2t, 1.0) && close(r1.t2i, 1.0), "{r1:?}");
    let scoring = Scoring { similarity: Similarity::Csd, precision: Precision::F64, uncertainty: Some((&iu, &cu)) };
    let csd = evaluate_scored(&im, &cap, None, &scoring).unwrap();
    let r1 = metric(&csd, "coco_5k_r1");
    assert!(close(r1.i2t, 0.5) && close(r1.t2i, 1.0 / 3.0), "{r1:?}");
    // Without uncertainties, or with a negative one, CSD is refused.
    let e = evaluate(&im, &cap, None, Similarity::Csd).unwrap_err().to_string();
    assert!(e.contains("needs each image's and each caption's uncertainty"), "{e}");
    let bad = [0.0, -1.0];
    let e = evaluate_scored(&im, &cap, None, &Scoring { uncertainty: Some((&bad, &cu)), ..scoring }).unwrap_err();
    assert!(e.to_string().contains("an uncertainty ‖σ²‖₁ is -1"), "{e}");

    // The same through the CLI, the uncertainties in each table's `uncertainty` column.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ids = |v: &[i64]| -> ArrayRef { Arc::new(Int64Array::from(v.to_vec())) };
    let floats = |v: &[f64]| -> ArrayRef { Arc::new(arrow_array::Float64Array::from(v.to_vec())) };
    let ip = write(
        d,
        "images.parquet",
        vec![
            ("coco_image_id", ids(&[1, 2])),
            ("embedding", vectors(&[[2.0, 0.0], [0.0, 1.0]])),
            ("uncertainty", floats(&iu)),
        ],
    );
    let cp = write(
        d,
        "captions.parquet",
        vec![
            ("coco_caption_id", ids(&[10, 20, 21])),
            ("coco_image_id", ids(&[1, 2, 2])),
            ("embedding", vectors(&[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])),
            ("uncertainty", floats(&cu)),
        ],
    );
    let eval = |images: &Path, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_curate"))
            .args(["eval", "--image-embeddings"])
            .arg(images)
            .arg("--caption-embeddings")
            .arg(&cp)
            .arg("--out")
            .arg(d.join("out"))
            .args(extra)
            .output()
            .unwrap()
    };
    let run = eval(&ip, &["--similarity", "csd"]);
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/metrics.json")).unwrap()).unwrap();
    assert!((got["coco_5k_r1"]["i2t"].as_f64().unwrap() - 0.5).abs() < 1e-12, "{got}");
    assert!((got["coco_5k_r1"]["t2i"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12, "{got}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/config.json")).unwrap()).unwrap();
    assert_eq!((config["similarity"].as_str(), config["precision"].as_str()), (Some("csd"), Some("f64")));
    // CSD in float32, or a table without the column, is refused with what to do.
    let run = eval(&ip, &["--similarity", "csd", "--precision", "f32"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.code() != Some(0) && stderr.contains("is computed in float64"), "{stderr}");
    let plain = write(
        d,
        "plain.parquet",
        vec![("coco_image_id", ids(&[1, 2])), ("embedding", vectors(&[[2.0, 0.0], [0.0, 1.0]]))],
    );
    let run = eval(&plain, &["--similarity", "csd"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("has no column `uncertainty`") && stderr.contains("‖σ²‖₁"), "{stderr}");
    // Without `--similarity csd` the column is not read: cosine, as before.
    let run = eval(&ip, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/metrics.json")).unwrap()).unwrap();
    assert!((got["coco_5k_r1"]["t2i"].as_f64().unwrap() - 1.0).abs() < 1e-12, "{got}");
}

#[test]
fn all_zero_embeddings_are_warned_about_where_scores_normalise() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ids = |v: &[i64]| -> ArrayRef { Arc::new(Int64Array::from(v.to_vec())) };
    let ip =
        write(d, "i.parquet", vec![("coco_image_id", ids(&[1, 2])), ("embedding", vectors(&[[0.0, 0.0], [0.0, 1.0]]))]);
    let cp = write(
        d,
        "c.parquet",
        vec![
            ("coco_caption_id", ids(&[10, 20])),
            ("coco_image_id", ids(&[1, 2])),
            ("embedding", vectors(&[[1.0, 0.0], [0.0, 1.0]])),
        ],
    );
    for (similarity, warned) in [("cosine", true), ("dot", false)] {
        let out = d.join(similarity);
        let run = Command::new(env!("CARGO_BIN_EXE_curate"))
            .args(["eval", "--image-embeddings"])
            .arg(&ip)
            .arg("--caption-embeddings")
            .arg(&cp)
            .arg("--out")
            .arg(&out)
            .args(["--similarity", similarity])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(0), "{stderr}");
        let want = "all-zero embeddings (no direction: every cosine with them is 0): 1 image(s), 0 caption(s)";
        assert_eq!(stderr.contains(&format!("warning: {want}")), warned, "{similarity}: {stderr}");
        let md = std::fs::read_to_string(out.join("metrics.md")).unwrap();
        assert_eq!(md.contains(want), warned, "{similarity}: {md}");
    }
}

// `curate eval RUN_DIR`: a 4-step run on the bundled sample (`data/gen_train_sample.py`), its
// model embedding `data/train_sample/retrieval_*.parquet` (120 images, 5 captions each).

#[test]
fn sts_spearman_equals_scipy_with_ties() {
    // `scipy.stats.spearmanr(system, gold)` (what SentEval reports) and `rankdata` on seeded
    // cases full of ties, from `tests/fixtures/eval/make_spearman_fixture.py`.
    use curate::eval::unimodal::{average_ranks, spearman};
    let v = read_json(&fixture("spearman.json"));
    let floats =
        |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    let mut tied = 0;
    for (i, c) in cases.iter().enumerate() {
        let (system, gold) = (floats(&c["system"]), floats(&c["gold"]));
        assert_eq!(average_ranks(&system), floats(&c["system_ranks"]), "case {i}: system ranks");
        assert_eq!(average_ranks(&gold), floats(&c["gold_ranks"]), "case {i}: gold ranks");
        tied += floats(&c["system_ranks"]).iter().chain(&floats(&c["gold_ranks"])).filter(|r| r.fract() != 0.0).count();
        let (got, want) = (spearman(&system, &gold).unwrap(), c["spearman"].as_f64().unwrap());
        assert!((got - want).abs() < 1e-12, "case {i}: {got} vs scipy {want}");
    }
    assert!(tied > 100, "the fixture exercises ties ({tied} averaged ranks)");
}

#[test]
fn uni_modal_tables_are_checked_and_their_nulls_counted() {
    use arrow_array::{Float64Array, StringArray};
    use curate::eval::unimodal::{spearman, Side, StsPairs, UniImages};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = |v: &[Option<&str>]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
    let nums = |v: &[Option<f64>]| -> ArrayRef { Arc::new(Float64Array::from(v.to_vec())) };

    // Every missing column at once, with a "did you mean".
    let p = write_nullable(d, "typo.parquet", vec![("paths", text(&[Some("a.png")]))]);
    let e = UniImages::read(&p).unwrap_err().to_string();
    assert!(e.contains("typo.parquet` has no column `path`, `label`") && e.contains("`paths`"), "{e}");
    assert!(e.contains("hint:") && e.contains("path"), "{e}");
    // Labels: strings or integers; a null path or label leaves the row out, counted; classes are
    // numbered as first met.
    let p = write_nullable(
        d,
        "labels.parquet",
        vec![
            ("path", text(&[Some("a"), Some("b"), None, Some("c"), Some("d")])),
            ("label", Arc::new(Int32Array::from(vec![Some(7), Some(3), Some(7), None, Some(7)]))),
        ],
    );
    let t = UniImages::read(&p).unwrap();
    assert_eq!(
        (t.paths.clone(), t.labels.clone(), t.skipped, t.split.clone()),
        (vec!["a".into(), "b".into(), "d".into()], vec![0, 1, 0], 2, None)
    );
    assert_eq!(t.protocol(), "single_set");
    let p = write_nullable(d, "floats.parquet", vec![("path", text(&[Some("a")])), ("label", nums(&[Some(1.0)]))]);
    let e = UniImages::read(&p).unwrap_err().to_string();
    assert!(e.contains("column `label`") && e.contains("not a string or an integer"), "{e}");
    // Fewer than two images once the nulls are left out.
    let p = write_nullable(
        d,
        "one.parquet",
        vec![("path", text(&[Some("a"), None])), ("label", text(&[Some("x"), Some("x")]))],
    );
    let e = UniImages::read(&p).unwrap_err().to_string();
    assert!(e.contains("has 1 image(s) (1 row(s) left out") && e.contains("at least 2"), "{e}");
    // `split`: query/gallery; another value is refused by row; queries need a gallery.
    let split = |name: &str, v: &[Option<&str>]| {
        let n = v.len();
        let paths: Vec<Option<&str>> = vec![Some("p"); n];
        let labels: Vec<Option<&str>> = vec![Some("x"); n];
        write_nullable(d, name, vec![("path", text(&paths)), ("label", text(&labels)), ("split", text(v))])
    };
    let t = UniImages::read(&split("ok.parquet", &[Some("gallery"), Some("query"), None])).unwrap();
    assert_eq!((t.protocol(), t.split, t.skipped), ("query_gallery", Some(vec![Side::Gallery, Side::Query]), 1));
    let e = UniImages::read(&split("test.parquet", &[Some("query"), Some("test")])).unwrap_err().to_string();
    assert!(e.contains("row 1 has `split` = `test`") && e.contains("`query` or `gallery`"), "{e}");
    let e = UniImages::read(&split("q.parquet", &[Some("query"), Some("query")])).unwrap_err().to_string();
    assert!(e.contains("has 2 query and 0 gallery image(s)"), "{e}");
    let e = UniImages::read(&split("g.parquet", &[Some("gallery")])).unwrap_err().to_string();
    assert!(e.contains("has 0 query and 1 gallery image(s)"), "{e}");

    // STS: nulls counted, a non-finite or non-numeric score and constant gold scores refused,
    // `pre_caption` applied (and a sentence it empties named).
    let sts = |name: &str, a: &[Option<&str>], score: ArrayRef| {
        let b: Vec<Option<&str>> = a.iter().map(|_| Some("Two dogs.")).collect();
        write_nullable(d, name, vec![("sentence1", text(a)), ("sentence2", text(&b)), ("score", score)])
    };
    let p = sts(
        "sts.parquet",
        &[Some("A Dog, running!"), None, Some("a cat"), Some("x")],
        nums(&[Some(4.0), Some(1.0), Some(2.5), None]),
    );
    let t = StsPairs::read(&p, false).unwrap();
    assert_eq!(
        (t.sentence1.clone(), t.scores.clone(), t.skipped),
        (vec!["A Dog, running!".into(), "a cat".into()], vec![4.0, 2.5], 2)
    );
    let t = StsPairs::read(&p, true).unwrap();
    assert_eq!((t.sentence1, t.sentence2[0].as_str()), (vec!["a dog running".into(), "a cat".into()], "two dogs"));
    let p = sts("empty.parquet", &[Some("a"), Some("...")], nums(&[Some(1.0), Some(2.0)]));
    let e = StsPairs::read(&p, true).unwrap_err().to_string();
    assert!(e.contains("`sentence1` of row 1") && e.contains("nothing left after `pre_caption`"), "{e}");
    let p = sts("nan.parquet", &[Some("a"), Some("b")], nums(&[Some(1.0), Some(f64::NAN)]));
    let e = StsPairs::read(&p, false).unwrap_err().to_string();
    assert!(e.contains("`score` of row 1") && e.contains("NaN"), "{e}");
    let p = sts("flat.parquet", &[Some("a"), Some("b")], nums(&[Some(3.0), Some(3.0)]));
    let e = StsPairs::read(&p, false).unwrap_err().to_string();
    assert!(e.contains("every gold `score`") && e.contains("undefined"), "{e}");
    let p = sts("few.parquet", &[Some("a"), Some("b")], nums(&[Some(3.0), None]));
    let e = StsPairs::read(&p, false).unwrap_err().to_string();
    assert!(e.contains("1 sentence pair(s) with a score (1 left out for a null)"), "{e}");
    let p = sts("text.parquet", &[Some("a"), Some("b")], text(&[Some("1"), Some("2")]));
    let e = StsPairs::read(&p, false).unwrap_err().to_string();
    assert!(e.contains("column `score`") && e.contains("not a number"), "{e}");
    let p = write_nullable(d, "nosts.parquet", vec![("sentence_1", text(&[Some("a")]))]);
    let e = StsPairs::read(&p, false).unwrap_err().to_string();
    assert!(e.contains("no column `sentence1`, `sentence2`, `score`"), "{e}");

    // A `dataset` column (STS12-16 in one table): ρ per dataset, their mean and pair-weighted
    // mean (SentEval's `all`), the pooled ρ beside them; a null dataset is a skipped pair.
    let names = [Some("sts12"), Some("sts12"), Some("sts12"), Some("sts13"), Some("sts13"), None];
    let p = write_nullable(
        d,
        "sets.parquet",
        vec![
            ("sentence1", text(&[Some("a"); 6])),
            ("sentence2", text(&[Some("b"); 6])),
            ("score", nums(&[Some(1.0), Some(2.0), Some(3.0), Some(1.0), Some(2.0), Some(5.0)])),
            ("dataset", text(&names)),
        ],
    );
    let t = StsPairs::read(&p, false).unwrap();
    assert_eq!(
        (t.datasets.clone().unwrap(), t.skipped),
        (["sts12", "sts12", "sts12", "sts13", "sts13"].map(String::from).to_vec(), 1)
    );
    // sts12: cosines in the gold order (ρ 1); sts13: reversed (ρ −1).
    let m = curate::eval::unimodal::StsMetrics::new(&[0.1, 0.2, 0.3, 0.9, 0.8], &t);
    let sets = m.sts_datasets.as_ref().unwrap();
    let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 1e-12);
    assert!(near(sets["sts12"].spearman, 1.0) && near(sets["sts13"].spearman, -1.0), "{m:?}");
    assert_eq!((sets["sts12"].pairs, sets["sts13"].pairs), (3, 2));
    assert!(near(m.sts_spearman_mean, 0.0) && near(m.sts_spearman_wmean, (3.0 - 2.0) / 5.0), "{m:?}");
    assert_eq!(m.sts_spearman, spearman(&[0.1, 0.2, 0.3, 0.9, 0.8], &[1.0, 2.0, 3.0, 1.0, 2.0]));
    let ev = curate::eval::Evaluation {
        metrics: Vec::new(),
        best_ranks: Vec::new(),
        counts: Default::default(),
        timings_s: Vec::new(),
        zeroshot: None,
        unimodal: Some(curate::eval::unimodal::UniModalMetrics {
            heads: curate::eval::unimodal::Heads::Uni,
            image: None,
            sts: Some(m.clone()),
        }),
        linear_probe: None,
        compositionality: None,
    };
    let md = curate::eval::report::markdown_table(&ev);
    assert!(md.contains("| sts_spearman (sts13) | -100.00 | 2 pairs |"), "{md}");
    assert!(md.contains("| sts_spearman mean / wmean | 0.00 / 20.00 | 2 datasets |"), "{md}");
    // sts13's cosines one value but for float32 rounding (pairs of one sentence twice): its ρ is
    // undefined, the means null, and the warning names it.
    let rounded = curate::eval::unimodal::StsMetrics::new(&[0.1, 0.2, 0.3, 1.0, 1.0 - 3e-7], &t);
    let sets = rounded.sts_datasets.as_ref().unwrap();
    assert!(near(sets["sts12"].spearman, 1.0) && sets["sts13"].spearman.is_none(), "{rounded:?}");
    assert_eq!((rounded.sts_spearman_mean, rounded.sts_spearman_wmean), (None, None));
    let unimodal = Some(curate::eval::unimodal::UniModalMetrics {
        heads: curate::eval::unimodal::Heads::Uni,
        image: None,
        sts: Some(rounded),
    });
    let warnings = curate::eval::report::warnings(&curate::eval::Evaluation { unimodal, ..ev.clone() });
    assert!(warnings.iter().any(|w| w.contains("for dataset(s) `sts13`")), "{warnings:?}");
    // Without the column: the pooled ρ alone; null when every cosine is one value to within
    // rounding (ρ of the noise otherwise), not when they differ by more.
    let pooled = StsPairs { datasets: None, ..t };
    assert_eq!(curate::eval::unimodal::StsMetrics::new(&[0.1, 0.2, 0.3, 0.9, 0.8], &pooled).sts_datasets, None);
    let noise = [1.0, 1.0 - 2e-7, 1.0 + 1e-7, 1.0 - 1e-7, 1.0];
    assert_eq!(curate::eval::unimodal::StsMetrics::new(&noise, &pooled).sts_spearman, None);
    let apart = [1.0, 1.0 - 2e-5, 1.0 + 1e-7, 1.0 - 1e-7, 1.0];
    assert!(curate::eval::unimodal::StsMetrics::new(&apart, &pooled).sts_spearman.is_some());
}

mod run_dir {
    use std::path::Path;

    use arrow_array::{Int64Array, StringArray};
    use burn::tensor::Device;
    use curate::eval::embeddings::{Captions, Images, Matrix};
    use curate::eval::trained::{run_trained, RunEval, IMAGE_BATCH};
    use curate::eval::{evaluate, Similarity};
    use curate::models::preprocess::{IMAGENET_MEAN, IMAGENET_STD};
    use curate::train::data::{crop_to_chw, read_image, ImageSource};
    use curate::train::trained::TrainedRun;
    use curate::train::zeroshot::{parse_classes, ZeroShot};

    const ZEROSHOT_AND_RETRIEVAL: &str = r#"
[eval]
images = "data/train_sample/zeroshot.parquet"
classes = "data/train_sample/classes.txt"
templates = ["a photo of a {}."]
every_steps = 100

[eval.retrieval]
images = "data/train_sample/retrieval_images.parquet"
captions = "data/train_sample/retrieval_captions.parquet"
"#;

    const IMAGES: &str = "data/train_sample/retrieval_images.parquet";
    const CAPTIONS: &str = "data/train_sample/retrieval_captions.parquet";

    /// `curate eval RUN_DIR` on the bundled retrieval set given by flags, into `out`.
    fn with_flags(run: &Path, out: &Path) -> RunEval {
        RunEval {
            run: run.to_owned(),
            images: Some(IMAGES.into()),
            captions: Some(CAPTIONS.into()),
            out: Some(out.to_owned()),
            ..Default::default()
        }
    }

    fn json(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn int64s(path: &str, name: &str) -> Vec<i64> {
        let batches = curate::io::parquet::read_file(Path::new(path)).unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name(name).unwrap().as_any().downcast_ref::<Int64Array>().unwrap();
                c.values().to_vec()
            })
            .collect()
    }

    fn strings(path: &str, name: &str) -> Vec<String> {
        let batches = curate::io::parquet::read_file(Path::new(path)).unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name(name).unwrap().as_any().downcast_ref::<StringArray>().unwrap();
                c.iter().map(|s| s.unwrap().to_owned()).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn select_best_keeps_the_model_of_the_best_validation_rsum() {
        // `eval.select_best`: RSUM at steps 2 and 4 in metrics.jsonl, the best kept as
        // `model_best.bpk` (`best.json` its step); `curate eval --best` scores that model to the
        // same RSUM; a run stopped after step 3 and resumed selects the same.
        let toml = format!("{}{ZEROSHOT_AND_RETRIEVAL}", crate::common::TINY_RUN)
            .replace("every_steps = 100", "every_steps = 2")
            .replace("checkpoint_every = 0", "checkpoint_every = 1")
            .replace("[eval.retrieval]", "select_best = true\n\n[eval.retrieval]");
        let dir = tempfile::tempdir().unwrap();
        let run_dir = crate::common::train_run(dir.path(), &toml);
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &serde_json::Value| v.get("val_rsum").is_some())
            .collect();
        let steps: Vec<u64> = lines.iter().map(|v| v["step"].as_u64().unwrap()).collect();
        assert_eq!(steps, [2, 4]);
        let rsums: Vec<f64> = lines.iter().map(|v| v["val_rsum"].as_f64().unwrap()).collect();
        let sum = |v: &serde_json::Value| -> f64 {
            ["r1", "r5", "r10"]
                .iter()
                .map(|k| v[format!("val_{k}_i2t")].as_f64().unwrap() + v[format!("val_{k}_t2i")].as_f64().unwrap())
                .sum()
        };
        // RSUM in percent, the recalls as fractions.
        assert!((100.0 * sum(&lines[0]) - rsums[0]).abs() < 1e-9, "{}", lines[0]);
        assert!(rsums.iter().all(|r| (0.0..=600.0).contains(r)) && rsums[1] > 1.0, "{rsums:?}");
        let best = json(&run_dir.join("best.json"));
        let want = if rsums[1] > rsums[0] { (4, rsums[1]) } else { (2, rsums[0]) };
        assert_eq!((best["step"].as_u64().unwrap(), best["rsum"].as_f64().unwrap()), want);
        assert!(run_dir.join("model_best.bpk").is_file());

        let ev = run_trained(&RunEval { run: run_dir.clone(), best: true, ..Default::default() }, &Device::flex())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!((curate::eval::trained::rsum(&ev) - want.1).abs() < 1e-9, "{ev:?}");
        assert!(run_dir.join("eval_best/metrics.json").is_file());
        // Scored on the set it was selected on, by the run config or by flags naming the same
        // files: said so, as these are validation figures. Another set is not concerned.
        assert!(ev.counts.selection_set);
        let md = std::fs::read_to_string(run_dir.join("eval_best/metrics.md")).unwrap();
        assert!(md.contains("- warning: this is the set the run selected its model on"), "{md}");
        let flagged = run_trained(&with_flags(&run_dir, &dir.path().join("flagged")), &Device::flex()).unwrap();
        assert!(flagged.counts.selection_set);
        let (images, captions) = (dir.path().join("images.parquet"), dir.path().join("captions.parquet"));
        std::fs::copy(IMAGES, &images).unwrap();
        std::fs::copy(CAPTIONS, &captions).unwrap();
        let other = RunEval {
            images: Some(images),
            captions: Some(captions),
            ..with_flags(&run_dir, &dir.path().join("other"))
        };
        assert!(!run_trained(&other, &Device::flex()).unwrap().counts.selection_set);

        // Resumed: the same selection and the same lines. Evaluations at every step, checkpoints
        // every second: stopped after step 3 (checkpoint 2, best.json possibly step 3's), or
        // after step 2 (checkpoint and validation line of step 2 both written).
        let every =
            toml.replace("every_steps = 2", "every_steps = 1").replace("checkpoint_every = 1", "checkpoint_every = 2");
        let val_lines = |run: &Path| -> Vec<serde_json::Value> {
            std::fs::read_to_string(run.join("metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|v| v.get("val_rsum").is_some() || v.get("zeroshot_top1").is_some())
                .collect()
        };
        // With and without a zero-shot set (whose line alone said whether step 2 was evaluated).
        let every_without_zeroshot = every
            .replace("images = \"data/train_sample/zeroshot.parquet\"\n", "")
            .replace("classes = \"data/train_sample/classes.txt\"\n", "");
        // Checkpoints at every step: stopped after step 3, the best (checkpoint 3 written before
        // step 3's evaluation, whose line was logged).
        let every_checkpoint = every.replace("checkpoint_every = 2", "checkpoint_every = 1");
        for (toml, stop) in [(&every, 3), (&every, 2), (&every_without_zeroshot, 2), (&every_checkpoint, 3)] {
            let whole = tempfile::tempdir().unwrap();
            let whole_run = crate::common::train_run(whole.path(), toml);
            let want_lines = val_lines(&whole_run);
            assert_eq!(want_lines.iter().filter(|v| v.get("val_rsum").is_some()).count(), 4);
            let want_best = json(&whole_run.join("best.json"));
            let parts = tempfile::tempdir().unwrap();
            let file = parts.path().join("train.toml");
            std::fs::write(&file, toml).unwrap();
            let out = parts.path().join("run");
            let c = curate::train::TrainConfig::load(&file, &[format!("output_dir={}", out.display())]).unwrap();
            let _ = std::fs::remove_dir_all(&out);
            let stopped = curate::train::TrainOptions { stop_after: Some(stop), ..Default::default() };
            curate::train::train(&c, &stopped).unwrap();
            if stop == 3 {
                // A selection past the checkpoint (here made up) belongs to steps the resumed run
                // takes again: the checkpoint's own is put back.
                std::fs::write(out.join("best.json"), r#"{"step": 3, "rsum": 600.0}"#).unwrap();
            }
            let resume = curate::train::TrainOptions { resume: true, ..Default::default() };
            let s = curate::train::train(&c, &resume).unwrap();
            assert_eq!(s.resumed_at, if toml == &every_checkpoint { 3 } else { 2 }, "stopped after {stop}");
            assert_eq!(json(&out.join("best.json")), want_best, "stopped after {stop}");
            assert_eq!(val_lines(&out), want_lines, "stopped after {stop}: no line twice, none missing");
        }

        let scratch = tempfile::tempdir().unwrap();
        let (file, out) = (scratch.path().join("train.toml"), scratch.path().join("run"));

        // Without a zero-shot set (COCO's case): the retrieval set alone selects.
        let retrieval_only = toml
            .replace("images = \"data/train_sample/zeroshot.parquet\"\n", "")
            .replace("classes = \"data/train_sample/classes.txt\"\n", "")
            .replace("templates = [\"a photo of a {}.\"]\n", "");
        assert_ne!(retrieval_only, toml);
        let only = tempfile::tempdir().unwrap();
        let run = crate::common::train_run(only.path(), &retrieval_only);
        let log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        assert!(!log.contains("zeroshot") && log.contains("val_rsum"), "{log}");
        assert_eq!(json(&run.join("best.json")), best, "the same model, the same set");
        // The retrieval set alone without `select_best` evaluates nothing while training: said.
        let idle = only.path().join("idle.toml");
        std::fs::write(&idle, retrieval_only.replace("select_best = true\n", "")).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
            .args(["train", idle.to_str().unwrap(), "--progress", "never", "--set"])
            .arg(format!("output_dir={}", only.path().join("idle").display()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && stderr.contains("nothing is evaluated while training"), "{stderr}");
        // Half a zero-shot set, or an `[eval]` with nothing to do, is refused.
        let half = retrieval_only.replace("[eval]\n", "[eval]\nclasses = \"data/train_sample/classes.txt\"\n");
        std::fs::write(&file, half).unwrap();
        let e = curate::train::TrainConfig::load(&file, &[format!("output_dir={}", out.display())]).unwrap_err();
        assert!(e.to_string().contains("`eval.classes`: zero-shot needs both `images` and `classes`"), "{e}");
        let empty = retrieval_only.split("select_best").next().unwrap().to_owned();
        std::fs::write(&file, empty).unwrap();
        let e = curate::train::TrainConfig::load(&file, &[format!("output_dir={}", out.display())]).unwrap_err();
        assert!(e.to_string().contains("`eval`: has neither a zero-shot set"), "{e}");

        // Without `[eval.retrieval]` it is refused with the config.
        let no_set = toml.split("[eval.retrieval]").next().unwrap().to_owned();
        std::fs::write(&file, no_set).unwrap();
        let e = curate::train::TrainConfig::load(&file, &[format!("output_dir={}", out.display())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`eval.select_best`: selects on the retrieval set"), "{e}");
    }

    #[test]
    fn a_run_directory_is_scored_like_the_embeddings_of_its_model() {
        let dir = tempfile::tempdir().unwrap();
        // Seed 2: seed 1's model has two zero-shot classes within 1e-6 of each other for an
        // image, which the brute-force comparison below refuses as fragile.
        let tiny = crate::common::TINY_RUN.replace("seed = 1\n", "seed = 2\n");
        assert_ne!(tiny, crate::common::TINY_RUN);
        let run_dir = crate::common::train_run(dir.path(), &format!("{tiny}{ZEROSHOT_AND_RETRIEVAL}"));
        let device = Device::flex();
        let args = RunEval { run: run_dir.clone(), ..Default::default() };
        let ev = run_trained(&args, &device).unwrap_or_else(|e| panic!("{e}"));
        let out = run_dir.join("eval");
        for f in ["config.json", "metrics.json", "metrics.md", "recall_at_k.svg"] {
            assert!(out.join(f).is_file(), "{f} written into RUN_DIR/eval");
        }
        let config = json(&out.join("config.json"));
        assert_eq!(config["command"], "eval");
        assert_eq!(config["retrieval_from"], "run config");
        assert_eq!(config["images"], IMAGES);
        let got = json(&out.join("metrics.json"));

        // The same galleries embedded here with the run's model: the ids and row order of the
        // tables, images resized whole as the trainer's zero-shot evaluation does.
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let (image_ids, paths) = (int64s(IMAGES, "coco_image_id"), strings(IMAGES, "path"));
        let (caption_ids, caption_images) = (int64s(CAPTIONS, "coco_caption_id"), int64s(CAPTIONS, "coco_image_id"));
        let texts = strings(CAPTIONS, "caption");
        assert_eq!((image_ids.len(), caption_ids.len()), (120, 600));
        let size = run.image_size();
        let mut image_rows = Vec::new();
        for chunk in paths.chunks(IMAGE_BATCH) {
            let mut pixels = Vec::new();
            for p in chunk {
                let img = read_image(&ImageSource::File(p.into())).unwrap();
                crop_to_chw(&img, (0, 0, img.width, img.height), size, false, IMAGENET_MEAN, IMAGENET_STD, &mut pixels);
            }
            image_rows.extend(run.embed_images(pixels, chunk.len()).unwrap());
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let caption_rows = run.embed_texts(&refs).unwrap();
        let d = run.dim();
        let images = Images { ids: image_ids.clone(), embeddings: Matrix::new(120, d, image_rows.clone()) };
        let captions = Captions {
            ids: caption_ids,
            image_ids: caption_images.clone(),
            embeddings: Matrix::new(600, d, caption_rows.clone()),
        };
        let want = evaluate(&images, &captions, None, Similarity::Cosine).unwrap();
        assert_eq!(want.metrics.len(), ev.metrics.len());
        let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() <= 1e-12,
            (a, b) => a == b,
        };
        for (name, w) in &want.metrics {
            for (dir, w) in [("i2t", w.i2t), ("t2i", w.t2i)] {
                let g = got[name][dir].as_f64();
                assert!(same(g, w), "{name} {dir}: run directory {g:?}, embeddings {w:?}");
            }
        }

        // Recall@10 i2t by brute force: an image hits when fewer than 10 captions come before
        // its best caption — scores are dot products of the L2-normalised embeddings; a 4-step
        // model gives captions with the same text the same score, and equal scores go by row
        // (`np.argsort(-s, kind="stable")`).
        let dot = |i: usize, j: usize| -> f32 {
            image_rows[i * d..(i + 1) * d].iter().zip(&caption_rows[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum()
        };
        let hits = (0..120)
            .filter(|&i| {
                let s: Vec<f32> = (0..600).map(|j| dot(i, j)).collect();
                let best = (0..600)
                    .filter(|&j| caption_images[j] == image_ids[i])
                    .max_by(|&a, &b| s[a].total_cmp(&s[b]).then(b.cmp(&a)))
                    .unwrap();
                let before = (0..600).filter(|&j| s[j] > s[best] || (s[j] == s[best] && j < best)).count();
                before < 10
            })
            .count();
        let r10 = got["coco_5k_r10"]["i2t"].as_f64().unwrap();
        assert!((r10 - hits as f64 / 120.0).abs() < 1e-12, "coco_5k_r10 i2t {r10}, by hand {hits}/120");
        // "COCO 1K" on 120 images: five folds of 24 consecutive rows.
        assert_eq!((ev.counts.coco_1k_folds, ev.counts.images_outside_folds), (5, 0));

        // Zero-shot: under its own key, equal to the trainer's scores at the last step and to
        // the zero-shot set evaluated here.
        let zs = &got["zeroshot"];
        assert_eq!(zs["classes"], 24);
        let z = ZeroShot::load(run.config.eval.as_ref().unwrap(), &run.transform(), false).unwrap();
        let direct = z.evaluate(&run.model, &run.tokenizer).unwrap();
        // (serde_json reads floats back to within an ulp, hence the tolerance.)
        let near = |v: &serde_json::Value, x: f64| v.as_f64().is_some_and(|v| (v - x).abs() < 1e-12);
        for (k, v) in [("top1", direct.top1), ("top2", direct.top2), ("top5", direct.top5), ("top10", direct.top10)] {
            assert!(near(&zs[k], v), "{k}: {zs} vs {direct:?}");
        }
        // And by brute force, outside `ZeroShot`: a class is the mean of its templates'
        // normalised embeddings, renormalised; an image's classes are ranked by dot product
        // (equal scores by class order), and it is a top-k hit when fewer than k classes come
        // before its label.
        let zc = run.config.eval.as_ref().unwrap();
        let classes = parse_classes(&std::fs::read_to_string(zc.classes.as_ref().unwrap()).unwrap());
        assert!(zc.templates.len() == 1 && classes.len() == 24, "the sample's set");
        let mut class_rows = vec![0f32; classes.len() * d];
        for (c, names) in classes.iter().enumerate() {
            let prompts: Vec<String> = zc.templates.iter().map(|t| t.replace("{}", &names.join(",or "))).collect();
            let e = run.embed_texts(&prompts.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
            let row = &mut class_rows[c * d..(c + 1) * d];
            for t in e.chunks(d) {
                row.iter_mut().zip(t).for_each(|(r, x)| *r += x / prompts.len() as f32);
            }
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= norm);
        }
        let zs_file = zc.images.as_ref().unwrap().expand().unwrap().remove(0);
        let zs_file = zs_file.to_str().unwrap();
        let (zs_paths, zs_labels) = (strings(zs_file, &zc.image_column), strings(zs_file, &zc.label_column));
        let (mut hits, mut least_gap) = ([0usize; 4], f32::INFINITY);
        for (p, label) in zs_paths.iter().zip(&zs_labels) {
            let img = read_image(&ImageSource::File(p.into())).unwrap();
            let mut pixels = Vec::new();
            crop_to_chw(&img, (0, 0, img.width, img.height), size, false, IMAGENET_MEAN, IMAGENET_STD, &mut pixels);
            let e = run.embed_images(pixels, 1).unwrap();
            let scores: Vec<f32> = class_rows.chunks(d).map(|c| c.iter().zip(&e).map(|(a, b)| a * b).sum()).collect();
            let want = classes.iter().position(|n| n.contains(label)).unwrap();
            let before = (0..classes.len())
                .filter(|&c| scores[c] > scores[want] || (scores[c] == scores[want] && c < want))
                .count();
            for (h, k) in hits.iter_mut().zip([1, 2, 5, 10]) {
                *h += usize::from(before < k);
            }
            least_gap = (0..classes.len())
                .filter(|&c| c != want)
                .map(|c| (scores[c] - scores[want]).abs())
                .fold(least_gap, f32::min);
        }
        let n = zs_paths.len() as f64;
        assert_eq!(n, 240.0);
        // Rounding (another batch, another summation order) moves scores by ~1e-7; a margin this
        // wide cannot flip a rank between the two computations.
        assert!(least_gap > 1e-6, "a near tie ({least_gap}) makes the comparison fragile");
        let by_hand = hits.map(|h| h as f64 / n);
        assert_eq!([direct.top1, direct.top2, direct.top5, direct.top10], by_hand, "ZeroShot vs brute force");
        assert!(by_hand[1] > by_hand[0] && by_hand[3] > by_hand[2], "the four differ here: {by_hand:?}");
        let last = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .rev()
            .find(|v| v.get("zeroshot_top1").is_some())
            .unwrap();
        assert_eq!(last["step"], 4);
        assert!(near(&zs["top1"], last["zeroshot_top1"].as_f64().unwrap()), "{zs} vs {last}");
        for k in ["top2", "top5", "top10"] {
            assert!(near(&zs[k], last[&format!("zeroshot_{k}")].as_f64().unwrap()), "{zs} vs {last}");
        }
        let md = std::fs::read_to_string(out.join("metrics.md")).unwrap();
        assert!(md.contains("| coco_5k_r10 |") && md.contains("| zeroshot_top1 (24 classes) |"), "{md}");
        // RSUM of each protocol, in percent, from metrics.json's recalls.
        let rsum = |prefix: &str| -> f64 {
            ["r1", "r5", "r10"]
                .iter()
                .map(|k| {
                    let p = &got[format!("{prefix}_{k}")];
                    100.0 * (p["i2t"].as_f64().unwrap() + p["t2i"].as_f64().unwrap())
                })
                .sum()
        };
        let line = format!(
            "- RSUM (R@1 + R@5 + R@10, both directions, in %): COCO 5K {:.2}, COCO 1K {:.2}",
            rsum("coco_5k"),
            rsum("coco_1k")
        );
        assert!(md.contains(&line) && rsum("coco_5k") != rsum("coco_1k"), "{line}\n{md}");

        // The flags name the same set: the same metrics.
        let flags_out = dir.path().join("flags");
        let args = with_flags(&run_dir, &flags_out);
        run_trained(&args, &device).unwrap();
        assert_eq!(json(&flags_out.join("metrics.json")), got);
        assert_eq!(json(&flags_out.join("config.json"))["retrieval_from"], "flags");

        // A mistyped table path fails before anything is written: that evaluation stays.
        let files = |dir: &Path| -> Vec<Vec<u8>> {
            ["config.json", "metrics.json", "metrics.md", "recall_at_k.svg"]
                .iter()
                .map(|f| std::fs::read(dir.join(f)).unwrap())
                .collect()
        };
        let before = files(&flags_out);
        let typo = RunEval { images: Some(dir.path().join("nope.parquet")), ..args };
        let e = run_trained(&typo, &device).unwrap_err().to_string();
        assert!(e.contains("nope.parquet"), "{e}");
        assert!(files(&flags_out) == before, "the earlier evaluation is untouched");
    }

    #[test]
    fn a_pcmepp_run_is_scored_by_csd_from_its_log_variance_heads() {
        use burn::tensor::{Tensor, TensorData};
        use curate::train::transform::ImageTransform;

        let dir = tempfile::tempdir().unwrap();
        let toml = format!("{}{ZEROSHOT_AND_RETRIEVAL}", crate::common::TINY_RUN)
            .replace("type = \"infonce\"", "type = \"pcmepp\"")
            .replace("[model.image]", "log_variance_bias = -2.0\n\n[model.image]");
        assert!(toml.contains("pcmepp") && toml.contains("log_variance_bias"));
        let run_dir = crate::common::train_run(dir.path(), &toml);
        let device = Device::flex();
        let ev = run_trained(&RunEval { run: run_dir.clone(), ..Default::default() }, &device)
            .unwrap_or_else(|e| panic!("{e}"));
        let config = json(&run_dir.join("eval/config.json"));
        assert_eq!((config["similarity"].as_str(), config["precision"].as_str()), (Some("csd"), Some("f64")));
        let got = json(&run_dir.join("eval/metrics.json"));

        // By hand: means and log-variances from the towers' features and heads, −d in float64
        // (§3.11), every query's full ranking by a stable sort.
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let m = &run.model;
        let (image_ids, paths) = (int64s(IMAGES, "coco_image_id"), strings(IMAGES, "path"));
        let caption_images = int64s(CAPTIONS, "coco_image_id");
        let texts = strings(CAPTIONS, "caption");
        let t = ImageTransform::new(&run.config.data, run.image_size());
        let mut pixels = Vec::new();
        for p in &paths {
            t.test(&read_image(&ImageSource::File(p.into())).unwrap(), &mut pixels);
        }
        let s = run.image_size();
        let x = Tensor::<4>::from_data(TensorData::new(pixels, [paths.len(), 3, s, s]), &device);
        let fi = m.image_features(x);
        let mu_v = m.image_proj.forward(fi.clone()).into_data().try_to_vec::<f32>().unwrap();
        let v_v = m.image_log_var.as_ref().unwrap().forward(fi).into_data().try_to_vec::<f32>().unwrap();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (ids, mask, seq) = curate::train::data::tokenize(&run.tokenizer, &refs).unwrap();
        let ids = Tensor::<2, burn::tensor::Int>::from_data(TensorData::new(ids, [refs.len(), seq]), &device);
        let mask = Tensor::<2, burn::tensor::Int>::from_data(TensorData::new(mask, [refs.len(), seq]), &device);
        let ft = m.text_features(ids, mask);
        let mu_t = match &m.text_proj {
            Some(p) => p.forward(ft.clone()),
            None => ft.clone(),
        };
        let mu_t = mu_t.into_data().try_to_vec::<f32>().unwrap();
        let v_t = m.text_log_var.as_ref().unwrap().forward(ft).into_data().try_to_vec::<f32>().unwrap();
        let d = run.dim();
        let unit = |v: &[f32]| -> Vec<f64> {
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| (x / n) as f64).collect()
        };
        // `exp` in float32, summed in float64, as PCME++'s evaluation code.
        let sigma = |v: &[f32]| -> f64 { v.iter().map(|&x| x.exp() as f64).sum() };
        let (ni, nc) = (paths.len(), texts.len());
        let (uv, ut): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (
            (0..ni).map(|i| unit(&mu_v[i * d..(i + 1) * d])).collect(),
            (0..nc).map(|j| unit(&mu_t[j * d..(j + 1) * d])).collect(),
        );
        let (sv, st): (Vec<f64>, Vec<f64>) = (
            (0..ni).map(|i| sigma(&v_v[i * d..(i + 1) * d])).collect(),
            (0..nc).map(|j| sigma(&v_t[j * d..(j + 1) * d])).collect(),
        );
        let neg_d = |i: usize, j: usize| -> f64 {
            let dot: f64 = uv[i].iter().zip(&ut[j]).map(|(a, b)| a * b).sum();
            2.0 * dot - 2.0 - sv[i] - st[j]
        };
        let first_hit = |scores: Vec<f64>, hit: &dyn Fn(usize) -> bool| -> usize {
            let mut order: Vec<usize> = (0..scores.len()).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            order.iter().position(|&j| hit(j)).unwrap()
        };
        let i2t: Vec<usize> = (0..ni)
            .map(|i| first_hit((0..nc).map(|j| neg_d(i, j)).collect(), &|j| caption_images[j] == image_ids[i]))
            .collect();
        let t2i: Vec<usize> = (0..nc)
            .map(|j| first_hit((0..ni).map(|i| neg_d(i, j)).collect(), &|i| image_ids[i] == caption_images[j]))
            .collect();
        // The uncertainties vary, so CSD is not cosine in disguise.
        let spread =
            st.iter().cloned().fold(f64::NEG_INFINITY, f64::max) - st.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!(spread > 1e-3, "caption uncertainties all alike: {spread}");
        for k in [1usize, 5, 10] {
            let r = |ranks: &[usize]| ranks.iter().filter(|&&p| p < k).count() as f64 / ranks.len() as f64;
            let name = format!("coco_5k_r{k}");
            for (dir, want) in [("i2t", r(&i2t)), ("t2i", r(&t2i))] {
                let g = got[&name][dir].as_f64().unwrap();
                assert!((g - want).abs() < 1e-12, "{name} {dir}: curate {g}, by hand {want}");
            }
        }
        assert_eq!(ev.counts.images, ni);

        // `eval.keep_prompts` (§3.12): per class, the k prompts of least text uncertainty
        // averaged; by hand from the run's own embeddings and uncertainties.
        let mut zc = run.config.eval.clone().unwrap();
        zc.retrieval = None;
        zc.templates = ["a photo of a {}.", "a {}", "a drawing of the {} shape"].map(String::from).to_vec();
        let classes = parse_classes(&std::fs::read_to_string(zc.classes.as_ref().unwrap()).unwrap());
        let zs_file = zc.images.as_ref().unwrap().expand().unwrap().remove(0);
        let zs_file = zs_file.to_str().unwrap();
        let (zs_paths, zs_labels) = (strings(zs_file, &zc.image_column), strings(zs_file, &zc.label_column));
        let pixels: Vec<f32> = zs_paths
            .iter()
            .flat_map(|p| curate::eval::trained::preprocess(Path::new(p), &run.transform()).unwrap())
            .collect();
        let zs_images = run.embed_images(pixels, zs_paths.len()).unwrap();
        let by_hand = |k: usize, least: bool| -> [f64; 4] {
            let t = zc.templates.len();
            let class_rows: Vec<Vec<f32>> = classes
                .iter()
                .map(|names| {
                    let prompts: Vec<String> =
                        zc.templates.iter().map(|tp| tp.replace("{}", &names.join(",or "))).collect();
                    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
                    let (e, u) = run.embed_texts_uncertain(&refs).unwrap();
                    let mut order: Vec<usize> = (0..t).collect();
                    order.sort_by(|&a, &b| u[a].total_cmp(&u[b]).then(a.cmp(&b)));
                    if !least {
                        order.reverse();
                    }
                    let mut row = vec![0f32; d];
                    for &j in &order[..k] {
                        row.iter_mut().zip(&e[j * d..(j + 1) * d]).for_each(|(r, x)| *r += x / k as f32);
                    }
                    let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                    row.iter().map(|x| x / n).collect()
                })
                .collect();
            let mut hits = [0usize; 4];
            for (img, label) in zs_images.chunks(d).zip(&zs_labels) {
                let scores: Vec<f32> = class_rows.iter().map(|c| c.iter().zip(img).map(|(a, b)| a * b).sum()).collect();
                let want = classes.iter().position(|n| n.contains(label)).unwrap();
                let before = (0..classes.len())
                    .filter(|&c| scores[c] > scores[want] || (scores[c] == scores[want] && c < want))
                    .count();
                for (h, k) in hits.iter_mut().zip([1, 2, 5, 10]) {
                    *h += usize::from(before < k);
                }
            }
            hits.map(|h| h as f64 / zs_labels.len() as f64)
        };
        for k in [1, 2] {
            zc.keep_prompts = Some(k);
            let z = ZeroShot::load(&zc, &run.transform(), false).unwrap().evaluate(&run.model, &run.tokenizer).unwrap();
            assert_eq!([z.top1, z.top2, z.top5, z.top10], by_hand(k, true), "keep_prompts = {k}");
        }
        // The choice matters here: the most uncertain prompt alone scores otherwise.
        assert_ne!(by_hand(1, true), by_hand(1, false));

        // `--similarity cosine` scores the means alone (PCME++'s Table C.7); a run without the
        // heads cannot be scored by CSD.
        let out = dir.path().join("cosine");
        let args = RunEval {
            run: run_dir.clone(),
            out: Some(out.clone()),
            similarity: Some(Similarity::Cosine),
            ..Default::default()
        };
        run_trained(&args, &device).unwrap();
        assert_eq!(json(&out.join("config.json"))["similarity"], "cosine");
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        let plain = crate::common::train_run(
            &dir.path().join("plain"),
            &format!("{}{ZEROSHOT_AND_RETRIEVAL}", crate::common::TINY_RUN),
        );
        let args = RunEval { run: plain, similarity: Some(Similarity::Csd), ..Default::default() };
        let e = run_trained(&args, &device).unwrap_err().to_string();
        assert!(e.contains("needs PCME++'s log-variance heads") && e.contains("infonce"), "{e}");
    }

    #[test]
    fn a_run_trained_on_pre_captioned_captions_sees_its_retrieval_captions_so() {
        use arrow_array::RecordBatch;
        let dir = tempfile::tempdir().unwrap();
        let toml = format!("{}{ZEROSHOT_AND_RETRIEVAL}", crate::common::TINY_RUN)
            .replace("[data]\n", "[data]\npre_caption = true\n");
        assert!(toml.contains("pre_caption = true"));
        let run_dir = crate::common::train_run(dir.path(), &toml);
        let device = Device::flex();
        run_trained(&RunEval { run: run_dir.clone(), ..Default::default() }, &device).unwrap_or_else(|e| panic!("{e}"));
        // The metrics are those of the normalised captions embedded by hand.
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let texts: Vec<String> =
            strings(CAPTIONS, "caption").iter().map(|t| curate::text::pre_caption(t, 64).unwrap()).collect();
        assert!(strings(CAPTIONS, "caption") != texts, "the sample's captions change");
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let caption_rows = run.embed_texts(&refs).unwrap();
        let paths = strings(IMAGES, "path");
        let mut pixels = Vec::new();
        for p in &paths {
            run.transform().test(&read_image(&ImageSource::File(p.into())).unwrap(), &mut pixels);
        }
        let image_rows = run.embed_images(pixels, paths.len()).unwrap();
        let d = run.dim();
        let images =
            Images { ids: int64s(IMAGES, "coco_image_id"), embeddings: Matrix::new(paths.len(), d, image_rows) };
        let captions = Captions {
            ids: int64s(CAPTIONS, "coco_caption_id"),
            image_ids: int64s(CAPTIONS, "coco_image_id"),
            embeddings: Matrix::new(texts.len(), d, caption_rows),
        };
        let want = evaluate(&images, &captions, None, Similarity::Cosine).unwrap();
        let got = json(&run_dir.join("eval/metrics.json"));
        for (name, w) in &want.metrics {
            for (dir, w) in [("i2t", w.i2t), ("t2i", w.t2i)] {
                // (serde_json reads floats back to within an ulp.)
                let g = got[name][dir].as_f64();
                assert!(g.zip(w).is_some_and(|(g, w)| (g - w).abs() < 1e-12) || g == w, "{name} {dir}: {g:?} vs {w:?}");
            }
        }
        // A caption it empties is an error naming it, before anything is written.
        let batches = curate::io::parquet::read_file(Path::new(CAPTIONS)).unwrap();
        let mut batch: RecordBatch = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
        let mut texts = strings(CAPTIONS, "caption");
        texts[4] = "...".into();
        let i = batch.schema().index_of("caption").unwrap();
        let mut cols = batch.columns().to_vec();
        cols[i] = std::sync::Arc::new(arrow_array::StringArray::from(texts));
        batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
        let bad = dir.path().join("captions.parquet");
        crate::common::write_parquet(&bad, &batch);
        let args = RunEval {
            run: run_dir.clone(),
            images: Some(IMAGES.into()),
            captions: Some(bad),
            out: Some(dir.path().join("never")),
            ..Default::default()
        };
        let e = run_trained(&args, &device).unwrap_err().to_string();
        let id = int64s(CAPTIONS, "coco_caption_id")[4];
        assert!(e.contains(&format!("caption {id} of")) && e.contains("nothing left after `pre_caption`"), "{e}");
        assert!(!dir.path().join("never").exists());
    }

    #[test]
    fn a_run_without_a_retrieval_set_or_a_final_model_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = crate::common::train_run(dir.path(), crate::common::TINY_RUN);
        let device = Device::flex();
        let e = run_trained(&RunEval { run: run_dir.clone(), ..Default::default() }, &device).unwrap_err().to_string();
        assert!(e.contains("no retrieval set to evaluate") && e.contains("eval.retrieval"), "{e}");
        assert!(e.contains("hint: pass `--images IMAGES.parquet --captions CAPTIONS.parquet`"), "{e}");
        assert!(!run_dir.join("eval").exists(), "nothing written");

        // With the flags it evaluates; without zero-shot settings metrics.json has no zero-shot.
        let out = dir.path().join("eval");
        let args = with_flags(&run_dir, &out);
        let ev = run_trained(&args, &device).unwrap();
        assert!(ev.zeroshot.is_none());
        let got = json(&out.join("metrics.json"));
        assert!(got.get("zeroshot").is_none() && got["coco_5k_r1"]["t2i"].is_f64(), "{got}");

        // A model.bpk cut short: its own message and hint, not a raw error.
        let model = std::fs::read(run_dir.join("model.bpk")).unwrap();
        std::fs::write(run_dir.join("model.bpk"), &model[..model.len() / 2]).unwrap();
        let e = run_trained(&args, &device).unwrap_err().to_string();
        assert!(
            e.contains("cannot load") && e.contains("cannot be read as a model file") && !e.contains("Io(\""),
            "{e}"
        );

        // A pipeline's output folder is named as such, not as an unfinished run.
        let pipeline_out = dir.path().join("pipeline_out");
        std::fs::create_dir_all(&pipeline_out).unwrap();
        std::fs::write(pipeline_out.join("config.json"), r#"{"output_dir": "x", "stage": []}"#).unwrap();
        let e = run_trained(&RunEval { run: pipeline_out.clone(), ..args.clone() }, &device).unwrap_err().to_string();
        assert!(e.contains("is the output of `curate run` (a pipeline), not a `curate train` run"), "{e}");
        // A model's folder (a Hugging Face config.json) is no run either, and not an unfinished one.
        let model_folder = dir.path().join("model_folder");
        std::fs::create_dir_all(&model_folder).unwrap();
        std::fs::copy("tests/fixtures/models/tiny_bert/config.json", model_folder.join("config.json")).unwrap();
        let e = run_trained(&RunEval { run: model_folder, ..args.clone() }, &device).unwrap_err().to_string();
        assert!(e.contains("is not a `curate train` run: its config.json is no training config"), "{e}");
        assert!(!e.contains("did not finish") && !e.contains("--resume"), "{e}");
        // The run's config.json named instead of its folder: said so, the folder suggested.
        let as_file = pipeline_out.join("config.json");
        let e = run_trained(&RunEval { run: as_file, ..args.clone() }, &device).unwrap_err().to_string();
        assert!(e.contains("config.json` is a file; a `curate train` run is named by its folder"), "{e}");
        assert!(e.contains(&format!("name the run's folder (`{}`)", pipeline_out.display())), "{e}");

        // A run that did not finish (no model.bpk), through the binary: exit code 2.
        std::fs::remove_file(run_dir.join("model.bpk")).unwrap();
        let e = run_trained(&args, &device).unwrap_err().to_string();
        assert!(e.contains("has no final model (model.bpk)"), "{e}");
        let bin = std::process::Command::new(env!("CARGO_BIN_EXE_curate")).arg("eval").arg(&run_dir).output().unwrap();
        let stderr = String::from_utf8_lossy(&bin.stderr);
        assert_eq!(bin.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("error: ") && stderr.contains("model.bpk") && stderr.contains("hint:"), "{stderr}");
        assert!(bin.stdout.is_empty());
    }

    /// CUSA's uni-modal evaluation, `--uni-images` and `--sts` (spec `cusa-and-pcmepp.md` §2.7):
    /// on a tiny CUSA run, R@1 (single set and query/gallery) and Spearman's ρ equal a brute-force
    /// computation from the uni-modal heads of the model's own `forward`, with no retrieval set
    /// needed; through the binary the same; a run without uni-modal heads is scored with its
    /// cross-modal embeddings and says so, beside its retrieval metrics.
    #[test]
    fn uni_modal_evaluation_scores_the_uni_heads_or_says_it_used_the_cross_ones() {
        use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
        use burn::tensor::{Int, Tensor, TensorData};
        use std::sync::Arc;

        const ZS: &str = "data/train_sample/zeroshot.parquet";
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let toml = crate::common::TINY_RUN
            .replace("type = \"infonce\"", "type = \"cusa\"")
            .replace("[model.image]", "head_style = \"cusa\"\n\n[model.image]")
            .replace(
                "crop_scale = [0.5, 1.0]\n",
                "crop_scale = [0.5, 1.0]\nteacher_image = \"data/train_sample/teacher_image.parquet\"\n\
                 teacher_text = \"data/train_sample/teacher_text.parquet\"\n",
            );
        assert!(
            toml.contains("\"cusa\"\n\n[model.image]")
                && toml.contains("type = \"cusa\"")
                && toml.contains("teacher_text")
        );
        std::fs::create_dir(d.join("cusa")).unwrap();
        let run_dir = crate::common::train_run(&d.join("cusa"), &toml);
        let device = Device::flex();

        // The tables: the bundled zero-shot images (240, 24 classes) as a single set, the same
        // with even rows as queries and odd rows as the gallery, and 24 caption pairs with made-up
        // gold scores (ties included) plus one pair without a score.
        let (paths, labels) = (strings(ZS, "path"), strings(ZS, "label"));
        let n = paths.len();
        assert_eq!(n, 240);
        let table = |name: &str, cols: Vec<(&str, ArrayRef)>| -> std::path::PathBuf {
            let fields: Vec<arrow_schema::Field> =
                cols.iter().map(|(n, a)| arrow_schema::Field::new(*n, a.data_type().clone(), true)).collect();
            let schema = Arc::new(arrow_schema::Schema::new(fields));
            let batch = RecordBatch::try_new(schema, cols.into_iter().map(|c| c.1).collect()).unwrap();
            let path = d.join(name);
            crate::common::write_parquet(&path, &batch);
            path
        };
        let split: Vec<&str> = (0..n).map(|i| if i % 2 == 0 { "query" } else { "gallery" }).collect();
        // Paths relative to `--image-root`, as the retrieval set's may be.
        let relative: Vec<&str> = paths.iter().map(|p| p.strip_prefix("data/train_sample/").unwrap()).collect();
        let in_shop = table(
            "in_shop.parquet",
            vec![
                ("path", Arc::new(StringArray::from(relative))),
                ("label", Arc::new(StringArray::from(labels.clone()))),
                ("split", Arc::new(StringArray::from(split))),
            ],
        );
        let caps = strings(CAPTIONS, "caption");
        let (mut s1, mut s2, mut gold) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..24 {
            // Even k: two captions of one image; odd: captions of two images.
            s1.push(Some(caps[5 * k].clone()));
            s2.push(Some(caps[if k % 2 == 0 { 5 * k + 1 } else { 5 * k + 12 }].clone()));
            gold.push(Some(if k % 2 == 0 { 4.0 + (k % 4) as f64 / 4.0 } else { (k % 5) as f64 }));
        }
        s1.push(Some("a pair without a score".to_owned()));
        s2.push(Some("is left out and counted".to_owned()));
        gold.push(None);
        let sts = table(
            "sts.parquet",
            vec![
                ("sentence1", Arc::new(StringArray::from(s1.clone()))),
                ("sentence2", Arc::new(StringArray::from(s2.clone()))),
                ("score", Arc::new(Float64Array::from(gold.clone()))),
            ],
        );

        // Uni-modal tables alone: no retrieval set (the run config has none), no recall plot.
        let out = d.join("uni");
        let args = RunEval {
            run: run_dir.clone(),
            uni_images: Some(ZS.into()),
            sts: Some(sts.clone()),
            out: Some(out.clone()),
            ..Default::default()
        };
        let ev = run_trained(&args, &device).unwrap_or_else(|e| panic!("{e}"));
        assert!(ev.metrics.is_empty() && ev.zeroshot.is_none());
        let got = json(&out.join("metrics.json"));
        let keys: Vec<&String> = got.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["unimodal"], "{got}");
        let u = &got["unimodal"];
        assert_eq!(u["heads"], "uni");
        assert_eq!(
            (u["image_protocol"].as_str(), u["image_queries"].as_u64(), u["image_gallery"].as_u64()),
            (Some("single_set"), Some(240), Some(240))
        );
        assert_eq!(
            (u["image_rows_skipped"].as_u64(), u["image_queries_without_positive"].as_u64()),
            (Some(0), Some(0))
        );
        assert_eq!((u["sts_pairs"].as_u64(), u["sts_pairs_skipped"].as_u64()), (Some(24), Some(1)));
        assert!(!out.join("recall_at_k.svg").exists());
        let config = json(&out.join("config.json"));
        assert_eq!(config["retrieval_from"], "none");
        assert!(config.get("images").is_none() && config["uni_images"] == ZS, "{config}");
        let md = std::fs::read_to_string(out.join("metrics.md")).unwrap();
        assert!(md.contains("| uni-modal (uni heads) |") && md.contains("| image_r1 (single_set) |"), "{md}");
        assert!(md.contains("| sts_spearman |") && !md.contains("| metric |") && !md.contains("recall_at_k"), "{md}");
        assert!(md.contains("STS: 1 pair(s) left out"), "{md}");
        assert_eq!(u["image_duplicate_paths"].as_u64(), Some(0));
        // The table's first 24 images once more: each of their queries finds its twin; counted
        // and warned of.
        let twice: Vec<&str> = paths.iter().chain(&paths[..24]).map(String::as_str).collect();
        let twice_labels: Vec<&str> = labels.iter().chain(&labels[..24]).map(String::as_str).collect();
        let doubled = table(
            "doubled.parquet",
            vec![("path", Arc::new(StringArray::from(twice))), ("label", Arc::new(StringArray::from(twice_labels)))],
        );
        let dup = RunEval { uni_images: Some(doubled), sts: None, out: Some(d.join("dup")), ..args.clone() };
        let ev = run_trained(&dup, &device).unwrap_or_else(|e| panic!("{e}"));
        let image = ev.unimodal.as_ref().and_then(|u| u.image.as_ref()).unwrap();
        assert_eq!((image.image_queries, image.image_duplicate_paths), (264, 24));
        let md = std::fs::read_to_string(d.join("dup/metrics.md")).unwrap();
        assert!(md.contains("24 row(s) repeat an earlier row's `path`"), "{md}");
        // ECCV Caption annotations without a retrieval set to annotate: refused.
        let eccv = RunEval { eccv_annotations: Some(d.to_owned()), out: Some(d.join("never")), ..args.clone() };
        let e = run_trained(&eccv, &device).unwrap_err().to_string();
        assert!(e.contains("`--eccv-annotations` annotate a retrieval set"), "{e}");
        assert!(!d.join("never").exists());

        // By brute force from `forward`'s uni-modal heads: every image and every sentence in one
        // batch each (the evaluation's own batches differ, so scores agree to rounding).
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let m = &run.model;
        assert!(m.image_uni.is_some() && m.image_uni_norm.is_some() && m.text_uni.is_some());
        let mut pixels = Vec::new();
        for p in &paths {
            run.transform().test(&read_image(&ImageSource::File(p.into())).unwrap(), &mut pixels);
        }
        let s = run.image_size();
        let x = Tensor::<4>::from_data(TensorData::new(pixels, [n, 3, s, s]), &device);
        let texts: Vec<&str> = s1[..24].iter().chain(&s2[..24]).map(|t| t.as_deref().unwrap()).collect();
        let (ids, mask, seq) = curate::train::data::tokenize(&run.tokenizer, &texts).unwrap();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [48, seq]), &device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, [48, seq]), &device);
        let e = m.forward(x, ids, mask);
        let flat = |t: Option<Tensor<2>>| t.unwrap().into_data().try_to_vec::<f32>().unwrap();
        let (image_uni, text_uni) = (flat(e.image_uni), flat(e.text_uni));
        let dim = run.dim();
        // The evaluation's own embedding functions give these heads' outputs (R@1 alone is too
        // coarse to tell a head from another: a missing LayerNorm left it unchanged here).
        let mut pixels = Vec::new();
        for p in &paths[..8] {
            run.transform().test(&read_image(&ImageSource::File(p.into())).unwrap(), &mut pixels);
        }
        let own = curate::eval::unimodal::embed_images(&run, pixels, 8).unwrap();
        crate::common::assert_close(&own, &image_uni[..8 * dim], 1e-5, "uni-modal image embeddings");
        let own =
            curate::eval::unimodal::embed_texts(&run, &texts[..5].iter().map(|t| t.to_string()).collect::<Vec<_>>())
                .unwrap();
        crate::common::assert_close(&own, &text_uni[..5 * dim], 1e-5, "uni-modal text embeddings");
        let unit = |v: &[f32]| -> Vec<f64> {
            let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
            v.iter().map(|&x| x as f64 / norm).collect()
        };
        let cos = |a: &[f64], b: &[f64]| -> f64 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
        let rows: Vec<Vec<f64>> = image_uni.chunks(dim).map(unit).collect();
        // R@1: the most similar image other than the query (equal scores: the lower row), a hit
        // when it has the query's label. The margin between the best image of the query's label
        // and the best of another label must exceed the rounding, or the comparison is fragile.
        let r1 = |queries: &[usize], pool: &[usize]| -> (f64, f64) {
            let (mut hits, mut least_gap) = (0, f64::INFINITY);
            for &q in queries {
                let others = || pool.iter().copied().filter(|&j| j != q);
                let best = others()
                    .max_by(|&a, &b| cos(&rows[q], &rows[a]).total_cmp(&cos(&rows[q], &rows[b])).then(b.cmp(&a)))
                    .unwrap();
                hits += usize::from(labels[best] == labels[q]);
                let top = |same: bool| {
                    others()
                        .filter(|&j| (labels[j] == labels[q]) == same)
                        .map(|j| cos(&rows[q], &rows[j]))
                        .fold(f64::NEG_INFINITY, f64::max)
                };
                least_gap = least_gap.min((top(true) - top(false)).abs());
            }
            (hits as f64 / queries.len() as f64, least_gap)
        };
        let all: Vec<usize> = (0..n).collect();
        let (want, gap) = r1(&all, &all);
        assert!(gap > 1e-6, "a near tie ({gap}) makes the comparison fragile");
        let r = u["image_r1"].as_f64().unwrap();
        assert!((r - want).abs() < 1e-12, "image_r1 {r}, by brute force {want}");
        assert!(want > 0.0 && want < 1.0, "{want}");
        // Spearman: average ranks (values below, plus half the equal ones and itself), then Pearson.
        let a: Vec<Vec<f64>> = text_uni[..24 * dim].chunks(dim).map(unit).collect();
        let b: Vec<Vec<f64>> = text_uni[24 * dim..].chunks(dim).map(unit).collect();
        let cosines: Vec<f64> = a.iter().zip(&b).map(|(a, b)| cos(a, b)).collect();
        let gold: Vec<f64> = gold[..24].iter().map(|g| g.unwrap()).collect();
        let rho = |x: &[f64], y: &[f64]| -> f64 {
            let ranks = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .map(|a| {
                        let below = v.iter().filter(|b| *b < a).count() as f64;
                        let equal = v.iter().filter(|b| *b == a).count() as f64;
                        below + (equal + 1.0) / 2.0
                    })
                    .collect()
            };
            let (rx, ry) = (ranks(x), ranks(y));
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let (mx, my) = (mean(&rx), mean(&ry));
            let sxy: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - mx) * (b - my)).sum();
            let sxx: f64 = rx.iter().map(|a| (a - mx) * (a - mx)).sum();
            let syy: f64 = ry.iter().map(|b| (b - my) * (b - my)).sum();
            sxy / (sxx * syy).sqrt()
        };
        let least = cosines
            .iter()
            .enumerate()
            .flat_map(|(i, x)| cosines[i + 1..].iter().map(move |y| (x - y).abs()))
            .fold(f64::INFINITY, f64::min);
        assert!(least > 1e-6, "two cosines within {least}: the ranks could swap with rounding");
        let want = rho(&cosines, &gold);
        let got_rho = u["sts_spearman"].as_f64().unwrap();
        assert!((got_rho - want).abs() < 1e-12, "sts_spearman {got_rho}, by brute force {want}");
        // The cross-modal heads give another ρ, so the uni-modal ones were used.
        let texts_owned: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        let cross = run.embed_texts(&texts).unwrap();
        let cross_cos: Vec<f64> = (0..24)
            .map(|i| cos(&unit(&cross[i * dim..(i + 1) * dim]), &unit(&cross[(24 + i) * dim..(25 + i) * dim])))
            .collect();
        assert!(
            (rho(&cross_cos, &gold) - want).abs() > 1e-3,
            "uni and cross heads agree: the test cannot tell them apart"
        );

        // In-Shop's protocol: even rows query the odd ones.
        let out_q = d.join("in_shop");
        let args_q = RunEval {
            uni_images: Some(in_shop),
            image_root: Some("data/train_sample".into()),
            sts: None,
            out: Some(out_q.clone()),
            ..args.clone()
        };
        run_trained(&args_q, &device).unwrap();
        let uq = json(&out_q.join("metrics.json"))["unimodal"].clone();
        let (queries, gallery): (Vec<usize>, Vec<usize>) = (0..n).partition(|i| i % 2 == 0);
        let (want, gap) = r1(&queries, &gallery);
        assert!(gap > 1e-6, "a near tie ({gap}) makes the comparison fragile");
        assert_eq!(
            (uq["image_protocol"].as_str(), uq["image_queries"].as_u64(), uq["image_gallery"].as_u64()),
            (Some("query_gallery"), Some(120), Some(120))
        );
        assert!((uq["image_r1"].as_f64().unwrap() - want).abs() < 1e-12, "{uq} vs {want}");
        assert!(uq.get("sts_spearman").is_none(), "{uq}");

        // Through the binary: the same metrics, the uni-modal table on stdout.
        let out_bin = d.join("bin");
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
            .arg("eval")
            .arg(&run_dir)
            .args(["--uni-images", ZS, "--sts"])
            .arg(&sts)
            .arg("--out")
            .arg(&out_bin)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{stderr}");
        assert!(stdout.contains("| image_r1 (single_set) |") && stdout.contains("240 queries"), "{stdout}");
        assert!(stderr.contains("STS: 1 pair(s) left out"), "{stderr}");
        assert_eq!(json(&out_bin.join("metrics.json")), got);

        // A run without uni-modal heads: its cross-modal embeddings, said so, beside its
        // retrieval metrics when it has a retrieval set too.
        std::fs::create_dir(d.join("plain")).unwrap();
        let plain = crate::common::train_run(&d.join("plain"), crate::common::TINY_RUN);
        let out_p = d.join("plain_eval");
        let args_p = RunEval { sts: Some(sts.clone()), ..with_flags(&plain, &out_p) };
        run_trained(&args_p, &device).unwrap();
        let gp = json(&out_p.join("metrics.json"));
        assert!(gp["coco_5k_r1"]["i2t"].is_f64(), "{gp}");
        assert_eq!(gp["unimodal"]["heads"], "cross");
        assert!(gp["unimodal"].get("image_r1").is_none(), "{gp}");
        let plain_run = TrainedRun::load(&plain, &device).unwrap();
        assert!(plain_run.model.text_uni.is_none());
        let e = plain_run.embed_texts(&texts).unwrap();
        let c: Vec<f64> = (0..24)
            .map(|i| cos(&unit(&e[i * dim..(i + 1) * dim]), &unit(&e[(24 + i) * dim..(25 + i) * dim])))
            .collect();
        let got_rho = gp["unimodal"]["sts_spearman"].as_f64().unwrap();
        assert!((got_rho - rho(&c, &gold)).abs() < 1e-12, "{got_rho} vs {}", rho(&c, &gold));
        let md = std::fs::read_to_string(out_p.join("metrics.md")).unwrap();
        assert!(md.contains("| uni-modal (cross heads) |") && md.contains("| coco_5k_r1 |"), "{md}");
        assert!(md.contains("the cross-modal embeddings (the run has no uni-modal heads)"), "{md}");
        // Neither a retrieval set nor a uni-modal table: refused as before.
        let e = run_trained(&RunEval { run: plain, ..Default::default() }, &device).unwrap_err().to_string();
        assert!(e.contains("no retrieval set") && e.contains("--uni-images"), "{e}");

        // A run trained on `pre_caption`ed captions sees the STS sentences so, as its retrieval
        // captions.
        std::fs::create_dir(d.join("pre")).unwrap();
        let pre_toml = crate::common::TINY_RUN.replace("[data]\n", "[data]\npre_caption = true\n");
        assert!(pre_toml.contains("pre_caption = true"));
        let pre = crate::common::train_run(&d.join("pre"), &pre_toml);
        let out_pre = d.join("pre_eval");
        run_trained(
            &RunEval { run: pre.clone(), sts: Some(sts.clone()), out: Some(out_pre.clone()), ..Default::default() },
            &device,
        )
        .unwrap();
        let pre_run = TrainedRun::load(&pre, &device).unwrap();
        let rho_of = |texts: &[String]| -> f64 {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let e = pre_run.embed_texts(&refs).unwrap();
            let c: Vec<f64> = (0..24)
                .map(|i| cos(&unit(&e[i * dim..(i + 1) * dim]), &unit(&e[(24 + i) * dim..(25 + i) * dim])))
                .collect();
            rho(&c, &gold)
        };
        let normalised: Vec<String> = texts.iter().map(|t| curate::text::pre_caption(t, 64).unwrap()).collect();
        let (want, raw) = (rho_of(&normalised), rho_of(&texts_owned));
        assert!((want - raw).abs() > 1e-6, "pre_caption does not change ρ here: the check cannot fail");
        let got_rho = json(&out_pre.join("metrics.json"))["unimodal"]["sts_spearman"].as_f64().unwrap();
        assert!((got_rho - want).abs() < 1e-12, "{got_rho} vs {want} (without pre_caption {raw})");
    }

    /// An evaluation writes only once it is done: one that fails on an image leaves an earlier
    /// evaluation as it was, and one sent into a training run's folder (`--out RUN_DIR`) is
    /// refused before it writes over the run's `config.json`.
    /// The transfer linear probe, `--probe` (spec `bow-and-otter.md` §6.4): on a tiny run, the
    /// probe of the image tower's pooled features (not the cross-modal embeddings) through
    /// `curate eval` equals [`probe`] on features taken image by image; without `val` rows 20%
    /// of train is held out; through the binary `--probe-metric` chooses by mean per-class
    /// accuracy; a bad table is refused before anything is embedded.
    #[test]
    fn the_linear_probe_reads_the_frozen_tower_and_reports_its_choice() {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use curate::eval::linear_probe::{probe, ProbeConfig, ProbeTable};
        use curate::eval::trained::preprocess_batch;
        use std::sync::Arc;

        const ZS: &str = "data/train_sample/zeroshot.parquet";
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let run_dir = crate::common::train_run(d, crate::common::TINY_RUN);
        let device = Device::flex();
        let (paths, labels) = (strings(ZS, "path"), strings(ZS, "label"));
        // Per class, in order of its rows: 3 train, 1 val, 1 test, repeated (24 classes, 10 each).
        let mut seen = std::collections::HashMap::new();
        let split: Vec<&str> = labels
            .iter()
            .map(|l| {
                let k = seen.entry(l.clone()).or_insert(0usize);
                *k += 1;
                ["train", "train", "train", "val", "test"][(*k - 1) % 5]
            })
            .collect();
        let table_of = |name: &str, paths: &[String], split: Vec<&str>| -> std::path::PathBuf {
            let cols: Vec<(&str, ArrayRef)> = vec![
                ("path", Arc::new(StringArray::from(paths.iter().map(String::as_str).collect::<Vec<_>>()))),
                ("label", Arc::new(StringArray::from(labels.iter().map(String::as_str).collect::<Vec<_>>()))),
                ("split", Arc::new(StringArray::from(split))),
            ];
            let fields: Vec<arrow_schema::Field> =
                cols.iter().map(|(n, a)| arrow_schema::Field::new(*n, a.data_type().clone(), true)).collect();
            let batch = RecordBatch::try_new(
                Arc::new(arrow_schema::Schema::new(fields)),
                cols.into_iter().map(|c| c.1).collect(),
            )
            .unwrap();
            let path = d.join(name);
            crate::common::write_parquet(&path, &batch);
            path
        };
        let table = |name: &str, split: Vec<&str>| table_of(name, &paths, split);
        let with_val = table("probe.parquet", split.clone());
        let out = d.join("probe_eval");
        // At most 40 iterations a fit: the tiny tower's 192 train images are separable in its
        // wider features, and weakly regularised fits would take the default 1000.
        let c = ProbeConfig { max_iter: 40, ..ProbeConfig::default() };
        let args = RunEval {
            run: run_dir.clone(),
            probe: Some(with_val.clone()),
            probe_config: c.clone(),
            out: Some(out.clone()),
            ..Default::default()
        };
        let ev = run_trained(&args, &device).unwrap_or_else(|e| panic!("{e}"));
        let got = json(&out.join("metrics.json"));
        let keys: Vec<&String> = got.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["linear_probe"], "{got}");
        let m = ev.linear_probe.clone().unwrap();
        assert_eq!((m.train, m.val, m.test, m.classes, m.val_from, m.fits), (144, 48, 48, 24, "table", 46));
        assert_eq!(got["linear_probe"]["metric"], "accuracy");
        assert!((got["linear_probe"]["accuracy"].as_f64().unwrap() - m.accuracy).abs() < 1e-15);

        // By hand: each image alone through the tower's pooled features, then the protocol.
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let transform = run.transform();
        let (mut features, mut width) = (Vec::new(), 0);
        for p in &paths {
            let (f, w) =
                run.image_features(preprocess_batch(std::slice::from_ref(p), None, &transform).unwrap(), 1).unwrap();
            features.extend(f);
            width = w;
        }
        assert_eq!(m.feature_dim, width);
        assert_ne!(width, run.dim(), "the tiny run's tower is wider than its embeddings, so this tells them apart");
        let t = ProbeTable::read(&with_val, "path").unwrap();
        let want = probe(&t, &features, width, &c, &device, &|_| {}).unwrap();
        assert_eq!(
            (m.wd, m.accuracy, m.mean_per_class_accuracy),
            (want.wd, want.accuracy, want.mean_per_class_accuracy)
        );
        assert!(m.accuracy > 1.0 / 24.0, "better than chance: {m:?}");
        let md = std::fs::read_to_string(out.join("metrics.md")).unwrap();
        assert!(md.contains("| linear probe (test) |") && md.contains("| accuracy |"), "{md}");
        assert!(md.contains(&format!("pooled {width}-d features")) && md.contains("the table's `val` rows"), "{md}");
        let config = json(&out.join("config.json"));
        assert_eq!(
            (config["retrieval_from"].as_str(), config["probe_config"]["metric"].as_str()),
            (Some("none"), Some("accuracy"))
        );

        // No `val` rows: 20% of the 192 train rows held out (38), chosen by mean per-class
        // accuracy, through the binary.
        let no_val = table("no_val.parquet", split.iter().map(|s| if *s == "val" { "train" } else { *s }).collect());
        let out2 = d.join("probe_no_val");
        let bin = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
            .arg("eval")
            .arg(&run_dir)
            .args(["--probe".as_ref(), no_val.as_os_str(), "--probe-metric".as_ref(), "mean-per-class".as_ref()])
            .args(["--probe-max-iter", "40"])
            .args(["--out".as_ref(), out2.as_os_str()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&bin.stderr);
        assert!(bin.status.success(), "{stderr}");
        assert!(String::from_utf8_lossy(&bin.stdout).contains("| mean per-class accuracy |"));
        assert!(stderr.contains("linear probe: wd 1.000e5: validation mean_per_class"), "{stderr}");
        let p = &json(&out2.join("metrics.json"))["linear_probe"];
        assert_eq!(
            (p["train"].as_u64(), p["val"].as_u64(), p["val_from"].as_str()),
            (Some(154), Some(38), Some("holdout"))
        );
        assert_eq!(p["metric"], "mean_per_class");
        assert!(p["fits_not_converged"].as_u64().unwrap() > 0, "{p}");
        assert!(
            stderr.contains("warning: linear probe: ") && stderr.contains("stopped before the gradient tolerance"),
            "{stderr}"
        );
        assert!(stderr.contains("(40 iterations, stopped by the iteration limit, max gradient "), "{stderr}");
        assert!(p["fits_at_iteration_limit"].as_u64().unwrap() > 0, "{p}");

        // A bad `split` value: refused before anything is embedded, nothing written.
        let bad = table("bad.parquet", split.iter().map(|s| if *s == "val" { "valid" } else { *s }).collect());
        let e = run_trained(&RunEval { probe: Some(bad), out: Some(d.join("never")), ..args.clone() }, &device)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has `split` = `valid`") && e.contains("`train`, `val` or `test`"), "{e}");
        assert!(!d.join("never").exists());

        // Paths relative to a folder of the probe's own: `--probe-image-root` wins over
        // `--image-root` (another table's folder), and gives the same result.
        let root = "data/train_sample/";
        assert!(paths.iter().all(|p| p.starts_with(root)), "{:?}", &paths[..2]);
        let relative: Vec<String> = paths.iter().map(|p| p[root.len()..].to_owned()).collect();
        let own = table_of("own_root.parquet", &relative, split.clone());
        let elsewhere = RunEval {
            probe: Some(own),
            image_root: Some(d.join("another_set")),
            out: Some(d.join("own_root")),
            ..args.clone()
        };
        let e = run_trained(&elsewhere, &device).unwrap_err().to_string();
        assert!(e.contains("another_set"), "without its own root, the shared one: {e}");
        let with_own = RunEval { probe_image_root: Some(root.into()), ..elsewhere };
        let m2 = run_trained(&with_own, &device).unwrap_or_else(|e| panic!("{e}")).linear_probe.unwrap();
        assert_eq!((m2.wd, m2.accuracy, m2.mean_per_class_accuracy), (m.wd, m.accuracy, m.mean_per_class_accuracy));
        let config = json(&d.join("own_root/config.json"));
        assert_eq!(config["probe_image_root"].as_str(), Some(root));
    }

    /// OTTER's compositionality benchmark, `--compose` (spec `bow-and-otter.md` §6.5): on a tiny
    /// run and the bundled zero-shot images with made-up attributes, OR / IOR / TOR equal a
    /// brute-force computation from the run's own embeddings, one image and one text at a time.
    #[test]
    fn compositionality_equals_a_brute_force_search_over_the_runs_embeddings() {
        use arrow_array::builder::{ListBuilder, StringBuilder};
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use curate::eval::compositionality::{draw_queries, text_of, ComposeConfig, ComposeTable};
        use curate::eval::trained::preprocess_batch;
        use std::collections::HashSet;
        use std::sync::Arc;

        const ZS: &str = "data/train_sample/zeroshot.parquet";
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let run_dir = crate::common::train_run(d, crate::common::TINY_RUN);
        let device = Device::flex();
        let (paths, labels) = (strings(ZS, "path"), strings(ZS, "label"));
        // 30 attribute phrases; each class has 12 of them, each image 2 more of its own.
        let phrase = |a: usize| {
            format!(
                "{} {}",
                ["red", "blue", "long", "small", "striped"][a % 5],
                ["wing", "bill", "tail", "crown", "breast", "eye"][a / 5]
            )
        };
        let mut classes: Vec<&String> = labels.iter().collect();
        classes.sort();
        classes.dedup();
        let mut list = ListBuilder::new(StringBuilder::new());
        for (row, label) in labels.iter().enumerate() {
            let c = classes.iter().position(|x| *x == label).unwrap();
            for k in 0..12 {
                list.values().append_value(phrase((c * 7 + k) % 30));
            }
            list.values().append_value(phrase((row * 11) % 30));
            list.values().append_value(phrase((row * 13 + 1) % 30));
            list.append(true);
        }
        let batch = RecordBatch::try_from_iter([
            ("path", Arc::new(StringArray::from(paths.clone())) as ArrayRef),
            ("attributes", Arc::new(list.finish()) as ArrayRef),
        ])
        .unwrap();
        let gallery = d.join("cub.parquet");
        crate::common::write_parquet(&gallery, &batch);

        let c = ComposeConfig { queries: 40, min_shared: 10, seed: 3 };
        let out = d.join("compose_eval");
        let args = RunEval {
            run: run_dir.clone(),
            compose: Some(gallery.clone()),
            compose_config: c.clone(),
            out: Some(out.clone()),
            ..Default::default()
        };
        let ev = run_trained(&args, &device).unwrap_or_else(|e| panic!("{e}"));
        let got = json(&out.join("metrics.json"));
        assert_eq!(got.as_object().unwrap().keys().collect::<Vec<_>>(), ["compositionality"], "{got}");
        let m = ev.compositionality.clone().unwrap();
        assert_eq!((m.queries, m.images, m.attributes, m.min_shared), (40, 240, 30, 10));

        // By hand: each image and each text query embedded alone; cosine in float64; the query
        // image left out; overlaps from hash sets of the phrases.
        let run = TrainedRun::load(&run_dir, &device).unwrap();
        let transform = run.transform();
        let dim = run.dim();
        let images: Vec<Vec<f64>> = paths
            .iter()
            .map(|p| {
                let e =
                    run.embed_images(preprocess_batch(std::slice::from_ref(p), None, &transform).unwrap(), 1).unwrap();
                e.iter().map(|&v| v as f64).collect()
            })
            .collect();
        let table = ComposeTable::read(&gallery).unwrap();
        let drawn = draw_queries(&table, &c).unwrap();
        assert_eq!(m.qualifying_pairs, drawn.qualifying_pairs());
        let queries = drawn.queries(&table, 0..drawn.len());
        let names = |ids: &[u32]| -> HashSet<String> { ids.iter().map(|&a| table.names[a as usize].clone()).collect() };
        let (mut sums, mut least_gap) = ([0.0f64; 3], f64::INFINITY);
        for q in &queries {
            let text = text_of(&q.text_attributes, &table.names);
            let t = run.embed_texts(&[text.as_str()]).unwrap();
            assert_eq!(t.len(), dim);
            let v: Vec<f64> = images[q.image as usize].iter().zip(&t).map(|(a, &b)| a + b as f64).collect();
            let mut scored: Vec<(f64, usize)> = (0..images.len())
                .filter(|&r| r != q.image as usize)
                .map(|r| (images[r].iter().zip(&v).map(|(a, b)| a * b).sum::<f64>(), r))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            least_gap = least_gap.min(scored[0].0 - scored[1].0);
            let r = scored[0].1;
            let (q_v, q_t, got_r) =
                (names(&table.attributes[q.image as usize]), names(&q.text_attributes), names(&table.attributes[r]));
            let hit = |set: &HashSet<String>| set.intersection(&got_r).count() as f64 / set.len() as f64;
            let all: HashSet<String> = q_v.union(&q_t).cloned().collect();
            for (s, x) in sums.iter_mut().zip([hit(&all), hit(&q_v), hit(&q_t)]) {
                *s += x;
            }
        }
        assert!(least_gap > 1e-5, "a near tie ({least_gap}) would make the comparison fragile");
        let n = queries.len() as f64;
        for (name, got, want) in [("or", m.or, sums[0] / n), ("ior", m.ior, sums[1] / n), ("tor", m.tor, sums[2] / n)] {
            assert!((got - want).abs() < 1e-12, "{name}: {got} vs brute force {want}");
        }
        assert!(m.ior > 0.0 && m.tor > 0.0 && m.random_or > 0.0, "{m:?}");
        let md = std::fs::read_to_string(out.join("metrics.md")).unwrap();
        assert!(
            md.contains("| compositionality (40 queries) | OR | IOR | TOR |") && md.contains("| random image |"),
            "{md}"
        );
        let config = json(&out.join("config.json"));
        assert_eq!(config["compose_config"]["min_shared"], 10);

        // A missing image: refused before anything is embedded, naming the table; nothing written.
        let mut missing = paths.clone();
        missing[7] = "data/train_sample/images/nope.png".into();
        let mut list = ListBuilder::new(StringBuilder::new());
        for k in 0..missing.len() {
            list.values().append_value("red");
            list.values().append_value("circle");
            if k % 2 == 1 {
                list.values().append_value("grey background");
            }
            list.append(true);
        }
        let batch = RecordBatch::try_from_iter([
            ("path", Arc::new(StringArray::from(missing)) as ArrayRef),
            ("attributes", Arc::new(list.finish()) as ArrayRef),
        ])
        .unwrap();
        let bad = d.join("missing.parquet");
        crate::common::write_parquet(&bad, &batch);
        let c1 = ComposeConfig { min_shared: 1, ..c.clone() };
        let args = RunEval { compose: Some(bad), compose_config: c1, out: Some(d.join("never")), ..args.clone() };
        let e = run_trained(&args, &device).unwrap_err().to_string();
        assert!(e.contains("1 of the 240 images of") && e.contains("missing.parquet") && e.contains("nope.png"), "{e}");
        assert!(!d.join("never").exists());
        // A null or blank name is no text query: refused, naming the row.
        for odd in [None, Some(" ")] {
            let mut list = ListBuilder::new(StringBuilder::new());
            for k in 0..3 {
                list.values().append_value("red");
                if k == 2 {
                    list.values().append_option(odd);
                }
                list.append(true);
            }
            let batch = RecordBatch::try_from_iter([
                ("path", Arc::new(StringArray::from(paths[..3].to_vec())) as ArrayRef),
                ("attributes", Arc::new(list.finish()) as ArrayRef),
            ])
            .unwrap();
            let holes = d.join("holes.parquet");
            crate::common::write_parquet(&holes, &batch);
            let e = ComposeTable::read(&holes).unwrap_err().to_string();
            assert!(e.contains("holes.parquet` holds a null or blank name (row 2: "), "{odd:?}: {e}");
        }
        // Through the binary: the run-only tables with precomputed embeddings are refused.
        let bin = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
            .args(["eval", "--image-embeddings", "a.parquet", "--caption-embeddings", "b.parquet", "--out"])
            .arg(d.join("never"))
            .args(["--compose".as_ref(), gallery.as_os_str(), "--probe".as_ref(), gallery.as_os_str()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&bin.stderr);
        assert_eq!(bin.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--probe, --compose need(s) RUN_DIR"), "{stderr}");
    }

    #[test]
    fn the_uni_modal_and_compositionality_tables_take_their_own_image_roots() {
        // The bundled zero-shot and attribute tables with paths relative to
        // `data/train_sample`: each table's own root wins over `--image-root` (another set's
        // folder), and without it the shared one is used (and the images are not there).
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use curate::eval::compositionality::ComposeConfig;
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let run_dir = crate::common::train_run(d, crate::common::TINY_RUN);
        let device = Device::flex();
        let root = "data/train_sample/";
        // A copy of `table` with `root` cut from its `path` column.
        let relative = |table: &str, name: &str| {
            let batches = curate::io::parquet::read_file(Path::new(table)).unwrap();
            let batch = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
            let i = batch.schema().index_of("path").unwrap();
            let paths: StringArray = batch
                .column(i)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .iter()
                .map(|p| p.map(|p| p.strip_prefix(root).unwrap().to_owned()))
                .collect();
            let mut cols: Vec<ArrayRef> = batch.columns().to_vec();
            cols[i] = Arc::new(paths);
            let path = d.join(name);
            crate::common::write_parquet(&path, &RecordBatch::try_new(batch.schema(), cols).unwrap());
            path
        };
        let uni = relative("data/train_sample/zeroshot.parquet", "uni.parquet");
        let compose = relative("data/train_sample/attributes.parquet", "compose.parquet");
        let base = RunEval {
            run: run_dir,
            image_root: Some(d.join("another_set")),
            uni_images: Some(uni),
            compose: Some(compose),
            compose_config: ComposeConfig { queries: 20, min_shared: 2, seed: 0 },
            out: Some(d.join("eval")),
            ..Default::default()
        };
        let e = run_trained(&base, &device).unwrap_err().to_string();
        assert!(e.contains("another_set"), "{e}");
        let e = run_trained(&RunEval { uni_images_root: Some(root.into()), ..base.clone() }, &device)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("compose.parquet") && e.contains("another_set"),
            "the compose table still needs its own: {e}"
        );
        let own = RunEval { uni_images_root: Some(root.into()), compose_image_root: Some(root.into()), ..base };
        let ev = run_trained(&own, &device).unwrap_or_else(|e| panic!("{e}"));
        assert!(ev.unimodal.is_some() && ev.compositionality.is_some());
        let config = json(&d.join("eval/config.json"));
        assert_eq!(
            (config["uni_images_root"].as_str(), config["compose_image_root"].as_str()),
            (Some(root), Some(root))
        );
    }

    #[test]
    fn a_failed_evaluation_keeps_the_earlier_one_and_a_run_folder_is_not_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = crate::common::train_run(dir.path(), crate::common::TINY_RUN);
        let device = Device::flex();
        let out = dir.path().join("eval");
        let args = with_flags(&run_dir, &out);
        run_trained(&args, &device).unwrap();
        let earlier: Vec<Vec<u8>> =
            ["config.json", "metrics.json", "metrics.md"].iter().map(|f| std::fs::read(out.join(f)).unwrap()).collect();
        let broken = RunEval { image_root: Some(dir.path().join("nowhere")), ..args.clone() };
        let e = run_trained(&broken, &device).unwrap_err().to_string();
        assert!(e.contains("nowhere"), "{e}");
        for (f, bytes) in ["config.json", "metrics.json", "metrics.md"].iter().zip(&earlier) {
            assert_eq!(&std::fs::read(out.join(f)).unwrap(), bytes, "{f} kept");
        }

        let run_config = std::fs::read(run_dir.join("config.json")).unwrap();
        let into_run = RunEval { out: Some(run_dir.clone()), ..args.clone() };
        let e = run_trained(&into_run, &device).unwrap_err().to_string();
        assert!(e.contains("holds a `config.json` that is not an evaluation's") && e.contains("--out"), "{e}");
        assert_eq!(std::fs::read(run_dir.join("config.json")).unwrap(), run_config, "the run's config is kept");
        assert!(!run_dir.join("metrics.json").exists());
    }
}

#[test]
fn the_noise_diagnostic_matches_a_by_hand_computation_on_the_same_batches() {
    use curate::eval::noise::{batch_figures, batch_rows, diagnose, run, NoiseConfig};
    // Batches: n distinct rows, reproducible per (seed, batch), other seeds other rows.
    let b = batch_rows(7, 3, 50, 20);
    let mut sorted = b.clone();
    sorted.sort();
    sorted.dedup();
    assert!(sorted.len() == 20 && sorted.iter().all(|&r| r < 50));
    assert_eq!(b, batch_rows(7, 3, 50, 20));
    assert_ne!(b, batch_rows(8, 3, 50, 20));
    // One batch by hand: rows [.7 .3], [.1 .9]: paired (.7 + .9) / 2, unpaired (.3 + .1) / 4,
    // max (.3 + .1) / 2.
    let f = batch_figures(&[0.7, 0.3, 0.1, 0.9], 2);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-7;
    assert!(close(f[0], 0.8) && close(f[1], 0.1) && close(f[2], 0.2), "{f:?}");

    // 40 pairs in 4-d, captions near their images; against f64 softmax rows on the same batches.
    let (n, dim) = (40, 4);
    let v: Vec<f32> = (0..n * dim).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
    let t: Vec<f32> = v.iter().enumerate().map(|(i, x)| x + ((i * 13 % 7) as f32 - 3.0) / 10.0).collect();
    let c = NoiseConfig { batch_size: 8, batches: 5, scale: 10.0, seed: 1 };
    let got = diagnose(&v, &t, dim, &c, &burn::tensor::Device::flex()).unwrap();
    let unit = |x: &[f32]| -> Vec<f64> {
        let norm = x.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
        x.iter().map(|a| f64::from(*a) / norm).collect()
    };
    let mut want = [0.0; 3];
    for b in 0..c.batches {
        let rows = batch_rows(c.seed, b, n, c.batch_size);
        let mut p = Vec::new();
        for &i in &rows {
            let vi = unit(&v[i * dim..(i + 1) * dim]);
            let s: Vec<f64> = rows
                .iter()
                .map(|&j| 10.0 * unit(&t[j * dim..(j + 1) * dim]).iter().zip(&vi).map(|(a, b)| a * b).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            p.extend(s.iter().map(|x| ((x - m).exp() / z) as f32));
        }
        for (w, f) in want.iter_mut().zip(batch_figures(&p, c.batch_size)) {
            *w += f / c.batches as f64;
        }
    }
    for k in 0..3 {
        assert!((got[k] - want[k]).abs() < 1e-5, "{got:?} vs {want:?}");
    }
    assert!(got[0] > 0.3 && got[2] < got[0], "captions near their images: {got:?}");
    assert!(diagnose(&v, &t, dim, &NoiseConfig { batch_size: 41, ..c.clone() }, &burn::tensor::Device::flex()).is_err());
    // A scale that is no positive number (NaN, inf: `--scale 1e39` past f32's range, 0, -5) is
    // refused, not turned into NaN figures.
    for scale in [f32::NAN, f32::INFINITY, "1e39".parse().unwrap(), 0.0, -5.0] {
        let e = diagnose(&v, &t, dim, &NoiseConfig { scale, ..c.clone() }, &burn::tensor::Device::flex())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`--scale` must be a positive number"), "{scale}: {e}");
    }

    // From feature tables, joined by id: rows either table lacks are counted, not drawn.
    let dir = tempfile::tempdir().unwrap();
    let table = |name: &str, ids: Vec<String>, x: &[f32]| {
        let mut b = FixedSizeListBuilder::new(Float32Builder::new(), dim as i32);
        for r in x.chunks(dim) {
            b.values().append_slice(r);
            b.append(true);
        }
        let ids: ArrayRef = Arc::new(arrow_array::StringArray::from(ids));
        write(dir.path(), name, vec![("sample_id", ids), ("embedding", Arc::new(b.finish()) as ArrayRef)])
    };
    let ids = |range: std::ops::Range<usize>| range.map(|i| format!("s{i:03}")).collect::<Vec<_>>();
    let images = table("img.parquet", ids(0..n), &v);
    let texts = table("txt.parquet", ids(2..n + 3), &[&t[2 * dim..], &[0.5; 12]].concat());
    let r =
        run(std::slice::from_ref(&images), std::slice::from_ref(&texts), &c, &burn::tensor::Device::flex()).unwrap();
    assert_eq!((r.pairs, r.unmatched), (38, [2, 3]));
    // Tables that share no id: both sides' ids are shown, not only "0 pairs".
    let other = table("other_ids.parquet", (0..n).map(|i| format!("x{i}")).collect(), &t);
    let e = run(std::slice::from_ref(&images), std::slice::from_ref(&other), &c, &burn::tensor::Device::flex())
        .unwrap_err()
        .to_string();
    assert!(e.contains("share no `sample_id`: images have `s000`, `s001`, `s002`, captions `x0`, `x1`, `x10`"), "{e}");
    // Tables of another scale, even past f32's squared norms (1e20s, 1e-25s): the same figures.
    let far: Vec<f32> = v.iter().map(|x| x * 1e20).collect();
    let far_images = table("img_far.parquet", ids(0..n), &far);
    let tiny: Vec<f32> = [&t[2 * dim..], &[0.5; 12]].concat().iter().map(|x| x * 3e-25).collect();
    let tiny_texts = table("txt_tiny.parquet", ids(2..n + 3), &tiny);
    let r2 = run(&[far_images], &[tiny_texts], &c, &burn::tensor::Device::flex()).unwrap();
    for (a, b) in [(r.paired, r2.paired), (r.unpaired_avg, r2.unpaired_avg), (r.unpaired_max, r2.unpaired_max)] {
        assert!((a - b).abs() < 1e-6, "{r:?} vs {r2:?}");
    }
    // `curate noise`: the same figures, on stdout and in `--out` (its folder made first).
    let json_out = dir.path().join("new/noise.json");
    let out = Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["noise", images.to_str().unwrap(), texts.to_str().unwrap(), "--batch-size", "8", "--batches", "5"])
        .args(["--scale", "10", "--seed", "1", "--out", json_out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.starts_with(&format!("paired {:.3}, ", r.paired)), "{stdout}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert_eq!(saved["result"]["paired"].as_f64(), Some(r.paired));
    assert_eq!(saved["result"]["unmatched"], serde_json::json!([2, 3]));
}

// The linear probe (spec `bow-and-otter.md` §6.4) against scikit-learn's
// `LogisticRegression(C = 1/wd, solver="lbfgs", tol=1e-10)` on a seeded 4-class set
// (`tests/fixtures/eval/make_linear_probe.py`).

fn probe_split(v: &serde_json::Value) -> (Vec<f32>, Vec<u32>) {
    let x = v["x"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32));
    let y = v["y"].as_array().unwrap().iter().map(|y| y.as_u64().unwrap() as u32);
    (x.collect(), y.collect())
}

#[test]
fn linear_probe_fits_equal_scikit_learn_along_the_grid() {
    use burn::tensor::Device;
    use curate::eval::linear_probe::{accuracy, fit, log_grid, ProbeConfig, Problem};
    let v = read_json(&fixture("linear_probe.json"));
    let (dim, classes) = (v["dim"].as_u64().unwrap() as usize, v["classes"].as_u64().unwrap() as usize);
    let ((x, y), (vx, vy)) = (probe_split(&v["train"]), probe_split(&v["val"]));
    let device = Device::flex();
    let problem = Problem::new(&x, &y, dim, classes, &device);
    let val = problem.rows(&vx);
    let grid: Vec<f64> = v["grid"].as_array().unwrap().iter().map(|g| g.as_f64().unwrap()).collect();
    let ours = log_grid();
    assert_eq!(grid.len(), ours.len());
    for (a, b) in grid.iter().zip(&ours) {
        assert!((a / b - 1.0).abs() < 1e-12, "grid {a} vs {b}");
    }
    // Tighter than the default (1e-6): the float32 products still reach it here, in at most
    // 41 iterations, and it brings every coefficient within ~4e-6 of scikit-learn's.
    let c = ProbeConfig { tol: 1e-7, ..ProbeConfig::default() };
    let floats = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .flat_map(|r| match r.as_array() {
                Some(row) => row.iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>(),
                None => vec![r.as_f64().unwrap()],
            })
            .collect()
    };
    let mut worst: f64 = 0.0;
    let mut pred_differ = 0;
    for (i, want) in v["fits"].as_array().unwrap().iter().enumerate() {
        let f = fit(&problem, grid[i], &c).unwrap();
        assert!(f.converged, "wd {}: {} iterations, max gradient {}", grid[i], f.iterations, f.grad_max);
        let raw = problem.uncentred(&f.theta);
        let (w, b) = raw.split_at(classes * dim);
        let (sw, sb) = (floats(&want["coef"]), floats(&want["intercept"]));
        // Biases are unique up to a common shift: compare them centred.
        let centre = |b: &[f64]| -> Vec<f64> {
            let m = b.iter().sum::<f64>() / b.len() as f64;
            b.iter().map(|x| x - m).collect()
        };
        let scale = sw.iter().chain(&sb).fold(0.0f64, |a, x| a.max(x.abs()));
        for (got, want) in w.iter().chain(&centre(b)).zip(sw.iter().chain(&centre(&sb))) {
            worst = worst.max((got - want).abs() / scale);
        }
        let pred = problem.predict(&val, &f.theta).unwrap();
        let want_pred: Vec<u32> =
            want["val_pred"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as u32).collect();
        pred_differ += pred.iter().zip(&want_pred).filter(|(a, b)| a != b).count();
        assert!((accuracy(&pred, &vy) - want["val_accuracy"].as_f64().unwrap()).abs() < 1e-12, "wd {}", grid[i]);
    }
    assert!(worst < 1e-4, "largest coefficient difference, relative to the largest coefficient: {worst}");
    assert_eq!(pred_differ, 0);

    // Features moved by +3 in every dimension (all positive, as a ResNet's are): the same
    // classifier, its bias moved by −3·ΣW (scikit-learn's minimiser on the shifted data).
    let shifted: Vec<f32> = x.iter().map(|v| v + 3.0).collect();
    let moved = Problem::new(&shifted, &y, dim, classes, &device);
    for i in [0, 22, 33, 44] {
        let want = &v["fits"][i];
        let f = fit(&moved, grid[i], &c).unwrap();
        assert!(f.converged, "wd {}: {f:?}", grid[i]);
        let raw = moved.uncentred(&f.theta);
        let (sw, sb) = (floats(&want["coef"]), floats(&want["intercept"]));
        let scale = sw.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        let centre = |b: Vec<f64>| -> Vec<f64> {
            let m = b.iter().sum::<f64>() / b.len() as f64;
            b.iter().map(|x| x - m).collect()
        };
        let want_b =
            centre((0..classes).map(|k| sb[k] - 3.0 * sw[k * dim..(k + 1) * dim].iter().sum::<f64>()).collect());
        let got_b = centre(raw[classes * dim..].to_vec());
        for (g, w) in raw[..classes * dim].iter().chain(&got_b).zip(sw.iter().chain(&want_b)) {
            assert!((g - w).abs() / scale < 1e-4, "wd {}: {g} vs {w}", grid[i]);
        }
    }
}

#[test]
fn linear_probe_protocol_chooses_and_scores_as_scikit_learn() {
    use burn::tensor::Device;
    use curate::eval::linear_probe::{probe, ProbeConfig, ProbeMetric, ProbeTable, Split};
    let v = read_json(&fixture("linear_probe.json"));
    let dim = v["dim"].as_u64().unwrap() as usize;
    let mut features = Vec::new();
    let mut table = ProbeTable {
        file: "fixture".into(),
        keys: Vec::new(),
        labels: Vec::new(),
        split: Vec::new(),
        names: (0..4).map(|c| format!("class {c}")).collect(),
        skipped: 0,
        key: "path",
    };
    for (key, split) in [("train", Split::Train), ("val", Split::Val), ("test", Split::Test)] {
        let (x, y) = probe_split(&v[key]);
        features.extend(x);
        table.keys.extend((0..y.len()).map(|i| format!("{key}/{i}.jpg")));
        table.split.extend(std::iter::repeat_n(split, y.len()));
        table.labels.extend(y);
    }
    for (metric, key) in [(ProbeMetric::Accuracy, "accuracy"), (ProbeMetric::MeanPerClass, "mean_per_class")] {
        let c = ProbeConfig { metric, ..ProbeConfig::default() };
        let m = probe(&table, &features, dim, &c, &Device::flex(), &|_| {}).unwrap();
        let want = &v[format!("final_{key}")];
        let selected = v[format!("selected_wd_{key}")].as_f64().unwrap();
        // Index 33 of the grid: 35-44 score the same on validation, and the tie goes to the
        // smallest weight decay.
        assert!((m.wd / selected - 1.0).abs() < 1e-12, "{key}: wd {} vs scikit-learn's {selected}", m.wd);
        assert!((m.accuracy - want["test_accuracy"].as_f64().unwrap()).abs() < 1e-12, "{key}: {m:?}");
        assert!(
            (m.mean_per_class_accuracy - want["test_mean_per_class"].as_f64().unwrap()).abs() < 1e-12,
            "{key}: {m:?}"
        );
        assert_ne!(m.accuracy, m.mean_per_class_accuracy, "the test split is unbalanced");
        assert_eq!((m.train, m.val, m.test, m.classes, m.val_from), (240, 60, 160, 4, "table"));
        assert_eq!((m.fits, m.fits_not_converged, m.test_unseen_class), (46, 0, 0));
    }
}

#[test]
fn curate_probe_on_feature_tables_chooses_and_scores_as_scikit_learn() {
    // The fixture's rows as an `encode_image`-style features table (ids in another order, plus
    // rows nobody labelled) and a labels table; `curate probe` gives scikit-learn's choice and
    // test scores. Labels without features, and an id labelled twice, are refused.
    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let v = read_json(&fixture("linear_probe.json"));
    let dim = v["dim"].as_u64().unwrap() as usize;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut ids, mut values, mut labels, mut split) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for key in ["train", "val", "test"] {
        let (x, y) = probe_split(&v[key]);
        for (i, row) in x.chunks(dim).enumerate() {
            ids.push(format!("{key}-{i}"));
            values.extend_from_slice(row);
            labels.push(format!("class {}", y[i]));
            split.push(key);
        }
    }
    let write_features = |path: &Path, order: &[usize], extra: usize| {
        let mut f_ids: Vec<String> = order.iter().map(|&r| ids[r].clone()).collect();
        let mut f_values: Vec<f32> =
            order.iter().flat_map(|&r| values[r * dim..(r + 1) * dim].iter().copied()).collect();
        for e in 0..extra {
            f_ids.push(format!("unlabelled-{e}"));
            f_values.extend(std::iter::repeat_n(e as f32, dim));
        }
        let field = Arc::new(arrow_schema::Field::new("item", arrow_schema::DataType::Float32, false));
        let list = FixedSizeListArray::new(field, dim as i32, Arc::new(Float32Array::from(f_values)), None);
        let batch = RecordBatch::try_from_iter([
            ("sample_id", Arc::new(StringArray::from(f_ids)) as ArrayRef),
            ("embedding", Arc::new(list) as ArrayRef),
        ])
        .unwrap();
        common::write_parquet(path, &batch);
    };
    let write_labels = |path: &Path, rows: &[usize]| {
        let batch = RecordBatch::try_from_iter([
            (
                "sample_id",
                Arc::new(StringArray::from(rows.iter().map(|&r| ids[r].clone()).collect::<Vec<_>>())) as ArrayRef,
            ),
            (
                "label",
                Arc::new(StringArray::from(rows.iter().map(|&r| labels[r].clone()).collect::<Vec<_>>())) as ArrayRef,
            ),
            ("split", Arc::new(StringArray::from(rows.iter().map(|&r| split[r]).collect::<Vec<_>>())) as ArrayRef),
        ])
        .unwrap();
        common::write_parquet(path, &batch);
    };
    let n = ids.len();
    let reversed: Vec<usize> = (0..n).rev().collect();
    let all: Vec<usize> = (0..n).collect();
    write_features(&d.join("features.parquet"), &reversed, 5);
    write_labels(&d.join("labels.parquet"), &all);
    let probe = |labels: &str, extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
            .arg("probe")
            .arg(d.join("features.parquet"))
            .arg(d.join(labels))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = d.join("probe.json");
    let bin = probe("labels.parquet", &["--metric", "mean-per-class", "--out", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&bin.stderr);
    assert!(bin.status.success(), "{stderr}");
    assert!(stderr.contains("460 labelled rows, 12-d features (5 feature rows without a label ignored)"), "{stderr}");
    let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let r = &got["result"];
    let want = &v["final_mean_per_class"];
    let close =
        |a: &serde_json::Value, b: &serde_json::Value| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-12;
    assert!(close(&r["wd"], &v["selected_wd_mean_per_class"]), "{r}");
    assert!(
        close(&r["accuracy"], &want["test_accuracy"])
            && close(&r["mean_per_class_accuracy"], &want["test_mean_per_class"]),
        "{r}"
    );
    assert_eq!(
        (r["metric"].as_str(), got["config"]["metric"].as_str()),
        (Some("mean_per_class"), Some("mean_per_class"))
    );
    let stdout = String::from_utf8_lossy(&bin.stdout);
    assert!(
        stdout.contains("test accuracy 77.50%, mean per-class accuracy 76.46% (160 test rows, 4 classes"),
        "{stdout}"
    );

    // Two labelled rows without features: refused, naming them.
    write_features(&d.join("features.parquet"), &all[2..], 0);
    let bin = probe("labels.parquet", &[]);
    let stderr = String::from_utf8_lossy(&bin.stderr);
    assert_eq!(bin.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2 of the 460 labelled rows") && stderr.contains("`train-0`, `train-1`"), "{stderr}");
    // An id labelled twice.
    write_features(&d.join("features.parquet"), &all, 0);
    let mut twice = all.clone();
    twice.push(7);
    write_labels(&d.join("twice.parquet"), &twice);
    let bin = probe("twice.parquet", &[]);
    let stderr = String::from_utf8_lossy(&bin.stderr);
    assert!(
        stderr.contains("lists `sample_id` `train-7` more than once (twice in train; 461 rows, 460 distinct)"),
        "{stderr}"
    );
    // No labelled id among the features' ids: both sides shown, and the hint names the usual cause.
    write_features(&d.join("features.parquet"), &[], 3);
    let bin = probe("labels.parquet", &[]);
    let stderr = String::from_utf8_lossy(&bin.stderr);
    assert_eq!(bin.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("none of the 460 labelled rows")
            && stderr.contains("the features tables' 3 ids e.g. `unlabelled-0`, `unlabelled-1`, `unlabelled-2`")
            && stderr.contains("written the same way"),
        "{stderr}"
    );
    write_features(&d.join("features.parquet"), &all, 0);

    // As pandas and polars write them: integer ids, labels dictionary-encoded (`category`),
    // features a variable-length list; `--out` into a folder that does not exist yet. The same
    // rows, so the same result.
    use arrow_array::builder::{Float32Builder as F32, ListBuilder};
    use arrow_array::{DictionaryArray, Int64Array};
    let int_ids = || Arc::new(Int64Array::from((0..n as i64).collect::<Vec<_>>())) as ArrayRef;
    let mut lists = ListBuilder::new(F32::new());
    for row in values.chunks(dim) {
        lists.values().append_slice(row);
        lists.append(true);
    }
    let batch =
        RecordBatch::try_from_iter([("sample_id", int_ids()), ("embedding", Arc::new(lists.finish()) as ArrayRef)])
            .unwrap();
    common::write_parquet(&d.join("features.parquet"), &batch);
    let dictionary: DictionaryArray<arrow_array::types::Int32Type> = labels.iter().map(String::as_str).collect();
    let batch = RecordBatch::try_from_iter([
        ("sample_id", int_ids()),
        ("label", Arc::new(dictionary) as ArrayRef),
        ("split", Arc::new(StringArray::from(split.clone())) as ArrayRef),
    ])
    .unwrap();
    common::write_parquet(&d.join("pandas.parquet"), &batch);
    let nested = d.join("new/folder/probe.json");
    let bin = probe("pandas.parquet", &["--metric", "mean-per-class", "--out", nested.to_str().unwrap()]);
    assert!(bin.status.success(), "{}", String::from_utf8_lossy(&bin.stderr));
    let again: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&nested).unwrap()).unwrap();
    assert_eq!(again["result"], got["result"]);
    // Rows of different lengths are refused.
    let mut lists = ListBuilder::new(F32::new());
    for (i, row) in values.chunks(dim).enumerate() {
        lists.values().append_slice(if i == 5 { &row[..dim - 1] } else { row });
        lists.append(true);
    }
    let batch =
        RecordBatch::try_from_iter([("sample_id", int_ids()), ("embedding", Arc::new(lists.finish()) as ArrayRef)])
            .unwrap();
    common::write_parquet(&d.join("features.parquet"), &batch);
    let bin = probe("pandas.parquet", &[]);
    let stderr = String::from_utf8_lossy(&bin.stderr);
    assert!(stderr.contains("the rows of `embedding` have different lengths (12 and 11)"), "{stderr}");
}

#[test]
fn the_bundled_probe_and_attribute_tables_read_as_documented() {
    // `data/gen_eval_tables.py`: per class 6 train, 2 val, 2 test; colour, shape, background.
    use curate::eval::compositionality::ComposeTable;
    use curate::eval::linear_probe::{ProbeTable, Split};
    let p = ProbeTable::read(Path::new("data/train_sample/probe.parquet"), "path").unwrap();
    let count = |s: Split| p.split.iter().filter(|&&x| x == s).count();
    assert_eq!((p.keys.len(), p.names.len(), p.skipped), (240, 24, 0));
    assert_eq!((count(Split::Train), count(Split::Val), count(Split::Test)), (144, 48, 48));
    let a = ComposeTable::read(Path::new("data/train_sample/attributes.parquet")).unwrap();
    assert_eq!((a.paths.len(), a.names.len(), a.skipped), (240, 14, 0));
    assert!(a.attributes.iter().all(|x| x.len() == 3));
    assert_eq!(a.paths, p.keys, "the same images in the same order");
    let first: Vec<&str> = a.attributes[0].iter().map(|&i| a.names[i as usize].as_str()).collect();
    assert_eq!(first[..2], ["red", "circle"]);
    assert!(first[2].ends_with(" background"), "{first:?}");
}
