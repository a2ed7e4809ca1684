//! A sentence encoder: `tokenizer.json` (the `tokenizers` crate; or an older BERT folder's
//! `vocab.txt`) + a transformer (BERT family and RoBERTa, or MPNet for `"model_type": "mpnet"`
//! in `config.json`) + pooling (+ normalisation), loaded from a Hugging Face /
//! sentence-transformers model folder. Truncation to the model's maximum
//! length (sentence-transformers' `max_seq_length` when the folder has
//! `sentence_bert_config.json`), padding to the longest caption of each batch with the model's
//! `pad_token_id` (MPNet's `<pad>` is 1, and it sets positions).

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use tokenizers::{PaddingStrategy, PostProcessor, Tokenizer, TruncationParams};

use super::bert::Bert;
use super::mpnet::MpNet;
use super::pooling::{l2_normalize, pool, Pooling};
use crate::error::{Error, Result};

/// The transformer under the tokenizer, by `config.json`'s `model_type`.
enum TextModel {
    Bert(Bert),
    MpNet(MpNet),
}

impl TextModel {
    /// # Shapes
    /// - `ids`, `mask`: `[batch, seq]` → `[batch, seq, hidden]`
    fn forward(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<3> {
        match self {
            TextModel::Bert(m) => m.forward(ids, mask),
            TextModel::MpNet(m) => m.forward(ids, mask),
        }
    }
}

pub struct TextEncoder {
    model: TextModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
    device: Device,
    /// Width of the embeddings.
    pub dim: usize,
}

fn model_err(message: String) -> Error {
    Error::Model { message, hint: None }
}

/// The tokenizer of a model folder and the file it came from: `tokenizer.json`, else, for a
/// BERT-family folder published before that file existed (DeCLUTR-sci-base among them), the
/// WordPiece tokenizer its `vocab.txt` and `tokenizer_config.json` define ([`bert_from_vocab`]).
pub fn load_tokenizer_file(dir: &Path) -> Result<(Tokenizer, std::path::PathBuf)> {
    let json = dir.join("tokenizer.json");
    let vocab = dir.join("vocab.txt");
    if !json.is_file() && vocab.is_file() {
        return Ok((bert_from_vocab(dir)?, vocab));
    }
    let tok = Tokenizer::from_file(&json)
        .map_err(|e| model_err(format!("cannot load tokenizer `{}`: {e}", json.display())))?;
    Ok((tok, json))
}

/// Whether `dir` has a tokenizer curate can load (`tokenizer.json`, or a BERT `vocab.txt`).
pub fn has_tokenizer(dir: &Path) -> bool {
    dir.join("tokenizer.json").is_file() || dir.join("vocab.txt").is_file()
}

/// A BERT WordPiece tokenizer from `vocab.txt`, as transformers converts its `BertTokenizer` to
/// the fast one (`convert_slow_tokenizer.BertConverter`): `BertNormalizer` (text cleaned,
/// Chinese characters split, lower-cased and accents stripped per `tokenizer_config.json`'s
/// `do_lower_case` (default true), `strip_accents`, `tokenize_chinese_chars`), `BertPreTokenizer`,
/// WordPiece with `##` continuations over words of at most 100 characters, `[CLS] $A [SEP]`,
/// and the special tokens matched before normalisation. Checked against transformers'
/// tokenizers in `tests/fixtures/models/make_vocab_txt_fixture.py`.
pub fn bert_from_vocab(dir: &Path) -> Result<Tokenizer> {
    use tokenizers::models::wordpiece::WordPiece;
    use tokenizers::normalizers::bert::BertNormalizer;
    use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
    use tokenizers::processors::bert::BertProcessing;
    use tokenizers::AddedToken;

    let config_path = dir.join("tokenizer_config.json");
    let config = read_st_json(&config_path)?.unwrap_or(serde_json::Value::Null);
    let flag = |key: &str| config[key].as_bool();
    // A special token is a string, or (newer files) an AddedToken object with its `content`.
    let special = |key: &str, default: &str| -> String {
        let v = &config[key];
        v.as_str().or_else(|| v["content"].as_str()).unwrap_or(default).to_owned()
    };
    let (unk, cls, sep, pad, mask) = (
        special("unk_token", "[UNK]"),
        special("cls_token", "[CLS]"),
        special("sep_token", "[SEP]"),
        special("pad_token", "[PAD]"),
        special("mask_token", "[MASK]"),
    );
    let vocab = dir.join("vocab.txt");
    let model = WordPiece::from_file(&vocab.to_string_lossy())
        .unk_token(unk.clone())
        .max_input_chars_per_word(100)
        .build()
        .map_err(|e| model_err(format!("cannot read `{}`: {e}", vocab.display())))?;
    let mut tok = Tokenizer::new(model);
    let lower = flag("do_lower_case").unwrap_or(true);
    tok.with_normalizer(Some(BertNormalizer::new(
        true,
        flag("tokenize_chinese_chars").unwrap_or(true),
        flag("strip_accents"),
        lower,
    )));
    tok.with_pre_tokenizer(Some(BertPreTokenizer));
    let id = |t: &str| {
        tok.token_to_id(t).ok_or_else(|| Error::Model {
            message: format!("`{}` has no `{t}`, which a BERT tokenizer puts around every text", vocab.display()),
            hint: Some("the special tokens are named in tokenizer_config.json (`cls_token`, `sep_token`)".into()),
        })
    };
    let (cls_id, sep_id) = (id(&cls)?, id(&sep)?);
    tok.with_post_processor(Some(BertProcessing::new((sep.clone(), sep_id), (cls.clone(), cls_id))));
    tok.with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::default()));
    let specials: Vec<AddedToken> = [unk, sep, pad, cls, mask]
        .into_iter()
        .filter(|t| tok.token_to_id(t).is_some())
        .map(|t| AddedToken::from(t, true))
        .collect();
    tok.add_special_tokens(&specials);
    Ok(tok)
}

