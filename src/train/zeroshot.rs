//! Zero-shot classification during training (spec `bow-and-otter.md` §6.1–6.2): each class
//! becomes a prompt (`a photo of a {}` by default; the synonyms of a class joined with `,or `
//! as OTTER's reference does), embedded by the text tower and L2-normalised — several templates
//! are averaged and renormalised (CLIP's ensemble); each image is classified by cosine
//! similarity. Top-1/2/5/10 are flat hit@k (§6.2: K ∈ {1, 5, 10} for GOI and IN10K, {1, 2, 5, 10}
//! for IN21K+1K): an image counts as a hit when any of its labels is among the k best classes,
//! which for one label per image is top-k accuracy. A label names a class by any of its synonyms
//! or by its number (`#12`, counted from 0 over the file's classes); a name that several classes
//! list (OTTER's GOI list repeats names, which then tie as predictions) is refused as a label.
//! With `eval.keep_prompts = K` (PCME++, spec `cusa-and-pcmepp.md` §3.12) a class averages only
//! its K prompts of lowest text uncertainty.

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use tokenizers::Tokenizer;

use super::config::ZeroShotConfig;
use super::data::{read_image, string_column, tokenize, ImageSource};
use super::dual_encoder::DualEncoder;
use super::transform::ImageTransform;
use crate::error::{Error, Result};
use crate::models::pooling::l2_normalize;

/// Class names from a file: one class per line, synonyms separated by `|`; blank lines and
/// lines starting with `#` are skipped.
pub fn parse_classes(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split('|').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .collect()
}

/// The note for class names that several classes list, if any: those classes get the same prompt
/// and tie as predictions (ties go to the first), and no label can name them by that name.
pub fn shared_names_note(shared: &[String]) -> Option<String> {
    let (first, rest) = shared.split_first()?;
    let more = match rest.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "{} zero-shot class name(s) are listed by more than one class (`{first}`{more}): a label names those \
         classes by number (`#N`), and classes with the same names get one prompt and tie (the first wins)",
        shared.len()
    ))
}

/// The prompt of a class for one template: synonyms joined with `,or ` (OTTER).
pub fn class_prompt(template: &str, names: &[String]) -> String {
    template.replace("{}", &names.join(",or "))
}

/// Flat hit@k: the fraction of images with at least one label among their `k` highest-scoring
/// classes (ties broken by class order).
///
/// # Shapes
/// - `scores`: `[images, classes]` row-major; `labels`: one set of class indices per image
pub fn hit_at_k(scores: &[f32], classes: usize, labels: &[Vec<usize>], k: usize) -> f64 {
    if labels.is_empty() {
        return 0.0;
    }
    let hits = labels
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            let row = &scores[i * classes..(i + 1) * classes];
            let mut order: Vec<usize> = (0..classes).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            order.iter().take(k).any(|c| l.contains(c))
        })
        .count();
    hits as f64 / labels.len() as f64
}

/// The evaluation set, preprocessed once.
pub struct ZeroShot {
    /// `[n, 3, size, size]`: each image's evaluation view ([`ImageTransform::test`]).
    images: Vec<f32>,
    size: usize,
    labels: Vec<Vec<usize>>,
    /// One prompt per (class, template), class-major.
    prompts: Vec<String>,
    templates: usize,
    /// `eval.keep_prompts`: per class, the templates of least text uncertainty averaged.
    keep_prompts: Option<usize>,
    pub classes: usize,
    /// Rows of the image tables left out because their path or label is null (said on stderr
    /// by the caller: a silent drop would change the score's denominator unseen).
    pub skipped: usize,
    /// Class names that more than one class lists (said on stderr by the caller: those classes
    /// tie as predictions, and a label cannot name them by that name).
    pub shared_names: Vec<String>,
}

/// Zero-shot results: flat hit@1, 2, 5 and 10.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroShotScores {
    pub top1: f64,
    pub top2: f64,
    pub top5: f64,
    pub top10: f64,
    pub classes: usize,
}

impl ZeroShot {
    /// One prompt per (class, template), class-major, as the text tower gets them.
    pub fn prompts(&self) -> &[String] {
        &self.prompts
    }

