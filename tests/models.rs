//! Encoders against their reference implementations: a random-weight BERT against
//! `transformers` (fixtures made by `tests/fixtures/models/make_bert_fixtures.py`), on every
//! CPU backend, and a checkpoint that does not fit the model refused with the full list.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use curate::models::pooling::Pooling;
use curate::models::text_encoder::TextEncoder;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models")
}

/// A temporary copy of the tiny BERT's folder without its weights file (config, tokenizer,
/// sentence-transformers settings), for a test to put weights of its own in.
fn tiny_bert_without_weights() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "sentence_bert_config.json"] {
        std::fs::copy(fixtures().join("tiny_bert").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("tiny_bert_expected.json")).unwrap()).unwrap()
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect()
}

/// Asserts every element within `tol·(1 + |want|)`; prints and returns the largest |error|.
fn assert_close(got: &[f32], want: &[Vec<f32>], tol: f32, what: &str) -> f32 {
    let dim = want[0].len();
    assert_eq!(got.len(), want.len() * dim, "{what}: size");
    let mut worst = 0f32;
    for (i, w) in want.iter().enumerate() {
        for (j, x) in w.iter().enumerate() {
            let g = got[i * dim + j];
            assert!((g - x).abs() <= tol * (1.0 + x.abs()), "{what}: row {i} col {j}: {g} vs {x}");
            worst = worst.max((g - x).abs());
        }
    }
    eprintln!("{what}: max |error| {worst:e}");
    worst
}

#[test]
fn tiny_bert_matches_transformers_on_every_backend() {
    // Python (make_bert_fixtures.py): states = BertModel(...)(ids, mask).last_hidden_state;
    // mean = (states * m).sum(1) / m.sum(1).clamp(min=1e-9); cls = states[:, 0]
    let e = expected();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let dir = fixtures().join("tiny_bert");
    for (name, device) in common::test_devices() {
        let mean = TextEncoder::load(&dir, Some(Pooling::Mean), Some(false), &device).unwrap();
        assert_eq!(mean.max_tokens(), e["max_seq_length"].as_u64().unwrap() as usize, "sentence_bert_config.json");
        let (ids, mask, [b, s]) = mean.tokenize(&captions).unwrap();
        let flat = |v: &serde_json::Value| -> Vec<i64> {
            v.as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
                .collect()
        };
        assert_eq!(
            (b, s),
            (captions.len(), e["ids"][0].as_array().unwrap().len()),
            "{name}: padded to longest, truncated"
        );
        assert_eq!(ids, flat(&e["ids"]), "token ids as the tokenizers library");
        assert_eq!(mask, flat(&e["mask"]));
        assert_close(
            &mean.encode(&captions).unwrap(),
            &rows(&e["mean"]),
            common::tolerance(name, 1e-5),
            &format!("{name} mean"),
        );
        let cls = TextEncoder::load(&dir, Some(Pooling::Cls), Some(false), &device).unwrap();
        assert_close(
            &cls.encode(&captions).unwrap(),
            &rows(&e["cls"]),
            common::tolerance(name, 1e-5),
            &format!("{name} cls"),
        );
        let norm = TextEncoder::load(&dir, Some(Pooling::Mean), Some(true), &device).unwrap();
        assert_close(
            &norm.encode(&captions).unwrap(),
            &rows(&e["mean_normalized"]),
            common::tolerance(name, 1e-5),
            &format!("{name} normalized"),
        );
    }
}

#[test]
fn tiny_roberta_matches_transformers() {
    // Python (make_roberta_fixtures.py): RobertaForMaskedLM(...).roberta(ids, mask)
    // .last_hidden_state, pooled as for BERT; byte-level BPE ids, positions from pad_token_id + 1.
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("tiny_roberta_expected.json")).unwrap()).unwrap();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let dir = fixtures().join("tiny_roberta");
    let flat = |v: &serde_json::Value| -> Vec<i64> {
        v.as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap())).collect()
    };
    for (name, device) in common::test_devices() {
        for (pooling, normalize, key) in
            [(Pooling::Mean, false, "mean"), (Pooling::Cls, false, "cls"), (Pooling::Mean, true, "mean_normalized")]
        {
            let enc = TextEncoder::load(&dir, Some(pooling), Some(normalize), &device).unwrap();
            let (ids, mask, _) = enc.tokenize(&captions).unwrap();
            assert_eq!((ids, mask), (flat(&e["ids"]), flat(&e["mask"])), "<s> ... </s>, padded with <pad> = 1");
            assert_close(
                &enc.encode(&captions).unwrap(),
                &rows(&e[key]),
                common::tolerance(name, 1e-5),
                &format!("{name} roberta {key}"),
            );
        }
    }
    // Its 18 positions less the 2 it reserves: 16 tokens at most.
    let enc = TextEncoder::load(&dir, None, None, &Device::flex()).unwrap();
    assert_eq!(enc.max_tokens(), 16);
    let long = "word ".repeat(100);
    assert_eq!(enc.tokenize(&[long.as_str()]).unwrap().2, [1, 16]);
}

#[test]
fn a_sharded_model_folder_loads_the_same_model() {
    // The tiny BERT's tensors split into two safetensors shards with a Hugging Face
    // `model.safetensors.index.json` (`weight_map`: name -> shard), as `save_pretrained` writes
    // a checkpoint past its shard size: the same embeddings, bit for bit. A tensor listed in
    // two shards is refused.
    let src = fixtures().join("tiny_bert");
    let dir = tiny_bert_without_weights();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let half = tensors.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let shard = safetensors::serialize(part.iter().map(|(n, v)| (n.clone(), v.clone())), None).unwrap();
        std::fs::write(dir.path().join(&file), shard).unwrap();
        for (n, _) in part {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let captions = ["a dog runs on the beach", "two red birds"];
    let device = Device::flex();
    let sharded = TextEncoder::load(dir.path(), Some(Pooling::Mean), Some(true), &device).unwrap();
    let whole = TextEncoder::load(&src, Some(Pooling::Mean), Some(true), &device).unwrap();
    assert_eq!(sharded.encode(&captions).unwrap(), whole.encode(&captions).unwrap());
    // What a run's resume stamps cover: the index and both shards.
    let names: Vec<String> = curate::models::weights::shard_files(dir.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    );
    assert!(curate::models::weights::shard_files(&src).is_empty());

    // The first shard's first tensor listed again in the second shard.
    let (first, view) = &tensors[0];
    let mut again: Vec<(String, safetensors::tensor::TensorView)> =
        tensors[half..].iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    again.push((first.clone(), view.clone()));
    std::fs::write(dir.path().join("model-00002-of-00002.safetensors"), safetensors::serialize(again, None).unwrap())
        .unwrap();
    let e = TextEncoder::load(dir.path(), None, None, &device).err().unwrap().to_string();
    assert!(e.contains(&format!("tensor `{first}` is in two shards")), "{e}");
}

#[test]
fn a_bert_folder_with_only_vocab_txt_tokenizes_as_transformers() {
    // make_vocab_txt_fixture.py: BertTokenizerFast's conversion of the folders (and the slow
    // BertTokenizer, which agrees) on captions that reach every step: control characters,
    // accents, Chinese characters, punctuation, special tokens in the text, a 120-letter word.
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("vocab_txt_expected.json")).unwrap()).unwrap();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for folder in ["vocab_txt_bert", "vocab_txt_bert_cased"] {
        let dir = fixtures().join(folder);
        let (tok, from) = curate::models::text_encoder::load_tokenizer_file(&dir).unwrap();
        assert_eq!(from, dir.join("vocab.txt"));
        let want: Vec<Vec<u32>> = e[folder]["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
            .collect();
        assert_eq!(e[folder]["ids"], e[folder]["slow_ids"], "the fixture's two references agree");
        for (c, w) in captions.iter().zip(&want) {
            assert_eq!(tok.encode(*c, true).unwrap().get_ids(), &w[..], "{folder}: {c:?}");
        }
    }
    // Cased and uncased differ where the text has capitals.
    assert_ne!(e["vocab_txt_bert"]["ids"][1], e["vocab_txt_bert_cased"]["ids"][1]);
}

