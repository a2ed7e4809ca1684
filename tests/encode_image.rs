//! The `encode_image` stage run through real pipelines: the bundled ImageNet-21k-layout sample
//! (`data/imagenet21k_sample`, made by `data/gen_image_sample.py`) and a webdataset tar shard,
//! with the tiny test ResNet (`tests/fixtures/models/tiny_resnet.safetensors`). Embeddings
//! must equal the model's forward pass on the preprocessed images, in input order; bad images
//! must end up in the rejects table with their reason.

mod common;

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::RecordBatch;
use burn::tensor::Device;
use curate::models::image_encoder::{ImageArch, ImageEncoder};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn model() -> PathBuf {
    repo("tests/fixtures/models/tiny_resnet.safetensors")
}

/// A pipeline that reads the bundled ImageNet-21k sample and encodes it with `model` as `arch`,
/// 4 images a batch.
fn imagenet21k_pipeline(model: &Path, arch: &str) -> String {
    format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"{arch}\"\nbatch_size = 4\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        repo("data/imagenet21k_sample").to_string_lossy(),
        model.to_string_lossy()
    )
}

/// Embedding rows of all batches.
fn embeddings(batches: &[RecordBatch]) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for b in batches {
        let list = b.column_by_name("embedding").unwrap().as_fixed_size_list();
        let dim = list.value_length() as usize;
        let values = list.values().as_primitive::<Float32Type>().values();
        out.extend(values.chunks(dim).map(<[f32]>::to_vec));
    }
    out
}

/// The same images through `ImageEncoder` directly, one batch.
fn direct(files: &[PathBuf]) -> Vec<Vec<f32>> {
    let enc = ImageEncoder::load(&model(), ImageArch::TinyResnet, None, &Device::flex()).unwrap();
    let mut pixels = Vec::new();
    for f in files {
        pixels.extend(enc.preprocess.bytes_to_chw(&std::fs::read(f).unwrap()).unwrap());
    }
    enc.encode(pixels).unwrap().chunks(enc.dim).map(<[f32]>::to_vec).collect()
}

fn assert_same(got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            // Different batch sizes may change the gemm's blocking, hence not bit-exact.
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "row {i}: {a} vs {b}");
        }
    }
}

/// `(reason, sample_id, detail)` of every reject.
fn rejects(batches: &[RecordBatch]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for b in batches {
        let s = |n: &str| b.column_by_name(n).unwrap().as_string::<i32>().clone();
        let (reason, id, detail) = (s("reason"), s("sample_id"), s("detail"));
        for i in 0..b.num_rows() {
            out.push((reason.value(i).to_owned(), id.value(i).to_owned(), detail.value(i).to_owned()));
        }
    }
    out
}

#[test]
fn imagenet21k_sample_is_encoded_in_order_with_the_corrupt_file_rejected() {
    let root = repo("data/imagenet21k_sample");
    let toml = imagenet21k_pipeline(&model(), "tiny_resnet");
    let (dir, data, rej) = common::run_pipeline(&toml);
    let ids = common::strs(&data, "sample_id");
    let want_ids: Vec<String> = ["n01440764", "n02102040", "n03000684"]
        .iter()
        .flat_map(|s| (1..=3).map(move |i| format!("{s}/{s}_{i}.JPEG")))
        .collect();
    assert_eq!(ids, want_ids, "input order, corrupt file left out");
    let paths = common::strs(&data, "path");
    assert_eq!(paths[0], root.join("n01440764/n01440764_1.JPEG").to_string_lossy());
    let embedding = data[0].schema().field_with_name("embedding").unwrap().data_type().clone();
    assert!(matches!(embedding, arrow_schema::DataType::FixedSizeList(_, 256)), "{embedding}");
    let got = embeddings(&data);
    assert!(got.iter().all(|e| e.len() == 256));
    let files: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
    assert_same(&got, &direct(&files));

    let r = rejects(&rej);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].0.as_str(), r[0].1.as_str()), ("undecodable_image", "n03000684/n03000684_4.JPEG"));
    assert!(r[0].2.contains("n03000684_4.JPEG"), "detail names the file: {}", r[0].2);

    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["metadata"]["curate.image_arch"], "tiny_resnet");
    assert_eq!(manifest["metadata"]["curate.preprocess"], "imagenet");
    assert_eq!(manifest["metadata"]["curate.model"], model().to_string_lossy().as_ref());
    assert_eq!(manifest["rejects_by_reason"]["encode_image/undecodable_image"], 1);
}