impl TextEncoder {
    /// Loads a model folder. `pooling`/`normalize` of `None` follow the folder's
    /// sentence-transformers files (`1_Pooling/config.json`, a `Normalize` module in
    /// `modules.json`), defaulting to mean pooling without normalisation.
    pub fn load(dir: &Path, pooling: Option<Pooling>, normalize: Option<bool>, device: &Device) -> Result<TextEncoder> {
        let config_path = dir.join("config.json");
        let raw = read_json(&config_path);
        let model_type = raw.as_ref().and_then(|v| v["model_type"].as_str().map(str::to_owned));
        let (model, dim, model_max, vocab_rows) = match model_type.as_deref() {
            Some("mpnet") => {
                let (m, c) = MpNet::load(dir, device)?;
                let max = m.max_tokens();
                (TextModel::MpNet(m), c.hidden_size, max, c.vocab_size)
            }
            None | Some("bert" | "distilbert" | "roberta") => {
                let (m, c) = Bert::load(dir, device)?;
                (TextModel::Bert(m), c.hidden_size, c.max_tokens(), c.vocab_size)
            }
            Some(other) => {
                return Err(Error::Model {
                    message: format!(
                        "`{}`: model_type `{other}` is not a supported text encoder",
                        config_path.display()
                    ),
                    hint: Some("supported: `bert` (BERT, MiniLM), `distilbert`, `roberta`, `mpnet`".into()),
                })
            }
        };
        let (mut tokenizer, tok_path) = load_tokenizer_file(dir)?;
        let model_key = match model_type.as_deref() {
            Some("mpnet") => "`max_position_embeddings` less 2",
            Some("roberta") => "`max_position_embeddings` less `pad_token_id` + 1",
            _ => "`max_position_embeddings`",
        };
        let max_tokens = max_length(dir, &tokenizer, model_max, model_key)?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| model_err(format!("tokenizer truncation: {e}")))?;
        // Pad with the model's own pad id (config.json), as transformers' tokenizers do; the
        // tokenizer.json may carry none or a fixed-length one.
        // An id past u32 saturates, to be refused below rather than wrapped to a valid one.
        let pad_id =
            raw.as_ref().and_then(|v| v["pad_token_id"].as_u64()).map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let mut padding = tokenizer.get_padding().cloned().unwrap_or_default();
        if let Some(id) = pad_id {
            padding.pad_id = id;
            padding.pad_token = tokenizer.id_to_token(id).unwrap_or(padding.pad_token);
        }
        padding.strategy = PaddingStrategy::BatchLongest;
        padding.pad_to_multiple_of = None;
        let pad = (padding.pad_id, if pad_id.is_some() { config_path.as_path() } else { tok_path.as_path() });
        tokenizer.with_padding(Some(padding));
        check_ids_fit(&tokenizer, &tok_path, vocab_rows, pad, &config_path)?;
        let pool_path = dir.join("1_Pooling/config.json");
        // The folder's pooling, unless the caller chose one.
        let st_pool = match pooling {
            Some(_) => None,
            None => read_st_json(&pool_path)?.map(|v| st_pooling(&v, &pool_path)).transpose()?,
        };
        let modules_path = dir.join("modules.json");
        let modules = read_st_json(&modules_path)?;
        // A Dense (or other) module after the pooling changes the embedding; it is not run here.
        if let Some(other) = modules.as_ref().and_then(|m| m.as_array()).and_then(|m| {
            m.iter()
                .filter_map(|x| x["type"].as_str())
                .find(|t| !["models.Transformer", "models.Pooling", "models.Normalize"].iter().any(|k| t.ends_with(k)))
        }) {
            return Err(Error::Model {
                message: format!("`{}` lists a module curate does not run: `{other}`", modules_path.display()),
                hint: Some("curate runs Transformer, Pooling (mean or CLS) and Normalize modules only".into()),
            });
        }
        let st_norm = modules.map(|v| v.to_string().contains("Normalize"));
        Ok(TextEncoder {
            model,
            tokenizer,
            pooling: pooling.or(st_pool).unwrap_or(Pooling::Mean),
            normalize: normalize.or(st_norm).unwrap_or(false),
            max_tokens,
            device: device.clone(),
            dim,
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Token ids and attention mask of a batch, padded to its longest text.
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Vec<i64>, Vec<i64>, [usize; 2])> {
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| model_err(format!("tokenizer failed: {e}")))?;
        let s = enc.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(texts.len() * s);
        let mut mask = Vec::with_capacity(texts.len() * s);
        for e in &enc {
            ids.extend(e.get_ids().iter().map(|&i| i as i64));
            mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
        }
        Ok((ids, mask, [texts.len(), s]))
    }