#[test]
fn tiny_distilbert_matches_transformers() {
    // Python: DistilBertModel(...)(ids, mask).last_hidden_state, pooled as for BERT.
    let e = expected();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let dir = fixtures().join("tiny_distilbert");
    for (name, device) in common::test_devices() {
        for (pooling, normalize, key) in
            [(Pooling::Mean, false, "mean"), (Pooling::Cls, false, "cls"), (Pooling::Mean, true, "mean_normalized")]
        {
            let enc = TextEncoder::load(&dir, Some(pooling), Some(normalize), &device).unwrap();
            assert_close(
                &enc.encode(&captions).unwrap(),
                &rows(&e["distilbert"][key]),
                common::tolerance(name, 1e-5),
                &format!("{name} {key}"),
            );
        }
    }
}

#[test]
fn length_sorted_batches_give_each_caption_its_own_embedding_in_input_order() {
    // encode_many sorts by length and batches; every row must equal the caption encoded
    // alone (padding never changes an embedding) and come back at its input position.
    let e = expected();
    let mut captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    captions.push("a");
    captions.push("a much longer caption than any of the others, with many words in it");
    let enc =
        TextEncoder::load(&fixtures().join("tiny_bert"), Some(Pooling::Mean), Some(true), &Device::flex()).unwrap();
    let alone: Vec<Vec<f32>> = captions.iter().map(|c| enc.encode(&[c]).unwrap()).collect();
    for (batch, parallel) in [(1, false), (2, true), (3, false), (100, true)] {
        let got = enc.encode_many(&captions, batch, parallel).unwrap();
        assert_close(&got, &alone, 1e-5, &format!("batch {batch}"));
    }
}

#[test]
fn a_model_folder_with_only_pytorch_model_bin_loads_the_same_model() {
    // Older Hugging Face models (DeCLUTR's among them) ship `pytorch_model.bin`, not
    // safetensors: the tiny BERT's tensors saved so (legacy `torch.save` format,
    // torch/make_torch_checkpoints.py) give the same embeddings, bit for bit.
    let dir = tiny_bert_without_weights();
    std::fs::copy(fixtures().join("torch/tiny_bert_pytorch_model.bin"), dir.path().join("pytorch_model.bin")).unwrap();
    let captions = ["a dog runs on the beach", "two red birds"];
    let device = Device::flex();
    let bin = TextEncoder::load(dir.path(), Some(Pooling::Mean), Some(true), &device).unwrap();
    let st = TextEncoder::load(&fixtures().join("tiny_bert"), Some(Pooling::Mean), Some(true), &device).unwrap();
    let got = bin.encode(&captions).unwrap();
    assert!(got.iter().any(|v| *v != 0.0));
    assert_eq!(got, st.encode(&captions).unwrap());
}