/// A webdataset shard: `KEY.<ext>` image + `KEY.txt` caption per sample.
fn write_shard(path: &Path, samples: &[(&str, &str, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (key, ext, image) in samples {
        for (name, data) in
            [(format!("{key}.{ext}"), image.as_slice()), (format!("{key}.txt"), b"a caption".as_slice())]
        {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
    }
    b.finish().unwrap();
}

#[test]
fn images_in_webdataset_shards_are_read_by_shard_and_key() {
    let shards = tempfile::tempdir().unwrap();
    let img = |n: &str| std::fs::read(repo("tests/fixtures/images").join(n)).unwrap();
    write_shard(
        &shards.path().join("00000.tar"),
        &[
            ("000000000", "jpg", img("rgb_300x200.jpg")),
            ("000000001", "jpg", b"\xff\xd8 not really a jpeg".to_vec()),
            ("000000002", "png", img("gray_64x48.png")),
            ("000000003", "bmp", bmp_of(&img("rgb_37x23.png"))),
        ],
    );
    let pipeline = |extra: &str| {
        format!(
            "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_img2dataset\"\npath = {:?}\n\
             [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\n\
             preprocess = \"clip\"\nbatch_size = 2\n{extra}\n[[stage]]\ntype = \"write_parquet\"\n",
            shards.path().join("*.tar").to_string_lossy(),
            model().to_string_lossy()
        )
    };
    let (_dir, data, rej) =
        common::run_pipeline(&pipeline(&format!("shards_dir = {:?}", shards.path().to_string_lossy())));
    assert_eq!(common::strs(&data, "sample_id"), ["000000000", "000000002", "000000003"]);
    assert_eq!(common::strs(&data, "shard"), ["00000", "00000", "00000"]);
    assert_eq!(common::strs(&data, "key"), ["000000000", "000000002", "000000003"]);
    let enc = ImageEncoder::load(
        &model(),
        ImageArch::TinyResnet,
        Some(curate::models::preprocess::PreprocessPreset::Clip),
        &Device::flex(),
    )
    .unwrap();
    let mut pixels = enc.preprocess.bytes_to_chw(&img("rgb_300x200.jpg")).unwrap();
    pixels.extend(enc.preprocess.bytes_to_chw(&img("gray_64x48.png")).unwrap());
    // The BMP member (a format `read_img2dataset` takes) is the PNG's pixels.
    pixels.extend(enc.preprocess.bytes_to_chw(&img("rgb_37x23.png")).unwrap());
    let want: Vec<Vec<f32>> = enc.encode(pixels).unwrap().chunks(enc.dim).map(<[f32]>::to_vec).collect();
    assert_same(&embeddings(&data), &want);
    let r = rejects(&rej);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].0.as_str(), r[0].1.as_str()), ("undecodable_image", "000000001"));
    assert!(r[0].2.contains("`00000.tar` member `000000001`"), "detail names the image: {}", r[0].2);
    // As for every stage after the reader: no source file (its `row` is the stage's input row,
    // not a tar member index), and the caption as `raw`.
    assert_eq!(common::strs(&rej, "source_file"), [""]);
    assert_eq!(rej[0].column_by_name("raw").unwrap().as_binary::<i32>().value(0), b"a caption");

    // Without `shards_dir` the images cannot be found: every row would be a `missing_image`
    // reject, so the pipeline is refused before it runs.
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), pipeline(""), &[]).unwrap();
    let e = curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string();
    assert!(e.contains("stage `encode_image` reads images, but the rows it gets name a tar shard and a key"), "{e}");
    assert!(e.contains("without `shards_dir` every row would be rejected (`missing_image`)"), "{e}");
    assert!(e.contains("hint: set `shards_dir`"), "{e}");
}

/// `png` re-encoded as BMP.
fn bmp_of(png: &[u8]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::load_from_memory(png).unwrap().write_to(&mut out, image::ImageFormat::Bmp).unwrap();
    out.into_inner()
}