    /// The set of `c`, images prepared with the evaluation view of `transform`, prompts after
    /// CUSA's `pre_caption` when the run trained on such captions (`data.pre_caption`).
    pub fn load(c: &ZeroShotConfig, transform: &ImageTransform, pre_caption: bool) -> Result<ZeroShot> {
        let size = transform.size;
        let (Some(image_tables), Some(classes)) = (&c.images, &c.classes) else {
            return Err(Error::data("`[eval]` has no zero-shot set (`images` and `classes`)"));
        };
        let text = std::fs::read_to_string(classes).map_err(|e| Error::io("cannot read classes", classes, e))?;
        let class_names = parse_classes(&text);
        let mut by_name: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
        for (i, names) in class_names.iter().enumerate() {
            for n in names {
                let at = by_name.entry(n.as_str()).or_default();
                if at.last() != Some(&i) {
                    at.push(i);
                }
            }
        }
        let mut shared_names: Vec<String> =
            by_name.iter().filter(|(_, at)| at.len() > 1).map(|(n, _)| (*n).to_owned()).collect();
        shared_names.sort();
        // A label's class: by name where one class lists it, or by number (`#12`).
        let index = |file: &Path, name: &str| -> Result<usize> {
            let numbered = name.strip_prefix('#').and_then(|i| i.parse::<usize>().ok());
            if let Some(i) = numbered.filter(|&i| i < class_names.len()) {
                return Ok(i);
            }
            match by_name.get(name).map(Vec::as_slice) {
                Some([i]) => Ok(*i),
                Some(several) => Err(Error::Data {
                    message: format!(
                        "`{}`: label `{name}` names {} classes of `{}` (#{})",
                        file.display(),
                        several.len(),
                        classes.display(),
                        several.iter().map(usize::to_string).collect::<Vec<_>>().join(", #")
                    ),
                    hint: Some("give the class by its number: `#N`, counted from 0 over the classes".into()),
                }),
                None => Err(Error::Data {
                    message: format!("`{}`: label `{name}` is not a class of `{}`", file.display(), classes.display()),
                    hint: Some(match numbered {
                        Some(_) => {
                            format!("`{}` has {} classes, numbered from #0", classes.display(), class_names.len())
                        }
                        None => "labels name a class (any of its synonyms, or `#N`)".into(),
                    }),
                }),
            }
        };
        let mut images = Vec::new();
        let mut labels = Vec::new();
        let mut skipped = 0;
        let files = image_tables.expand().map_err(Error::data)?;
        for file in &files {
            let file = file.as_path();
            for batch in crate::io::parquet::read_file(file)? {
                let paths = string_column(&batch, &c.image_column, file)?;
                let names = string_column(&batch, &c.label_column, file)?;
                for (path, label) in paths.into_iter().zip(names) {
                    let (Some(path), Some(label)) = (path, label) else {
                        skipped += 1;
                        continue;
                    };
                    let set: Vec<usize> = label.split('|').map(|l| index(file, l.trim())).collect::<Result<_>>()?;
                    let full = match &c.image_root {
                        Some(root) => root.join(&path),
                        None => Path::new(&path).to_owned(),
                    };
                    let img = read_image(&ImageSource::File(full))?;
                    transform.test(&img, &mut images);
                    labels.push(set);
                }
            }
        }
        // No image at all would score 0.0 at every evaluation (hit@k of nothing) and look like
        // a model that learnt nothing: refuse it before training.
        if labels.is_empty() {
            let names: Vec<String> = files.iter().map(|f| format!("`{}`", f.display())).collect();
            return Err(Error::Data {
                message: format!(
                    "no zero-shot images in {} ({skipped} row(s) with a null `{}` or `{}`)",
                    names.join(", "),
                    c.image_column,
                    c.label_column
                ),
                hint: Some(
                    "`eval.images` must list tables with image paths and labels (`eval.image_column`, \
                     `eval.label_column`), or leave out `[eval]`"
                        .into(),
                ),
            });
        }
        let prompt = |t: &String, names: &Vec<String>| -> Result<String> {
            let p = class_prompt(t, names);
            match pre_caption {
                true => crate::text::pre_caption(&p, crate::text::PRE_CAPTION_WORDS).ok_or_else(|| Error::Data {
                    message: format!("the zero-shot prompt `{p}` has nothing left after `pre_caption`"),
                    hint: Some("the run trains with `data.pre_caption`: give templates and class names words".into()),
                }),
                false => Ok(p),
            }
        };
        let prompts = class_names
            .iter()
            .flat_map(|names| c.templates.iter().map(move |t| (t, names)))
            .map(|(t, names)| prompt(t, names))
            .collect::<Result<Vec<String>>>()?;
        Ok(ZeroShot {
            images,
            size,
            labels,
            prompts,
            templates: c.templates.len(),
            keep_prompts: c.keep_prompts,
            classes: class_names.len(),
            skipped,
            shared_names,
        })
    }