#[test]
fn a_checkpoint_that_does_not_fit_is_refused_with_every_problem() {
    // Missing, mis-shaped (one row short) and unexpected tensors, all in one checkpoint.
    let dir = tempfile::tempdir().unwrap();
    common::write_broken_model_folder(
        &fixtures().join("tiny_bert"),
        dir.path(),
        "encoder.layer.1.output.dense.bias",
        "encoder.layer.0.attention.self.key.weight",
        "encoder.layer.9.extra.weight",
    );
    let err = TextEncoder::load(dir.path(), None, None, &Device::flex()).err().expect("refused").to_string();
    assert!(err.contains("1 missing:\n    encoder.layer.1.output.dense.bias [32]"), "{err}");
    assert!(
        err.contains("1 mis-shaped:\n    encoder.layer.0.attention.self.key.weight: [31, 32], expected [32, 32]"),
        "{err}"
    );
    assert!(err.contains("1 unexpected:\n    encoder.layer.9.extra.weight"), "{err}");
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn a_pooling_or_module_curate_does_not_compute_is_refused() {
    // sentence-transformers folders may ask for max pooling, two poolings concatenated, or a
    // Dense layer after the pooling: computing mean pooling instead would be silently wrong.
    let copy = |dir: &Path| {
        let src = fixtures().join("tiny_mpnet");
        for entry in common::files_under(&src) {
            let to = dir.join(entry.strip_prefix(&src).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, &to).unwrap();
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("m");
    copy(&folder);
    assert!(TextEncoder::load(&folder, None, None, &Device::flex()).is_ok());
    let pool = folder.join("1_Pooling/config.json");
    let text = std::fs::read_to_string(&pool).unwrap();
    for key in [
        "\"pooling_mode_mean_tokens\": true",
        "\"pooling_mode_max_tokens\": false",
        "\"pooling_mode_cls_token\": false",
    ] {
        assert!(text.contains(key), "{text}");
    }
    let max = text
        .replace("\"pooling_mode_mean_tokens\": true", "\"pooling_mode_mean_tokens\": false")
        .replace("\"pooling_mode_max_tokens\": false", "\"pooling_mode_max_tokens\": true");
    std::fs::write(&pool, max).unwrap();
    let e = TextEncoder::load(&folder, None, None, &Device::flex()).err().expect("max pooling refused").to_string();
    assert!(e.contains("asks for pooling `pooling_mode_max_tokens`, which curate does not compute"), "{e}");
    // A pooling chosen in the stage overrides the folder's.
    assert!(TextEncoder::load(&folder, Some(Pooling::Mean), None, &Device::flex()).is_ok());
    // Two poolings at once (sentence-transformers concatenates them).
    let both = text.replace("\"pooling_mode_cls_token\": false", "\"pooling_mode_cls_token\": true");
    std::fs::write(&pool, both).unwrap();
    let e = TextEncoder::load(&folder, None, None, &Device::flex()).err().expect("two poolings refused").to_string();
    assert!(e.contains("`pooling_mode_cls_token`, `pooling_mode_mean_tokens`"), "{e}");
    std::fs::write(&pool, &text).unwrap();
    // A Dense module after the pooling.
    let modules = folder.join("modules.json");
    let m = std::fs::read_to_string(&modules).unwrap().replace("models.Normalize", "models.Dense");
    std::fs::write(&modules, m).unwrap();
    let e = TextEncoder::load(&folder, None, None, &Device::flex()).err().expect("Dense refused").to_string();
    assert!(e.contains("lists a module curate does not run: `sentence_transformers.models.Dense`"), "{e}");
}

#[test]
fn encode_text_stage_writes_embeddings_in_input_order() {
    use arrow_array::cast::AsArray;
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures().join("tiny_bert");
    let cc = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/readers/cc/cc_train.tsv");
    let toml = format!(
        "output_dir = {:?}\n[[stage]]\ntype = \"read_cc_tsv\"\npath = {:?}\n[[stage]]\ntype = \"encode_text\"\nmodel = {:?}\nbatch_size = 3\n[[stage]]\ntype = \"write_parquet\"\n",
        dir.path().join("out").to_string_lossy(),
        cc.to_string_lossy(),
        model.to_string_lossy()
    );
    let toml_text = toml.clone();
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let plan = curate::pipeline::plan::compile_doc(&doc).unwrap();
    curate::pipeline::run(plan, &Default::default()).unwrap();
    let file = dir.path().join("out/data/part-00000.parquet");
    let batches = curate::io::parquet::read_file(&file).unwrap();
    let b = &batches[0];
    assert_eq!(b.num_columns(), 3);
    let ids = b.column(0).as_string::<i32>();
    assert_eq!(ids.value(0), "cc_train.tsv#1");
    let caps: Vec<&str> = b.column(1).as_string::<i32>().iter().map(|c| c.unwrap()).collect();
    assert_eq!(caps.len(), 13);
    let emb = b.column(2).as_fixed_size_list();
    assert_eq!(emb.value_length(), 32);
    let values = emb.values().as_primitive::<arrow_array::types::Float32Type>();
    // The same texts through the encoder directly: same numbers, in the same order.
    let enc = TextEncoder::load(&model, None, None, &Device::flex()).unwrap();
    let direct = enc.encode(&caps).unwrap();
    assert_eq!(values.len(), direct.len());
    for (a, d) in values.values().iter().zip(&direct) {
        assert!((a - d).abs() < 1e-5, "{a} vs {d}");
    }
    // The model is recorded in the file's metadata.
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&file).unwrap()).unwrap(),
    )
    .file_metadata()
    .key_value_metadata()
    .cloned()
    .unwrap();
    assert!(meta.iter().any(|kv| kv.key == "curate.model" && kv.value.as_deref() == Some(model.to_str().unwrap())));
    // With `pre_caption` (CUSA's teacher input, spec §1.2): the texts after it are embedded, and
    // the column keeps them as read.
    let out2 = dir.path().join("out2");
    let toml2 = toml_text
        .replace(&format!("{:?}", dir.path().join("out").to_string_lossy()), &format!("{:?}", out2.to_string_lossy()))
        .replace("batch_size = 3\n", "batch_size = 3\npre_caption = true\n");
    assert!(toml2.contains("pre_caption = true") && toml2.contains("out2"), "{toml2}");
    let doc = curate::pipeline::config::ConfigDoc::parse(Path::new("t.toml"), toml2, &[]).unwrap();
    curate::pipeline::run(curate::pipeline::plan::compile_doc(&doc).unwrap(), &Default::default()).unwrap();
    let pre = curate::io::parquet::read_file(&out2.join("data/part-00000.parquet")).unwrap();
    let pre_caps: Vec<&str> = pre[0].column(1).as_string::<i32>().iter().map(|c| c.unwrap()).collect();
    assert_eq!(pre_caps, caps, "the column keeps the text as read");
    let normalised: Vec<String> = caps.iter().map(|c| curate::text::pre_caption(c, 64).unwrap()).collect();
    assert!(normalised.iter().zip(&caps).any(|(n, c)| n != c), "the fixture has captions pre_caption changes");
    let texts: Vec<&str> = normalised.iter().map(String::as_str).collect();
    let direct = enc.encode(&texts).unwrap();
    let got = pre[0].column(2).as_fixed_size_list().values().as_primitive::<arrow_array::types::Float32Type>().clone();
    for (a, d) in got.values().iter().zip(&direct) {
        assert!((a - d).abs() < 1e-5, "{a} vs {d}");
    }
    // The text column cannot be one the output has already (two `sample_id` columns would make
    // a file readers refuse).
    let doc = curate::pipeline::config::ConfigDoc::parse(
        Path::new("t.toml"),
        toml_text,
        &["encode_text.column=sample_id".into()],
    )
    .unwrap();
    let e = curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string();
    assert!(e.contains("`sample_id` is a column of the output already"), "{e}");
}

/// Loads `file` as `config` and checks its pooled features on the input of the fixture
/// `expected` against its `key`, on every device and both ways of convolving: burn's kernel (the
/// CPU default) and im2col + one matrix product (the GPU default); the fixtures have the 7×7 stem,
/// strided 3×3 and strided 1×1 convolutions. On a GPU the im2col products run in TF32 through 13
/// convolutions and BatchNorms: rounding both operands of every product to TF32 on the CPU gives
/// errors up to 1.9e-2·(1 + |want|) here (an H100 gave 6.4e-3 at the first element over 5e-3), so
/// the GPU's im2col is held to 5e-2; a wrong convolution is off by O(1).
fn check_resnet(file: &str, config: &curate::models::resnet::ResNetConfig, expected: &str, key: &str, dim: usize) {
    use burn::tensor::{Tensor, TensorData};
    use curate::models::resnet::{ConvLowering, ResNet};
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(expected)).unwrap()).unwrap();
    let shape: Vec<usize> = e["input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let input: Vec<f32> = e["input"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    for (name, device) in common::test_devices() {
        for lowering in [ConvLowering::Native, ConvLowering::Im2col] {
            let model = ResNet::load(&fixtures().join(file), config, &device).unwrap().with_conv_lowering(lowering);
            assert_eq!(model.feature_dim(), dim, "{file}");
            let x = Tensor::<4>::from_data(
                TensorData::new(input.clone(), [shape[0], shape[1], shape[2], shape[3]]),
                &device,
            );
            let got = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
            assert_close(
                &got,
                &rows(&e[key]),
                match (name, lowering) {
                    ("cuda", ConvLowering::Im2col) => 5e-2,
                    _ => common::tolerance(name, 1e-4),
                },
                &format!("{name} {lowering:?} {file} features"),
            );
        }
    }
}