#[test]
fn the_samples_a_cut_shard_keeps_are_encoded() {
    // A shard cut inside its last image: `read_img2dataset` keeps the two samples before the
    // cut (`truncated_tar` for the third), and `encode_image` must find their images although
    // the shard cannot be read to its end.
    let shards = tempfile::tempdir().unwrap();
    let img = |n: &str| std::fs::read(repo("tests/fixtures/images").join(n)).unwrap();
    let path = shards.path().join("00000.tar");
    write_shard(&path, &[("k0", "png", img("rgb_37x23.png")), ("k1", "jpg", img("rgb_300x200.jpg"))]);
    let whole = std::fs::read(&path).unwrap();
    write_shard(
        &path,
        &[
            ("k0", "png", img("rgb_37x23.png")),
            ("k1", "jpg", img("rgb_300x200.jpg")),
            ("k2", "jpg", img("gray_45x61.jpg")),
        ],
    );
    // Without the end-of-archive blocks, the two samples end where k2's header starts; cut 100
    // bytes into k2's image data.
    let k2_at = whole.len() - 1024;
    let cut = std::fs::read(&path).unwrap()[..k2_at + 512 + 100].to_vec();
    std::fs::write(&path, cut).unwrap();
    let toml = format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_img2dataset\"\npath = {:?}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\nshards_dir = {:?}\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        path.to_string_lossy(),
        model().to_string_lossy(),
        shards.path().to_string_lossy()
    );
    let (_dir, data, rej) = common::run_pipeline(&toml);
    assert_eq!(common::strs(&data, "sample_id"), ["k0", "k1"]);
    let r = rejects(&rej);
    assert_eq!(r.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect::<Vec<_>>(), [("truncated_tar", "k2")]);
    let enc = ImageEncoder::load(&model(), ImageArch::TinyResnet, None, &Device::flex()).unwrap();
    let mut pixels = enc.preprocess.bytes_to_chw(&img("rgb_37x23.png")).unwrap();
    pixels.extend(enc.preprocess.bytes_to_chw(&img("rgb_300x200.jpg")).unwrap());
    let want: Vec<Vec<f32>> = enc.encode(pixels).unwrap().chunks(enc.dim).map(<[f32]>::to_vec).collect();
    assert_same(&embeddings(&data), &want);
}

#[test]
fn a_missing_file_is_a_missing_image_reject() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.tsv");
    let present = repo("tests/fixtures/images/rgb_37x23.png");
    std::fs::write(
        &table,
        format!("id\tpath\na\t{}\nb\t{}\n", present.display(), dir.path().join("gone.jpg").display()),
    )
    .unwrap();
    let toml = format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_table\"\npath = {:?}\nheader = true\ncheck_files = false\n\
         columns = {{ sample_id = \"id\", path = \"path\" }}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        table.to_string_lossy(),
        model().to_string_lossy()
    );
    let (_out, data, rej) = common::run_pipeline(&toml);
    assert_eq!(common::strs(&data, "sample_id"), ["a"]);
    let r = rejects(&rej);
    assert_eq!((r[0].0.as_str(), r[0].1.as_str()), ("missing_image", "b"));
    assert!(r[0].2.contains("gone.jpg"), "{}", r[0].2);
}

#[test]
fn config_errors_are_reported_before_any_image_is_read() {
    let toml = format!(
        "output_dir = \"out\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = \"no/such.safetensors\"\narch = \"resnet51\"\nbatch_size = 0\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        repo("data/imagenet21k_sample").to_string_lossy()
    );
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let err = curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string();
    assert!(err.contains("resnet51"), "{err}");
    let toml = format!(
        "output_dir = \"out\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"resnet50\"\nbatch_size = 0\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        repo("data/imagenet21k_sample").to_string_lossy(),
        model().to_string_lossy()
    );
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let err = curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string();
    assert!(err.contains("batch_size must be at least 1"), "{err}");
    // A wrong architecture for the checkpoint: the weights loader lists what does not fit.
    let toml = format!(
        "output_dir = \"out\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"resnet50\"\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        repo("data/imagenet21k_sample").to_string_lossy(),
        model().to_string_lossy()
    );
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let err = curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string();
    assert!(err.contains("does not fit the model") && err.contains("mis-shaped"), "{err}");
}

#[test]
fn vit_architectures_preprocess_like_clip_and_check_their_checkpoint() {
    // Unicom's own transform (cusa-and-pcmepp.md §1.1): Resize(224, bicubic), CenterCrop(224),
    // CLIP mean/std — the `clip` preset, the default for both ViT-B/32 layouts.
    use curate::models::preprocess::PreprocessPreset;
    for arch in [ImageArch::VitB32Clip, ImageArch::VitB32Unicom] {
        assert_eq!(arch.spec().1, PreprocessPreset::Clip, "{arch:?}");
    }
    assert_eq!(ImageArch::VitB32Unicom.name(), "vit_b32_unicom");
    // A ViT-B/32 checkpoint is 350 MB, so only the refusal is exercised here: the tiny test ViT
    // does not fit the B/32 layout (tests/vit.rs checks the layout and the numbers).
    let tiny_vit = repo("tests/fixtures/models/tiny_unicom.safetensors");
    let err = ImageEncoder::load(&tiny_vit, ImageArch::VitB32Unicom, None, &Device::flex()).err().unwrap();
    assert!(err.to_string().contains("does not fit the model"), "{err}");
}

