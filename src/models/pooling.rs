//! Sentence embeddings from token states: mean over the attention mask (Sentence-BERT's
//! default, and the Fistful/OTTER text pooling) or the `[CLS]` token; optional L2
//! normalisation (sentence-transformers' `Normalize` module).

use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Mean of the token states where the attention mask is 1 (special tokens included).
    Mean,
    /// The first token's state.
    Cls,
}

/// # Shapes
/// - `states`: `[batch, seq, hidden]`, `mask`: `[batch, seq]`
/// - output: `[batch, hidden]`
pub fn pool(states: Tensor<3>, mask: Tensor<2, Int>, pooling: Pooling) -> Tensor<2> {
    let [b, s, h] = states.dims();
    match pooling {
        Pooling::Cls => states.slice([0..b, 0..1, 0..h]).reshape([b, h]),
        Pooling::Mean => {
            let m = mask.float().reshape([b, s, 1]);
            let summed = (states * m.clone()).sum_dim(1).reshape([b, h]);
            // sentence-transformers clamps the token count at 1e-9.
            let count = m.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
            summed / count
        }
    }
}

/// Row-wise L2 normalisation, `x / max(‖x‖, 1e-12)` (torch.nn.functional.normalize).
///
/// # Shapes
/// - `x`: `[batch, dim]` → `[batch, dim]`
pub fn l2_normalize(x: Tensor<2>) -> Tensor<2> {
    let norm = x.clone().powf_scalar(2.0).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}