#[test]
fn tiny_resnet_matches_torchvision() {
    // Python (make_resnet_fixtures.py): torchvision ResNet(Bottleneck, [1, 1, 1, 1]) with stem
    // width 8, eval mode; features = flatten(avgpool(layer4(...(maxpool(relu(bn1(conv1(x)))))))).
    use curate::models::resnet::{ConvLowering, ResNetConfig};
    check_resnet("tiny_resnet.safetensors", &ResNetConfig::tiny(), "tiny_resnet_expected.json", "features", 256);
    assert_eq!(ConvLowering::for_device(&Device::flex()), ConvLowering::Native);
}

#[test]
fn a_resnet_loads_from_under_a_prefix_of_a_self_supervised_checkpoint() {
    // A MoCo-style checkpoint: the query encoder under `module.encoder_q.`, the key encoder
    // under `module.encoder_k.` and the queue beside them. Under the prefix, the same model as
    // the bare state dict; the rest is left out, not reported unused. A prefix naming nothing
    // is refused with the names' first parts.
    use burn::tensor::{Tensor, TensorData};
    use curate::models::resnet::{ResNet, ResNetConfig};
    let bytes = std::fs::read(fixtures().join("tiny_resnet.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let queue_data = vec![0u8; 4 * 8];
    let queue = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 4], &queue_data).unwrap();
    let mut parts: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
    for (n, v) in st.tensors() {
        parts.push((format!("module.encoder_q.{n}"), v.clone()));
        parts.push((format!("module.encoder_k.{n}"), v));
    }
    parts.push(("module.queue".into(), queue));
    let dir = tempfile::tempdir().unwrap();
    let moco = dir.path().join("moco.safetensors");
    std::fs::write(&moco, safetensors::serialize(parts, None).unwrap()).unwrap();
    let device = Device::flex();
    let c = ResNetConfig::tiny();
    let bare = ResNet::load(&fixtures().join("tiny_resnet.safetensors"), &c, &device).unwrap();
    let under = ResNet::load_under(&moco, Some("module.encoder_q."), &c, &device).unwrap();
    let x = || {
        Tensor::<4>::from_data(
            TensorData::new((0..2 * 3 * 32 * 32).map(|i| (i % 17) as f32 / 17.0).collect::<Vec<_>>(), [2, 3, 32, 32]),
            &device,
        )
    };
    assert_eq!(
        under.forward(x()).into_data().try_to_vec::<f32>().unwrap(),
        bare.forward(x()).into_data().try_to_vec::<f32>().unwrap()
    );
    let e = ResNet::load(&moco, &c, &device).err().unwrap().to_string();
    assert!(e.contains("does not fit"), "without the prefix: {e}");
    assert!(
        e.contains("under `module.encoder_k.`, `module.encoder_q.`: read one with `checkpoint_prefix`"),
        "the hint names where the model is: {e}"
    );
    let e = ResNet::load_under(&moco, Some("backbone."), &c, &device).err().unwrap().to_string();
    assert!(e.contains("has no tensor under `backbone.`") && e.contains("module.encoder_q."), "{e}");
}

#[test]
fn resnet50_has_torchvisions_exact_layout() {
    // Every tensor of torchvision's resnet50() state dict, by name and shape
    // (resnet50_layout.json): loading zeros of exactly those shapes must leave nothing
    // missing, mis-shaped or unexpected (`fc` is the classifier the feature extractor drops;
    // `num_batches_tracked` are integer buffers, never read).
    use curate::models::resnet::{ResNet, ResNetConfig};
    let layout: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("resnet50_layout.json")).unwrap()).unwrap();
    let w = common::zeros_of_layout(&layout);
    let model = ResNet::from_weights(&ResNetConfig::resnet50(), &w, &Device::flex());
    w.finish(&ResNet::IGNORED).unwrap();
    assert_eq!(model.feature_dim(), 2048);
}

#[test]
fn basic_block_and_wide_resnets_match_torchvision() {
    // Python (make_resnet_variant_fixtures.py): torchvision ResNet(BasicBlock, [1, 1, 1, 1]) with
    // stem width 8, and ResNet(Bottleneck, [1, 1, 1, 1], width_per_group=128) with stem width 4,
    // eval mode, pooled features.
    use curate::models::resnet::{BlockKind, ResNetConfig};
    let expected = "tiny_resnet_variants_expected.json";
    let basic = ResNetConfig { block: BlockKind::Basic, ..ResNetConfig::tiny() };
    check_resnet("tiny_resnet_basic.safetensors", &basic, expected, "basic", 64);
    let wide = ResNetConfig { width: 4, width_per_group: 128, ..ResNetConfig::tiny() };
    check_resnet("tiny_wide_resnet.safetensors", &wide, expected, "wide", 128);
}

#[test]
fn resnet34_and_wide_resnet50_2_have_torchvisions_exact_layouts() {
    // As resnet50's: every tensor of torchvision's resnet34() and wide_resnet50_2() by name
    // and shape, nothing missing, mis-shaped or unexpected.
    use curate::models::resnet::{ResNet, ResNetConfig};
    for (file, config, dim) in [
        ("resnet34_layout.json", ResNetConfig::resnet34(), 512),
        ("wide_resnet50_2_layout.json", ResNetConfig::wide_resnet50_2(), 2048),
    ] {
        let layout: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join(file)).unwrap()).unwrap();
        let w = common::zeros_of_layout(&layout);
        let model = ResNet::from_weights(&config, &w, &Device::flex());
        w.finish(&ResNet::IGNORED).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(model.feature_dim(), dim, "{file}");
    }
    assert_eq!(ResNetConfig::resnet18().feature_dim(), 512);
}

#[test]
fn im2col_convolutions_equal_burns_kernel_on_odd_non_square_images() {
    // The GPU's im2col lowering against burn's convolution on sizes where the strided 3×3, 1×1
    // and 7×7 convolutions' last window is cut short: 37 × 29 (odd, not square).
    use burn::tensor::{Distribution, Tensor};
    use curate::models::resnet::{ConvLowering, ResNet, ResNetConfig};
    use curate::models::weights::Weights;
    let device = Device::flex();
    let model = ResNet::from_weights(&ResNetConfig::tiny(), &Weights::random(7), &device);
    let x = Tensor::<4>::random([2, 3, 37, 29], Distribution::Normal(0.0, 1.0), &device);
    let native = model.clone().with_conv_lowering(ConvLowering::Native).forward(x.clone());
    let im2col = model.with_conv_lowering(ConvLowering::Im2col).forward(x);
    let native = native.into_data().try_to_vec::<f32>().unwrap();
    let im2col = im2col.into_data().try_to_vec::<f32>().unwrap();
    assert_eq!((native.len(), im2col.len()), (2 * 256, 2 * 256));
    assert!(native.iter().any(|v| *v != 0.0), "features are not all zero");
    for (i, (a, b)) in im2col.iter().zip(&native).enumerate() {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "feature {i}: {a} vs {b}");
    }
}

