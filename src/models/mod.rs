//! Encoders in burn that load published checkpoints (issue 3): one module per model family,
//! each a config + module — `bert` (BERT, MiniLM, DistilBERT), `mpnet` (all-mpnet-base-v2, the
//! CUSA text teacher), `resnet` (torchvision ResNets), `fbnet` (mobile-vision's FBNetV3-A/C), `vit` (ViT-B/32 in OpenAI CLIP's and
//! Unicom's layouts: the CLIP image tower and the CUSA image teacher), `clip_text` (CLIP's text
//! transformer, and the sizes of an open_clip model folder). `weights` reads
//! safetensors (and, through `torch_checkpoint`, PyTorch `torch.save` files) and checks every
//! tensor name and shape; `pooling` turns token states into
//! sentence embeddings; `text_encoder` adds the tokenizer and picks the text model from
//! `config.json`; `gpo` is VSE∞'s generalised pooling (PCME++'s heads);
//! `host_batch_norm` and `host_conv` are BatchNorm (training and inference) and convolution as
//! single operations on the CPU (fused loops; matrix products over groups of images;
//! `host_autodiff` holds what they share), `host_max_pool` ResNet's max pooling in inference,
//! `host_linear` and `host_attention` the transformers' linear layers and attention;
//! `preprocess` turns image bytes into normalised tensors and `image_encoder` runs the image
//! models on them.
//! Models run on any burn device (`Device::flex()` on CPU, `Device::cuda(0)` with the `cuda`
//! feature).

pub mod activation;
pub mod bert;
pub mod clip_text;
pub mod fbnet;
pub mod gpo;
pub mod host_attention;
pub(crate) mod host_autodiff;
pub mod host_batch_norm;
pub mod host_conv;
pub mod host_depthwise;
pub mod host_linear;
pub mod host_max_pool;
pub mod image_encoder;
pub mod mpnet;
pub mod pooling;
pub mod preprocess;
pub mod resnet;
#[cfg(test)]
pub(crate) mod test_support;
pub mod text_encoder;
pub mod torch_checkpoint;
pub mod vit;
pub mod weights;