#[test]
fn a_resumed_run_counts_the_images_the_killed_run_encoded() {
    // Each tar shard is a chunk; killed after its 3rd checkpoint, the run resumes past whole
    // chunks, and its report still counts every image written (a checkpoint saves the counts).
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    let img = std::fs::read(repo("tests/fixtures/images/gray_64x48.png")).unwrap();
    for s in 0..3 {
        let keys: Vec<String> = (0..8).map(|i| format!("{:09}", s * 8 + i)).collect();
        let samples: Vec<(&str, &str, Vec<u8>)> = keys.iter().map(|k| (k.as_str(), "png", img.clone())).collect();
        write_shard(&shards.join(format!("{s:05}.tar")), &samples);
    }
    // A copy of the model, which the test changes below.
    let weights = dir.path().join("tiny_resnet.safetensors");
    std::fs::copy(model(), &weights).unwrap();
    let pipeline = dir.path().join("p.toml");
    std::fs::write(
        &pipeline,
        format!(
            "output_dir = \"out\"\n[[stage]]\ntype = \"read_img2dataset\"\npath = {:?}\n\
             [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\nshards_dir = {:?}\nbatch_size = 4\n\
             [[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 4\n",
            shards.join("*.tar").to_string_lossy(),
            weights.to_string_lossy(),
            shards.to_string_lossy()
        ),
    )
    .unwrap();
    let run = |out: &str, kill: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_curate"));
        cmd.arg("run").arg(&pipeline).arg("--set").arg(format!("output_dir={:?}", dir.path().join(out)));
        if let Some(n) = kill {
            cmd.env("CURATE_KILL_AFTER_CHECKPOINTS", n);
        }
        let o = cmd.output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let report = |out: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(out).join("report.json")).unwrap()).unwrap()
    };
    assert!(run("fresh", None).0);
    assert_eq!(report("fresh")["stages"]["encode_image"]["images_encoded"], 24);
    assert!(!run("killed", Some("3")).0, "killed");
    let (ok, stderr) = run("killed", None);
    assert!(ok && stderr.contains("resuming"), "{stderr}");
    assert_eq!(report("killed"), report("fresh"));

    // The model replaced between the kill and the rerun (say, retrained): the shards kept would
    // hold the other model's embeddings, so the run starts over.
    assert!(!run("changed", Some("3")).0, "killed");
    let modified = std::fs::metadata(&weights).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_modified(modified + std::time::Duration::from_secs(1))
        .unwrap();
    let (ok, stderr) = run("changed", None);
    assert!(ok && !stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains("the stages' model and table files, changed since"), "{stderr}");

    // Replaced by one of the same size and time (`cp -p` of another checkpoint): its contents
    // tell, and the run starts over rather than mix the two models' embeddings.
    assert!(!run("same_stamp", Some("3")).0, "killed");
    let stamp = std::fs::metadata(&weights).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&weights, &bytes).unwrap();
    std::fs::File::options().write(true).open(&weights).unwrap().set_modified(stamp).unwrap();
    let (ok, stderr) = run("same_stamp", None);
    assert!(ok && !stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains("the stages' model and table files changed since (their contents)"), "{stderr}");
}