#[test]
fn im2col_convolutions_back_propagate_as_burns_kernel() {
    // Training on a GPU back-propagates through the im2col lowering (strided views, stack, and
    // in training the batch's columns in groups of images): every parameter's gradient and the
    // input's must equal those through burn's convolution.
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::{Tensor, TensorData};
    use curate::models::resnet::{ConvLowering, ResNet, ResNetConfig};
    use curate::models::weights::Weights;
    struct Grads<'a>(&'a burn::tensor::Gradients, Vec<Vec<f32>>);
    impl ModuleVisitor for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = param.val().grad(self.0) {
                self.1.push(g.into_data().try_to_vec::<f32>().unwrap());
            }
        }
    }
    let device = Device::flex().autodiff();
    let model = ResNet::from_weights(&ResNetConfig::tiny(), &Weights::random(3), &device);
    // Fixed inputs: with burn's unseeded generator about one draw in 30 made a BatchNorm of
    // this batch of 2 ill-conditioned enough to part the two lowerings' roundings by ~1e-3.
    // Seeded (`Device::seed`, which is process-wide, so other tests could draw in between), 40
    // draws stayed under 1.4e-5 against the tolerance's 1e-4; these fixed inputs give 6.2e-6.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut normal = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // xorshift64*, then the sum of 4 uniforms (mean 0, variance 1).
                (0..4)
                    .map(|_| {
                        state ^= state >> 12;
                        state ^= state << 25;
                        state ^= state >> 27;
                        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                    })
                    .sum::<f32>()
                    * 3f32.sqrt()
            })
            .collect()
    };
    let x = Tensor::<4>::from_data(TensorData::new(normal(2 * 3 * 35 * 33), [2, 3, 35, 33]), &device);
    let direction = Tensor::<2>::from_data(TensorData::new(normal(2 * 256), [2, 256]), &device);
    let gradients = |lowering: ConvLowering| {
        let x = x.clone().require_grad();
        let model = model.clone().with_conv_lowering(lowering);
        let grads = (model.forward(x.clone()) * direction.clone()).sum().backward();
        let mut all = Grads(&grads, Vec::new());
        model.visit(&mut all);
        all.1.push(x.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap());
        all.1
    };
    let (native, im2col) = (gradients(ConvLowering::Native), gradients(ConvLowering::Im2col));
    // Every convolution and BatchNorm weight and bias, and the input.
    assert!(native.len() > 2 * 13, "{} gradients", native.len());
    assert_eq!(native.len(), im2col.len());
    for (k, (a, b)) in im2col.iter().zip(&native).enumerate() {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0, "gradient {k} is zero");
        assert_eq!(a.len(), b.len(), "gradient {k}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-4 * scale, "gradient {k} element {i}: {x} vs {y} (scale {scale})");
        }
    }
}

#[test]
fn staged_batch_norm_trains_as_burns() {
    // On a GPU a training BatchNorm computes its statistics as staged sums
    // (`resnet::staged_batch_norm`, which `batch_norm` takes with the im2col lowering). Output,
    // every gradient and the running statistics after the step must equal the CPU lowering's
    // (burn's fused training kernel; both keep PyTorch's unbiased running variance, which
    // `resnet`'s own test checks by hand). Epsilon is large and channel 4 nearly constant, so a lost epsilon shows.
    use burn::module::Param;
    use burn::tensor::{Tensor, TensorData};
    use curate::models::resnet::{batch_norm, staged_batch_norm, ConvLowering};
    use curate::models::weights::Weights;
    let device = Device::flex().autodiff();
    let (c, shape, eps) = (5, [3, 5, 7, 6], 0.05);
    let wave = |n: usize, a: f32, b: f32, o: f32| (0..n).map(|i| o + a * ((i as f32) * b).sin()).collect::<Vec<f32>>();
    let parts = || {
        vec![
            ("bn.weight".to_string(), vec![c], wave(c, 0.7, 1.3, 1.0)),
            ("bn.bias".to_string(), vec![c], wave(c, 0.4, 2.1, 0.1)),
            ("bn.running_mean".to_string(), vec![c], wave(c, 0.5, 0.7, 0.2)),
            ("bn.running_var".to_string(), vec![c], wave(c, 0.3, 1.9, 1.5)),
        ]
    };
    let n: usize = shape.iter().product();
    // Channels with their own offsets and spreads, so mean and variance both matter.
    let values: Vec<f32> = (0..n)
        .map(|i| {
            let spread = if (i / 42) % 5 == 4 { 0.01 } else { 3.0 };
            spread * ((i * 7919 % 101) as f32 / 101.0 - 0.5) + ((i / 42) % 5) as f32
        })
        .collect();
    let direction = Tensor::<4>::from_data(TensorData::new(wave(n, 1.0, 0.37, 0.0), shape), &device);
    let v = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let v4 = |t: Tensor<4>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let run = |staged: bool| {
        let bn = Weights::from_parts(parts()).batch_norm("bn", c, eps, &device);
        let x = Tensor::<4>::from_data(TensorData::new(values.clone(), shape), &device).require_grad();
        let out =
            if staged { staged_batch_norm(&bn, x.clone()) } else { batch_norm(&bn, x.clone(), ConvLowering::Native) };
        let grads = (out.clone() * direction.clone()).sum().backward();
        vec![
            v4(out),
            v4(x.grad(&grads).unwrap()),
            v(bn.gamma.val().grad(&grads).unwrap()),
            v(bn.beta.val().grad(&grads).unwrap()),
            v(bn.running_mean.value_sync()),
            v(bn.running_var.value_sync()),
        ]
    };
    let (staged, burn) = (run(true), run(false));
    let names = ["output", "input gradient", "gamma gradient", "beta gradient", "running mean", "running variance"];
    for ((name, a), b) in names.iter().zip(&staged).zip(&burn) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.1, "{name} is all but zero");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * scale, "{name} [{i}]: {x} vs {y}");
        }
    }
    // The running statistics moved (momentum 0.1) from their starting values.
    assert!((staged[4][0] - 0.2).abs() > 1e-3, "running mean {:?}", staged[4]);
    // `batch_norm` takes the staged path only in training on an autodiff device: a layer whose
    // training flag is off, or a device without autodiff, normalises with the running statistics
    // and leaves them as they were.
    let start = wave(c, 0.5, 0.7, 0.2);
    let mut frozen = Weights::from_parts(parts()).batch_norm("bn", c, eps, &device);
    frozen.training = Param::from_bool(false);
    let plain = Device::flex();
    let inference = Weights::from_parts(parts()).batch_norm("bn", c, eps, &plain);
    for (bn, device) in [(&frozen, &device), (&inference, &plain)] {
        let x = Tensor::<4>::from_data(TensorData::new(values.clone(), shape), device);
        let out = v4(batch_norm(bn, x.clone(), ConvLowering::Im2col));
        assert_eq!(v(bn.running_mean.value_sync()), start, "the running mean was left alone");
        let want = v4(bn.forward(x));
        assert_eq!(out, want, "the running statistics normalise");
    }
}

