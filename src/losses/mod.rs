//! Training losses for CLIP-style dual encoders (issue 4, item 3), one module per paper's loss:
//!
//! | `loss.type` | module | spec |
//! | --- | --- | --- |
//! | `infonce` | [`infonce`] — symmetric InfoNCE, fixed or learnable temperature | `bow-and-otter.md` §5.5 |
//! | `memory_bank` | [`memory_bank`] — FIFO banks of EMA features, Fistful eqs. 1–3; EMA helper | `bow-and-otter.md` §4 |
//! | `label_smoothing` | [`label_smoothing`] — OTTER's LS baseline | `bow-and-otter.md` §5.6 |
//! | `kd` | [`kd`] — OTTER's KD baseline (paper and released-script variants) | `bow-and-otter.md` §5.6, A12 |
//! | `otter` | [`otter`] — teacher similarity, Sinkhorn-Knopp soft labels, α mixing | `bow-and-otter.md` §5.2–5.5 |
//! | `cusa` | [`cusa`] — ITC + CSA + USA from uni-modal teacher features | `cusa-and-pcmepp.md` §2 |
//! | `pcmepp` | [`pcmepp`] — closed-form sampled distance, pseudo-positives, VIB | `cusa-and-pcmepp.md` §3 |
//!
//! Every loss is a plain function of burn tensors (or a small struct holding its config and
//! learnable scalars) that returns a scalar tensor of shape `[1]`, works on any burn device and
//! backpropagates when the inputs live on an autodiff device (`Device::flex().autodiff()`).
//! [`common`] holds the shared pieces (soft cross entropy, KL with `0·log 0 = 0`, the clamped
//! log logit scale); [`bank_log_sum_exp`] the memory bank's denominator, one autodiff operation on
//! the CPU. The trainer (`train/`) picks a loss with [`LossConfig`], the `[loss]` table
//! of a training config, tagged by `type`.

pub mod bank_log_sum_exp;
pub mod common;
pub mod cusa;
pub mod infonce;
pub mod kd;
pub mod label_smoothing;
pub mod memory_bank;
pub mod otter;
pub mod pcmepp;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The value of `loss.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    Infonce,
    MemoryBank,
    LabelSmoothing,
    Kd,
    Otter,
    Cusa,
    Pcmepp,
}

impl LossType {
    pub const ALL: [LossType; 7] = [
        LossType::Infonce,
        LossType::MemoryBank,
        LossType::LabelSmoothing,
        LossType::Kd,
        LossType::Otter,
        LossType::Cusa,
        LossType::Pcmepp,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LossType::Infonce => "infonce",
            LossType::MemoryBank => "memory_bank",
            LossType::LabelSmoothing => "label_smoothing",
            LossType::Kd => "kd",
            LossType::Otter => "otter",
            LossType::Cusa => "cusa",
            LossType::Pcmepp => "pcmepp",
        }
    }
}

impl fmt::Display for LossType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LossType {
    type Err = String;

    /// Parses a `loss.type` value (as `--set loss.type=...` gives it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LossType::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<&str> = LossType::ALL.iter().map(|t| t.name()).collect();
            format!("unknown loss type `{s}`; expected one of {}", names.join(", "))
        })
    }
}

/// The `[loss]` table of a training config: `type` picks the loss, the other keys are that
/// loss's config (each with the paper's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LossConfig {
    Infonce(infonce::InfonceConfig),
    MemoryBank(memory_bank::MemoryBankConfig),
    LabelSmoothing(label_smoothing::LabelSmoothingConfig),
    Kd(kd::KdConfig),
    Otter(otter::OtterConfig),
    Cusa(cusa::CusaConfig),
    Pcmepp(pcmepp::PcmeppConfig),
}

impl LossConfig {
    pub fn loss_type(&self) -> LossType {
        match self {
            LossConfig::Infonce(_) => LossType::Infonce,
            LossConfig::MemoryBank(_) => LossType::MemoryBank,
            LossConfig::LabelSmoothing(_) => LossType::LabelSmoothing,
            LossConfig::Kd(_) => LossType::Kd,
            LossConfig::Otter(_) => LossType::Otter,
            LossConfig::Cusa(_) => LossType::Cusa,
            LossConfig::Pcmepp(_) => LossType::Pcmepp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_type_names_round_trip() {
        for t in LossType::ALL {
            assert_eq!(t.name().parse::<LossType>().unwrap(), t);
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.name()));
            assert_eq!(serde_json::from_str::<LossType>(&json).unwrap(), t);
        }
        assert!("info_nce".parse::<LossType>().unwrap_err().contains("memory_bank"));
    }

    #[test]
    fn loss_table_parses_with_defaults_and_rejects_unknown_keys() {
        let c: LossConfig = toml::from_str("type = \"infonce\"\ntemperature = 0.02").unwrap();
        assert_eq!(c.loss_type(), LossType::Infonce);
        let LossConfig::Infonce(i) = c else { unreachable!() };
        assert_eq!(i.temperature, 0.02);
        assert!(i.learnable_temperature);
        let c: LossConfig = toml::from_str("type = \"memory_bank\"").unwrap();
        assert_eq!(c, LossConfig::MemoryBank(memory_bank::MemoryBankConfig::default()));
        for t in LossType::ALL {
            let c: LossConfig = toml::from_str(&format!("type = \"{t}\"")).unwrap();
            assert_eq!(c.loss_type(), t);
        }
        let c: LossConfig = toml::from_str("type = \"otter\"\nsinkhorn_iterations = 0").unwrap();
        let LossConfig::Otter(o) = c else { unreachable!() };
        assert_eq!((o.sinkhorn_iterations, o.sinkhorn_lambda, o.alpha), (0, 0.15, 0.5));
        assert!(toml::from_str::<LossConfig>("type = \"cusa\"\nitc_reduction = \"median\"").is_err());
        assert!(toml::from_str::<LossConfig>("type = \"infonce\"\ntemprature = 0.02").is_err());
    }
}