    /// Sentence embeddings, `[texts.len(), dim]` row-major.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<f32>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, mask, shape) = self.tokenize(texts)?;
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, shape), &self.device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, shape), &self.device);
        let states = self.model.forward(ids, mask.clone());
        let mut e = pool(states, mask, self.pooling);
        if self.normalize {
            e = l2_normalize(e);
        }
        e.into_data().try_to_vec::<f32>().map_err(|e| model_err(format!("reading embeddings: {e:?}")))
    }
}

impl TextEncoder {
    /// Sentence embeddings of many texts, `[texts.len(), dim]` row-major in input order, in
    /// batches of `batch_size` texts of similar length (sorted by length, longest first, as
    /// sentence-transformers' `encode` does), so batches carry little padding. Batches run on the
    /// rayon threads when `parallel`. The order depends only on the texts, so the result does
    /// not depend on the thread count.
    pub fn encode_many(&self, texts: &[&str], batch_size: usize, parallel: bool) -> Result<Vec<f32>> {
        use rayon::prelude::*;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(texts[i].len()), i));
        let sorted: Vec<&str> = order.iter().map(|&i| texts[i]).collect();
        let batch = batch_size.max(1);
        let parts: Vec<Vec<f32>> = if parallel {
            sorted.par_chunks(batch).map(|p| self.encode(p)).collect::<Result<_>>()?
        } else {
            sorted.chunks(batch).map(|p| self.encode(p)).collect::<Result<_>>()?
        };
        let dim = self.dim;
        let mut out = vec![0f32; texts.len() * dim];
        for (row, &i) in parts.iter().flat_map(|p| p.chunks(dim)).zip(&order) {
            out[i * dim..(i + 1) * dim].copy_from_slice(row);
        }
        Ok(out)
    }
}

/// The truncation length: sentence-transformers' `max_seq_length` (`sentence_bert_config.json`)
/// when the folder has one, else the model's own limit (`model_max`, named by `model_key`:
/// BERT's `max_position_embeddings`, MPNet's and RoBERTa's less the positions they reserve). It
/// must leave room for at least one text token beside the special tokens the tokenizer adds
/// (`[CLS]`, `[SEP]`): the
/// `tokenizers` crate computes `max_length - special tokens` unchecked, so a smaller length wraps,
/// no caption is truncated and a long one runs past the position table (a panic mid-run). A
/// `max_seq_length` past the model's limit is cut to it.
fn max_length(dir: &Path, tokenizer: &Tokenizer, model_max: usize, model_key: &str) -> Result<usize> {
    let specials = tokenizer.get_post_processor().map_or(0, |p| p.added_tokens(false));
    let config_path = dir.join("config.json");
    let st_path = dir.join("sentence_bert_config.json");
    let st_max = match read_st_json(&st_path)?.map(|v| v["max_seq_length"].clone()) {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => {
                return Err(Error::Model {
                    message: format!("`{}`: `max_seq_length` is {v}, not a token count", st_path.display()),
                    hint: Some(format!("a whole number from {} to {model_max}", specials + 1)),
                })
            }
        },
    };
    let (max, source, key) = match st_max {
        Some(n) => (n, &st_path, "`max_seq_length`"),
        None => (model_max, &config_path, model_key),
    };
    if max <= specials {
        return Err(Error::Model {
            message: format!(
                "`{}`: {key} is {max}, but the tokenizer adds {specials} special tokens to every text: \
                 the max length must leave room for at least one token of text",
                source.display()
            ),
            hint: Some(format!(
                "a max length from {} to {model_max} (sentence-transformers models use 128 to 512)",
                specials + 1
            )),
        });
    }
    // Past the model's positions, its own limit holds (as before: sentence-transformers folders
    // are used as they are published, and the positions are what the model can take).
    Ok(max.min(model_max))
}