#[test]
fn a_tokenizer_past_the_models_vocabulary_is_refused_at_load() {
    // The tiny BERT's tokenizer has 125 tokens and its `vocab_size` is 125. A token more, a
    // stray id with the count unchanged, a special token of the post-processor or a pad id past
    // the table would each let ids index past the embedding table, a panic mid-run.
    let src = fixtures().join("tiny_bert");
    let json = |f: &str| -> serde_json::Value { serde_json::from_slice(&std::fs::read(src.join(f)).unwrap()).unwrap() };
    let (mut more, mut stray, mut special, mut pad, mut wide_pad) = (
        json("tokenizer.json"),
        json("tokenizer.json"),
        json("tokenizer.json"),
        json("config.json"),
        json("config.json"),
    );
    more["model"]["vocab"]["zzzz"] = 125.into();
    stray["model"]["vocab"]["dog"] = 900.into();
    assert_eq!(stray["model"]["vocab"].as_object().unwrap().len(), 125, "the entry count alone fits");
    special["post_processor"]["special_tokens"]["[CLS]"]["ids"] = serde_json::json!([500]);
    pad["pad_token_id"] = 125.into();
    // Past u32: it must not wrap to 0 (a valid id).
    wide_pad["pad_token_id"] = 4_294_967_296u64.into();
    for (file, changed, want) in [
        ("tokenizer.json", more, "tokenizer.json`: token `zzzz` has id 125"),
        ("tokenizer.json", stray, "tokenizer.json`: token `dog` has id 900"),
        ("tokenizer.json", special, "special token `[CLS]` (inserted by its `post_processor`) has id 500"),
        ("config.json", pad, "config.json`: the pad id is 125"),
        ("config.json", wide_pad, "config.json`: the pad id is 4294967295"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "sentence_bert_config.json", "tokenizer.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::write(dir.path().join(file), changed.to_string()).unwrap();
        let e = match TextEncoder::load(dir.path(), None, None, &Device::flex()) {
            Ok(_) => panic!("{want}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want) && e.contains("the model's `vocab_size` is 125"), "{want}: {e}");
        assert!(e.contains("hint:"), "{e}");
    }
}

#[test]
fn encode_text_rejects_rows_with_no_text() {
    use arrow_array::cast::AsArray;
    // A label column can be empty where readers reject blank captions; nothing to embed there.
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.csv");
    std::fs::write(&table, "id,caption,label\na,a dog,dog\nb,a cat,\nc,a cow,\"  \"\n").unwrap();
    let toml = format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_table\"\npath = {:?}\n\
         columns = {{ sample_id = \"id\", caption = \"caption\", label_text = \"label\" }}\n\
         [[stage]]\ntype = \"encode_text\"\nmodel = {:?}\ncolumn = \"label_text\"\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        table.to_string_lossy(),
        fixtures().join("tiny_bert").to_string_lossy()
    );
    let (_dir, data, rejects) = common::run_pipeline(&toml);
    assert_eq!(common::strs(&data, "sample_id"), ["a"]);
    assert_eq!(common::strs(&rejects, "sample_id"), ["b", "c"]);
    assert_eq!(common::strs(&rejects, "reason"), ["no_caption", "no_caption"]);
    assert_eq!(common::strs(&rejects, "stage"), ["encode_text", "encode_text"]);
    let raw: Vec<&[u8]> =
        rejects.iter().flat_map(|b| b.column_by_name("raw").unwrap().as_binary::<i32>().iter().flatten()).collect();
    assert_eq!(raw, [b"a cat".as_slice(), b"a cow"], "the caption, as for every stage after the reader");
}

#[test]
fn a_max_length_without_room_for_text_is_refused_and_one_past_the_positions_cut_to_them() {
    // The tiny BERT's tokenizer adds [CLS] and [SEP]; its position table has 64 rows. A
    // max_seq_length of 0 to 2 made the tokenizers crate wrap `max_length - 2` (nothing truncated,
    // then a long caption panicked past the position table).
    let src = fixtures().join("tiny_bert");
    let folder = |st: &str| {
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::write(dir.path().join("sentence_bert_config.json"), st).unwrap();
        dir
    };
    for (value, want) in [
        ("0", "`max_seq_length` is 0, but the tokenizer adds 2 special tokens"),
        ("1", "`max_seq_length` is 1, but the tokenizer adds 2 special tokens"),
        ("2", "`max_seq_length` is 2, but the tokenizer adds 2 special tokens"),
        ("-1", "`max_seq_length` is -1, not a token count"),
        ("\"16\"", "`max_seq_length` is \"16\", not a token count"),
    ] {
        let dir = folder(&format!("{{\"max_seq_length\": {value}}}"));
        let e = match TextEncoder::load(dir.path(), None, None, &Device::flex()) {
            Ok(_) => panic!("max_seq_length {value}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("sentence_bert_config.json`: ") && e.contains(want), "{value}: {e}");
        assert!(
            e.contains("hint: a max length from 3 to 64") || e.contains("hint: a whole number from 3 to 64"),
            "{e}"
        );
    }
    // The smallest length that leaves room for text truncates every caption, short ones too,
    // and a long one encodes.
    let dir = folder("{\"max_seq_length\": 3}");
    let enc = TextEncoder::load(dir.path(), None, None, &Device::flex()).unwrap();
    let long = "a dog runs ".repeat(100);
    let (_, mask, shape) = enc.tokenize(&["a dog runs", &long]).unwrap();
    assert_eq!(shape, [2, 3]);
    assert_eq!(mask, [1; 6]);
    assert_eq!(enc.encode(&[&long]).unwrap().len(), enc.dim);
    // Without a max_seq_length, or with one past the positions, the model's own limit holds.
    for st in ["{\"do_lower_case\": false}", "{\"max_seq_length\": 65}", "{\"max_seq_length\": 100000}"] {
        let dir = folder(st);
        let enc = TextEncoder::load(dir.path(), None, None, &Device::flex()).unwrap();
        assert_eq!(enc.max_tokens(), 64, "{st}");
        assert_eq!(enc.encode(&[&long]).unwrap().len(), enc.dim, "{st}");
    }
}

#[test]
fn a_checkpoint_saved_in_double_precision_loads_as_its_float_one() {
    use safetensors::tensor::{Dtype, TensorView};
    // torch.save of a `.double()` model: every weight F64. It was reported as every tensor
    // missing; read as f32 it is the f32 checkpoint exactly (f32 → f64 → f32 is lossless).
    let src = fixtures().join("tiny_bert");
    let dir = tiny_bert_without_weights();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let doubled: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let data = view
                .data()
                .chunks_exact(4)
                .flat_map(|b| (f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).to_le_bytes())
                .collect();
            (name, view.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(&str, TensorView)> =
        doubled.iter().map(|(n, s, d)| (n.as_str(), TensorView::new(Dtype::F64, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let captions = ["a dog runs on the beach .", "two dogs"];
    let device = Device::flex();
    let want = TextEncoder::load(&src, None, None, &device).unwrap().encode(&captions).unwrap();
    let got = match TextEncoder::load(dir.path(), None, None, &device) {
        Ok(enc) => enc.encode(&captions).unwrap(),
        Err(e) => panic!("the F64 checkpoint was refused: {e}"),
    };
    assert_eq!(got, want);
}

#[test]
fn a_config_with_absurd_sizes_is_refused_with_the_full_list_without_allocating_them() {
    // Sizes no machine holds: zeros of the expected shape for each mis-shaped tensor
    // (intermediate_size 10^13: petabytes) and one layer after another (10^12 layers) used to be
    // allocated before the checkpoint was refused, aborting the process (20,000,000 took ~10 GB
    // and 20 s). The tiny checkpoint is refused at once, with every problem listed.
    for model in ["tiny_bert", "tiny_mpnet"] {
        let src = fixtures().join(model);
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
            }
        }
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let (layers, inter) = (config["num_hidden_layers"].as_u64().unwrap(), config["intermediate_size"].clone());
        config["intermediate_size"] = 10_000_000_000_000u64.into();
        config["num_hidden_layers"] = 1_000_000_000_000u64.into();
        std::fs::write(&path, config.to_string()).unwrap();
        let start = std::time::Instant::now();
        let e = match TextEncoder::load(dir.path(), None, None, &Device::flex()) {
            Ok(_) => panic!("{model}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(start.elapsed().as_secs() < 10, "{model}: {:?}", start.elapsed());
        let want = format!(
            "1 missing:\n    encoder.layer.{layers}.* to encoder.layer.999999999999.*: {} layers, none in the \
             checkpoint (it has {layers})",
            1_000_000_000_000 - layers
        );
        assert!(e.contains(&want), "{model}: {e}");
        let misshaped =
            format!("{} mis-shaped:\n    encoder.layer.0.intermediate.dense.weight: [{inter}, ", 3 * layers);
        assert!(e.contains(&misshaped) && e.contains("expected [10000000000000, "), "{model}: {e}");
        // A size of 0 is refused the same way (burn cannot broadcast a stand-in to it).
        for key in ["intermediate_size", "hidden_size", "vocab_size"] {
            let mut zero =
                serde_json::from_slice::<serde_json::Value>(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
            zero[key] = 0.into();
            std::fs::write(&path, zero.to_string()).unwrap();
            match TextEncoder::load(dir.path(), None, None, &Device::flex()) {
                Ok(_) => panic!("{model}: {key} = 0 loaded"),
                Err(e) => assert!(e.to_string().contains("mis-shaped"), "{model} {key} = 0: {e}"),
            }
        }
    }
}

/// A sentence-transformers settings file that is there but is not JSON is refused by name: its
/// pooling, normalisation or max length would otherwise be passed over without a word.
#[test]
fn a_broken_sentence_transformers_file_is_refused_by_name() {
    let src = fixtures().join("tiny_bert");
    for file in ["sentence_bert_config.json", "modules.json", "1_Pooling/config.json"] {
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("1_Pooling")).unwrap();
        std::fs::write(dir.path().join(file), "{\"max_seq_length\": 16,").unwrap();
        let e = match TextEncoder::load(dir.path(), None, None, &Device::flex()) {
            Ok(_) => panic!("{file}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&format!("{file}` is not valid JSON")), "{file}: {e}");
    }
}

#[test]
fn fbnetv3_a_and_c_have_mobile_visions_exact_layouts() {
    // Every tensor of mobile-vision's `fbnet("FBNetV3_A")` and `fbnet("FBNetV3_C")` by name and
    // shape (make_fbnet_fixture.py), nothing missing, mis-shaped or unexpected but the ImageNet
    // classifier `head.conv`; 1984-d features.
    use curate::models::fbnet::{FbNet, FbNetConfig};
    for (file, config) in
        [("fbnetv3_a_layout.json", FbNetConfig::fbnetv3_a()), ("fbnetv3_c_layout.json", FbNetConfig::fbnetv3_c())]
    {
        let layout: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join("fbnet").join(file)).unwrap()).unwrap();
        let w = common::zeros_of_layout(&layout);
        let model = FbNet::from_weights(&config, &w, &Device::flex());
        w.finish(&FbNet::IGNORED).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(model.feature_dim(), 1984, "{file}");
    }
}

/// A float32 tensor of a safetensors file, with its shape.
fn safetensor(path: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let v = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let data = v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    (v.shape().to_vec(), data)
}

#[test]
fn tiny_fbnet_matches_mobile_vision() {
    // make_fbnet_fixture.py: mobile-vision's builder on a tiny FBNetV3 (every kind of block:
    // without expansion, residual, squeeze-excitation, both kernels, the padding overrides of
    // FBNetV3-A), random weights and BatchNorm statistics, eval mode; its backbone's pooled
    // features for a 72² batch and a 61×67 image (odd, not square), from the safetensors state
    // dict, on both convolution lowerings and every CPU backend.
    use burn::tensor::{Tensor, TensorData};
    use curate::models::fbnet::{FbNet, FbNetConfig};
    use curate::models::resnet::ConvLowering;
    let dir = fixtures().join("fbnet");
    let io = dir.join("tiny_fbnet_io.safetensors");
    for (name, device) in common::test_devices() {
        let model = FbNet::load(&dir.join("tiny_fbnet.safetensors"), &FbNetConfig::tiny(), &device).unwrap();
        assert_eq!(model.feature_dim(), 64);
        for lowering in [ConvLowering::Native, ConvLowering::Im2col] {
            let model = model.clone().with_conv_lowering(lowering);
            for (input, features) in [("input", "features"), ("input_odd", "features_odd")] {
                let (shape, x) = safetensor(&io, input);
                let (want_shape, want) = safetensor(&io, features);
                let x = Tensor::<4>::from_data(TensorData::new(x, [shape[0], shape[1], shape[2], shape[3]]), &device);
                let got = model.forward(x);
                assert_eq!(got.dims().to_vec(), want_shape, "{input}");
                let got = got.into_data().try_to_vec::<f32>().unwrap();
                let tol = common::tolerance(name, 1e-4);
                let worst = common::assert_close(&got, &want, tol, &format!("{name} {lowering:?} {input}"));
                assert!(worst > 0.0 || got == want, "{worst}");
            }
            // The smallest input it takes runs through.
            let side = FbNetConfig::tiny().min_side();
            let y = model.forward(Tensor::<4>::ones([1, 3, side, side], &device));
            assert_eq!(y.dims(), [1, 64]);
        }
    }
}

#[test]
fn a_mobile_vision_model_zoo_checkpoint_gives_its_moving_average() {
    // The model zoo's `model.pth`: `{"model_ema": {...}, "state_dict": {...}, "epoch": 42}`,
    // both under `module.`; mobile-vision's loader reads `model_ema`, and so does curate (the
    // fixture's trained weights differ, and give `features_state_dict`).
    use burn::tensor::{Tensor, TensorData};
    use curate::models::fbnet::{FbNet, FbNetConfig};
    let dir = fixtures().join("fbnet");
    let io = dir.join("tiny_fbnet_io.safetensors");
    let device = Device::flex();
    let pth = dir.join("tiny_fbnet_model.pth");
    let model = FbNet::load(&pth, &FbNetConfig::tiny(), &device).unwrap();
    let (shape, x) = safetensor(&io, "input");
    let x = Tensor::<4>::from_data(TensorData::new(x, [shape[0], shape[1], shape[2], shape[3]]), &device);
    let got = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
    common::assert_close(&got, &safetensor(&io, "features").1, 1e-4, "model_ema");
    let (_, other) = safetensor(&io, "features_state_dict");
    assert!(got.iter().zip(&other).any(|(a, b)| (a - b).abs() > 1e-2), "not the trained weights");
    let c = curate::models::torch_checkpoint::read(&pth).unwrap();
    assert_eq!(c.entry.as_deref(), Some("model_ema"));
}

/// The gradients of a module's parameters by their path in the module (`blocks.2.se.expand.weight`).
struct NamedGrads<'a> {
    grads: &'a burn::tensor::Gradients,
    path: Vec<String>,
    out: std::collections::BTreeMap<String, Vec<f32>>,
}

impl burn::module::ModuleVisitor for NamedGrads<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<burn::tensor::Tensor<D>>) {
        if let Some(g) = param.val().grad(self.grads) {
            self.out.insert(self.path.join("."), g.into_data().try_to_vec::<f32>().unwrap());
        }
    }
}