#[test]
fn rows_that_share_an_image_get_its_one_embedding_and_its_one_failure() {
    // COCO-style: an image per several captions. Rows a, c, e share one PNG, b and d another
    // file, f and g a missing one: every row keeps its place, shared rows get the same
    // embedding (equal to the image's encoded alone), and each row of the missing image is a
    // reject of its own.
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.tsv");
    let (one, two) = (repo("tests/fixtures/images/rgb_37x23.png"), repo("tests/fixtures/images/gray_64x48.png"));
    let gone = dir.path().join("gone.jpg");
    let rows = [("a", &one), ("b", &two), ("c", &one), ("d", &two), ("e", &one), ("f", &gone), ("g", &gone)];
    let mut text = "id\tpath\n".to_owned();
    for (id, p) in rows {
        text += &format!("{id}\t{}\n", p.display());
    }
    std::fs::write(&table, text).unwrap();
    let toml = format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_table\"\npath = {:?}\nheader = true\ncheck_files = false\n\
         columns = {{ sample_id = \"id\", path = \"path\" }}\n\
         [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\nbatch_size = 1\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        table.to_string_lossy(),
        model().to_string_lossy()
    );
    let (_out, data, rej) = common::run_pipeline(&toml);
    assert_eq!(common::strs(&data, "sample_id"), ["a", "b", "c", "d", "e"]);
    let got = embeddings(&data);
    let want = direct(&[one.clone(), two.clone()]);
    assert_same(&got, &[want[0].clone(), want[1].clone(), want[0].clone(), want[1].clone(), want[0].clone()]);
    assert_eq!((&got[0], &got[2], &got[1]), (&got[4], &got[4], &got[3]), "shared rows are bit-identical");
    let r = rejects(&rej);
    assert_eq!(
        r.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect::<Vec<_>>(),
        [("missing_image", "f"), ("missing_image", "g")]
    );
    assert!(r[1].2.contains("gone.jpg"), "{}", r[1].2);
}

#[test]
fn checkpoint_prefix_reads_the_encoder_of_a_training_checkpoint() {
    // The tiny ResNet under `backbone.` beside other tensors, as a self-supervised training
    // checkpoint keeps its encoder: with `checkpoint_prefix` the stage writes the embeddings of
    // the bare model; without it the stage is refused, the hint naming the prefix.
    let bytes = std::fs::read(model()).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let head = vec![0u8; 16];
    let mut parts: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().map(|(n, v)| (format!("backbone.{n}"), v)).collect();
    parts.push((
        "head.weight".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &head).unwrap(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let ssl = dir.path().join("ssl.safetensors");
    std::fs::write(&ssl, safetensors::serialize(parts, None).unwrap()).unwrap();
    let pipeline = |prefix: &str| {
        format!(
            "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\
             [[stage]]\ntype = \"encode_image\"\nmodel = {:?}\narch = \"tiny_resnet\"\n{prefix}\
             [[stage]]\ntype = \"write_parquet\"\n",
            repo("data/imagenet21k_sample").to_string_lossy(),
            ssl.to_string_lossy()
        )
    };
    let (_d, data, _) = common::run_pipeline(&pipeline("checkpoint_prefix = \"backbone.\"\n"));
    let files: Vec<PathBuf> = common::strs(&data, "path").iter().map(PathBuf::from).collect();
    assert_same(&embeddings(&data), &direct(&files));

    let toml = pipeline("").replace("{out}", &dir.path().join("out").to_string_lossy());
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("p.toml"), toml, &[]).unwrap();
    let e = curate::pipeline::plan::compile_doc(&doc).err().unwrap().to_string();
    assert!(e.contains("does not fit") && e.contains("checkpoint_prefix = \"backbone.\""), "{e}");
}

#[test]
fn an_fbnet_from_its_model_zoo_checkpoint_encodes_the_sample() {
    // `arch = "tiny_fbnet"` with mobile-vision's model zoo `model.pth` form: 64-d rows, each the
    // model's own features of its preprocessed image (ImageNet preprocessing by default).
    let pth = repo("tests/fixtures/models/fbnet/tiny_fbnet_model.pth");
    let toml = imagenet21k_pipeline(&pth, "tiny_fbnet");
    let (dir, data, _) = common::run_pipeline(&toml);
    let got = embeddings(&data);
    assert_eq!(got.len(), 9);
    assert!(got.iter().all(|e| e.len() == 64));
    let files: Vec<PathBuf> = common::strs(&data, "path").iter().map(PathBuf::from).collect();
    let enc = ImageEncoder::load(&pth, ImageArch::TinyFbnet, None, &Device::flex()).unwrap();
    assert_eq!(enc.preprocess.crop_px, 224);
    let mut pixels = Vec::new();
    for f in &files {
        pixels.extend(enc.preprocess.bytes_to_chw(&std::fs::read(f).unwrap()).unwrap());
    }
    let want: Vec<Vec<f32>> = enc.encode(pixels).unwrap().chunks(64).map(<[f32]>::to_vec).collect();
    assert_same(&got, &want);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["metadata"]["curate.image_arch"], "tiny_fbnet");
}
