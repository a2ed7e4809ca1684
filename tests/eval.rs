//! `curate eval` (issue 5): equality with the eccv-caption package on a seeded random case made
//! by `tests/fixtures/eval/make_eval_fixtures.py`, hand-computed cases (exact ties, positives
//! absent from the gallery, empty and missing COCO 1K folds) and the input errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
use arrow_schema::{Field, Schema};
use curate::eval::embeddings::{self, Captions, Images, Matrix};
use curate::eval::{evaluate, Annotations, Evaluation, Pair, PositivePairs, Similarity};

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

#[test]
fn cli_matches_the_eccv_caption_package() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["eval", "--image-embeddings"])
        .arg(fixture("images.parquet"))
        .arg("--caption-embeddings")
        .arg(fixture("captions.parquet"))
        .arg("--eccv-annotations")
        .arg(fixture(""))
        .arg("--out")
        .arg(out.path())
        .args(["--similarity", "dot", "--threads", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.starts_with("| metric | i2t | t2i | mean |"), "{stdout}");

    let read =
        |p: PathBuf| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    let got = read(out.path().join("metrics.json"));
    let want = read(fixture("expected_metrics.json"))["metrics"].clone();
    let (got, want) = (got.as_object().unwrap(), want.as_object().unwrap());
    assert_eq!(
        got.keys().collect::<std::collections::BTreeSet<_>>(),
        want.keys().collect::<std::collections::BTreeSet<_>>(),
        "same metric names as the package"
    );
    for (name, w) in want {
        for dir in ["i2t", "t2i"] {
            let (g, w) = (got[name][dir].as_f64().unwrap(), w[dir].as_f64().unwrap());
            assert!((g - w).abs() <= 1e-6, "{name} {dir}: curate {g}, eccv-caption {w}");
        }
    }
    for f in ["config.json", "metrics.md", "recall_at_k.svg"] {
        assert!(out.path().join(f).is_file(), "{f} written");
    }
    let md = std::fs::read_to_string(out.path().join("metrics.md")).unwrap();
    assert!(md.contains("| eccv_map_at_r |") && md.contains("exact score ties"), "{md}");
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

fn write(dir: &Path, name: &str, cols: Vec<(&str, ArrayRef)>) -> PathBuf {
    let fields: Vec<Field> = cols.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), false)).collect();
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
    let e = Annotations::read_dir(d).unwrap_err().to_string();
    assert!(e.contains("lacks cxc_image_to_caption.json") && e.contains("eccv-caption"), "{e}");
}