#[test]
fn tiny_fbnet_trains_as_mobile_vision() {
    // make_fbnet_fixture.py, training mode: the features with BatchNorm on the batch's
    // statistics, the gradients of `(features · direction).sum()` for the input and for
    // parameters of the stem, a squeeze-excitation, a depthwise convolution, a BatchNorm and
    // the head, then eval-mode features with the running statistics that pass updated
    // (PyTorch's momentum 0.1 and unbiased variance); on both convolution lowerings.
    use burn::module::Module;
    use burn::tensor::{Tensor, TensorData};
    use curate::models::fbnet::{FbNet, FbNetConfig};
    use curate::models::resnet::ConvLowering;
    let dir = fixtures().join("fbnet");
    let (io, train) = (dir.join("tiny_fbnet_io.safetensors"), dir.join("tiny_fbnet_train.safetensors"));
    let device = Device::flex().autodiff();
    let (shape, x) = safetensor(&io, "input");
    let shape = [shape[0], shape[1], shape[2], shape[3]];
    let (_, direction) = safetensor(&train, "direction");
    for lowering in [ConvLowering::Native, ConvLowering::Im2col] {
        let model = FbNet::load(&dir.join("tiny_fbnet.safetensors"), &FbNetConfig::tiny(), &device)
            .unwrap()
            .with_conv_lowering(lowering);
        let input = Tensor::<4>::from_data(TensorData::new(x.clone(), shape), &device).require_grad();
        let y = model.forward(input.clone());
        let values = y.clone().into_data().try_to_vec::<f32>().unwrap();
        common::assert_close(&values, &safetensor(&train, "features").1, 1e-4, &format!("{lowering:?} features"));
        let grads = (y * Tensor::<2>::from_data(TensorData::new(direction.clone(), [2, 64]), &device)).sum().backward();
        let input_grad = input.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap();
        common::assert_close(&input_grad, &safetensor(&train, "grad.input").1, 1e-4, "input gradient");
        let mut named = NamedGrads { grads: &grads, path: Vec::new(), out: Default::default() };
        model.visit(&mut named);
        for (ours, theirs) in [
            ("stem.conv.weight", "backbone.stages.xif0_0.conv.weight"),
            ("blocks.2.se.expand.weight", "backbone.stages.xif2_1.se.se.1.weight"),
            ("blocks.2.se.reduce.bias", "backbone.stages.xif2_1.se.se.0.conv.bias"),
            ("blocks.3.dw.conv.weight", "backbone.stages.xif3_0.dw.conv.weight"),
            ("blocks.2.pwl.bn.gamma", "backbone.stages.xif2_1.pwl.bn.weight"),
            ("head_conv.weight", "backbone.stages.xif5_0.pwl.conv.weight"),
        ] {
            let got = named.out.get(ours).unwrap_or_else(|| panic!("{ours}: {:?}", named.out.keys()));
            let (_, want) = safetensor(&train, &format!("grad.{theirs}"));
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 1e-3, "{theirs} has a gradient");
            common::assert_close(got, &want, 1e-4 * scale.max(1.0), &format!("{lowering:?} {ours}"));
        }
        let after = model.valid().forward(Tensor::<4>::from_data(TensorData::new(x.clone(), shape), &Device::flex()));
        let after = after.into_data().try_to_vec::<f32>().unwrap();
        let (_, want_after) = safetensor(&train, "eval_after");
        common::assert_close(&after, &want_after, 1e-4, &format!("{lowering:?} eval after"));
        let (_, before) = safetensor(&io, "features");
        assert!(want_after.iter().zip(&before).any(|(a, b)| (a - b).abs() > 1e-2), "the running statistics moved");
    }
}