    /// Flat hit@1, 2, 5 and 10 of `model` (an inference copy: [`burn::module::Module::valid`]).
    pub fn evaluate(&self, model: &DualEncoder, tokenizer: &Tokenizer) -> Result<ZeroShotScores> {
        let device: Device = model.image_proj.weight.val().device();
        let d = self.classes;
        // Class embeddings: mean of the normalised template embeddings (with `keep_prompts`, of
        // the least uncertain ones), renormalised.
        let mut class_rows = Vec::new();
        let mut uncertainty: Vec<f64> = Vec::new();
        for chunk in self.prompts.chunks(256) {
            let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let (ids, mask, seq) = tokenize(tokenizer, &texts)?;
            let shape = [texts.len(), seq];
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, shape), &device);
            let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, shape), &device);
            let (e, log_var) = model.encode_text_with_log_var(ids, mask);
            class_rows.push(l2_normalize(e));
            if let (Some(_), Some(v)) = (self.keep_prompts, log_var) {
                // ‖σ²‖₁ of each prompt (§3.11), as `curate eval` takes it.
                let width = v.dims()[1];
                let v = v.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
                uncertainty.extend(super::trained::uncertainties(&v, width));
            }
        }
        let prompts = Tensor::cat(class_rows, 0);
        let dim = prompts.dims()[1];
        let t = self.templates;
        let prompts = prompts.reshape([d, t, dim]);
        let classes = match self.keep_prompts {
            None => prompts.mean_dim(1),
            Some(k) => {
                if uncertainty.len() != d * t {
                    return Err(Error::data("`eval.keep_prompts` needs a model with PCME++'s text log-variance head"));
                }
                // Per class, weight 1/k on its k least uncertain prompts (ties: template order).
                let k = k.min(t);
                let mut weights = vec![0f32; d * t];
                for (class, u) in uncertainty.chunks(t).enumerate() {
                    let mut order: Vec<usize> = (0..t).collect();
                    order.sort_by(|&a, &b| u[a].total_cmp(&u[b]).then(a.cmp(&b)));
                    for &j in &order[..k] {
                        weights[class * t + j] = 1.0 / k as f32;
                    }
                }
                let w = Tensor::<3>::from_data(TensorData::new(weights, [d, t, 1]), &device);
                (prompts * w).sum_dim(1)
            }
        };
        let classes = l2_normalize(classes.reshape([d, dim]));
        let per_image = 3 * self.size * self.size;
        let n = self.labels.len();
        let mut scores = Vec::with_capacity(n * d);
        for start in (0..n).step_by(64) {
            let b = 64.min(n - start);
            let pixels = self.images[start * per_image..(start + b) * per_image].to_vec();
            let x = Tensor::<4>::from_data(TensorData::new(pixels, [b, 3, self.size, self.size]), &device);
            let e = l2_normalize(model.encode_image(x));
            let s = e.matmul(classes.clone().transpose());
            scores.extend(s.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?);
        }
        Ok(ZeroShotScores {
            top1: hit_at_k(&scores, d, &self.labels, 1),
            top2: hit_at_k(&scores, d, &self.labels, 2),
            top5: hit_at_k(&scores, d, &self.labels, 5),
            top10: hit_at_k(&scores, d, &self.labels, 10),
            classes: d,
        })
    }
}