/// Every id the tokenizer can give must index a row of the embedding table (`vocab_size` rows):
/// the ids of its vocabulary and added tokens, the special tokens its post-processor inserts
/// (`[CLS]`/`[SEP]`, which need not be in the vocabulary) and the pad id (`config.json`'s
/// `pad_token_id`, else `tokenizer.json`'s padding). Counting the
/// tokenizer's entries is not enough: ids need not be `0..n`, and one stray id (`"dog": 900` in
/// a 125-entry vocabulary) would index past the table in the middle of a run.
pub(crate) fn check_ids_fit(
    tokenizer: &Tokenizer,
    tok_path: &Path,
    rows: usize,
    (pad, pad_source): (u32, &Path),
    config_path: &Path,
) -> Result<()> {
    let hint = || Some("the tokenizer.json and config.json of one model folder belong together".to_owned());
    let past = |what: String, id: u32| Error::Model {
        message: format!(
            "`{}`: {what} has id {id}, but the model's `vocab_size` is {rows} (`{}`): ids must be below it",
            tok_path.display(),
            config_path.display()
        ),
        hint: hint(),
    };
    // The largest id (ties by token, so the message does not depend on hash order).
    let vocab = tokenizer.get_vocab(true);
    if let Some((token, &id)) = vocab.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0))) {
        if id as usize >= rows {
            return Err(past(format!("token `{token}`"), id));
        }
    }
    let specials = tokenizer
        .encode("", true)
        .map_err(|e| model_err(format!("`{}`: cannot encode an empty text: {e}", tok_path.display())))?;
    for (&id, token) in specials.get_ids().iter().zip(specials.get_tokens()) {
        if id as usize >= rows {
            return Err(past(format!("special token `{token}` (inserted by its `post_processor`)"), id));
        }
    }
    if pad as usize >= rows {
        return Err(Error::Model {
            message: format!(
                "`{}`: the pad id is {pad}, but the model's `vocab_size` is {rows}: ids must be below it",
                pad_source.display()
            ),
            hint: hint(),
        });
    }
    Ok(())
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A sentence-transformers settings file of the folder: `None` where there is none; one that
/// is there but is not JSON is refused by name (its settings would be passed over silently).
/// The pooling a sentence-transformers `1_Pooling/config.json` asks for: mean or CLS. Any other
/// mode (max, mean_sqrt_len, weighted mean, last token, or two at once, which the package
/// concatenates) is refused rather than computed as something else.
fn st_pooling(v: &serde_json::Value, path: &Path) -> Result<Pooling> {
    let on: Vec<&str> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, x)| k.starts_with("pooling_mode_") && x.as_bool() == Some(true))
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default();
    match on.as_slice() {
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        ["pooling_mode_mean_tokens"] | [] => Ok(Pooling::Mean),
        _ => Err(Error::Model {
            message: format!(
                "`{}` asks for pooling {}, which curate does not compute",
                path.display(),
                crate::error::list(&on)
            ),
            hint: Some(
                "curate pools by mean or by the CLS token (`pooling = \"mean\"|\"cls\"` overrides the folder)".into(),
            ),
        }),
    }
}

fn read_st_json(path: &Path) -> Result<Option<serde_json::Value>> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read", path, e)),
        Ok(t) => t,
    };
    serde_json::from_str(&text).map(Some).map_err(|e| Error::Model {
        message: format!("`{}` is not valid JSON: {e}", path.display()),
        hint: Some("the sentence-transformers files of a model folder are JSON, as the package writes them".into()),
    })
}