#[test]
fn an_fbnet_backbone_state_dict_without_its_classifier_loads_the_same_model() {
    // mobile-vision's `fbnet_backbone(...)` (its detection models' trunk) names the stages at the
    // top (`stages.xif0_0.conv.weight`), with no `backbone.` and no `head`: the same model.
    use burn::tensor::{Tensor, TensorData};
    use curate::models::fbnet::{FbNet, FbNetConfig};
    let dir = fixtures().join("fbnet");
    let bytes = std::fs::read(dir.join("tiny_fbnet.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let parts: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter_map(|(n, v)| n.strip_prefix("backbone.").map(|n| (n.to_string(), v))).collect();
    assert!(parts.iter().any(|(n, _)| n == "stages.xif0_0.conv.weight"));
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("backbone.safetensors");
    std::fs::write(&file, safetensors::serialize(parts, None).unwrap()).unwrap();
    let device = Device::flex();
    let (shape, x) = safetensor(&dir.join("tiny_fbnet_io.safetensors"), "input");
    let x = || Tensor::<4>::from_data(TensorData::new(x.clone(), [shape[0], shape[1], shape[2], shape[3]]), &device);
    let bare = FbNet::load(&file, &FbNetConfig::tiny(), &device).unwrap().forward(x());
    let whole = FbNet::load(&dir.join("tiny_fbnet.safetensors"), &FbNetConfig::tiny(), &device).unwrap().forward(x());
    assert_eq!(bare.into_data().try_to_vec::<f32>().unwrap(), whole.into_data().try_to_vec::<f32>().unwrap());
}
