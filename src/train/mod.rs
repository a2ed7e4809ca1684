//! `curate train` (issue 4): trains a CLIP-style dual encoder on `curate run` outputs with any of
//! the losses of [`crate::losses`] (spec `bow-and-otter.md` §4–6, `cusa-and-pcmepp.md` §2–3).
//!
//! - [`config`]: the training file (TOML, `--set` overrides, errors with file:line);
//! - [`dual_encoder`]: ResNet + projection, BERT-family text tower + pooling (+ projection);
//! - [`data`]: training tables, augmentation, tokenisation, prefetching workers;
//! - [`optim`]: SGD / AdamW / AdamP, the schedules, per-tower rates, gradient clipping;
//! - [`adamp`]: AdamP, PCME++'s optimiser;
//! - [`run`]: the loop — metrics, checkpoints, resume, the NaN guard;
//! - [`interrupt`]: Ctrl-C stops the loop after its step, with a checkpoint to resume from;
//! - [`sampling_profile`]: `--sample-profile`, where the host's time goes over a few steps;
//! - [`trained`]: a finished run loaded frozen, embedding captions and images;
//! - [`zeroshot`]: zero-shot top-1/top-5 (flat hit@k) at step 0, during and after training.
//!
//! Depends on `models`, `losses` and `io`; nothing here knows about `cli`.

pub mod adamp;
pub mod config;
pub mod data;
pub mod dual_encoder;
pub mod interrupt;
pub mod optim;
pub mod run;
pub mod sampling_profile;
pub mod trained;
pub mod transform;
pub mod zeroshot;

pub use config::TrainConfig;
pub use run::{train, TrainOptions, TrainSummary};
