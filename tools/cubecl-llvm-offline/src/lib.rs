//! Offline stand-in for `cubecl-llvm` 0.11.3: it exists so that `--features cuda` builds where
//! github.com is unreachable (the real crate's build script downloads an LLVM bundle from there).
//!
//! `cubecl-cuda` 0.11 always links `cubecl-llvm`, but only uses it for its LLVM/pliron backend.
//! curate's `cuda` feature turns on `cubecl/cuda-cpp`, which makes `cubecl-cuda` compile kernels
//! to CUDA C++ and hand them to NVRTC, so nothing here is ever called to compile a kernel. This
//! crate provides just the names `cubecl-cuda` refers to; selecting the LLVM backend anyway
//! gives a [`CompilationError`] that says so.
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use cubecl_environment::backtrace::BackTrace;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::kernel::{BufferIOAttr, KernelDefinition};

const NO_LLVM: &str = "cubecl-llvm offline stand-in: the LLVM (pliron) backend is not built in; \
     build curate's `cuda` feature, which selects cubecl-cuda's NVRTC (`cpp`) backend";

/// Which code the (absent) LLVM backend would emit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Cpu,
    #[cfg(feature = "nvptx")]
    Nvptx,
}

/// Placeholder for the AMD GPU architecture option; never constructed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GfxArch {}

/// Options of the LLVM backend (read by nothing here).
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    pub arch: Option<GfxArch>,
    #[cfg(feature = "nvptx")]
    pub sm_arch: Option<cubecl_core::ir::nvidia::SmArch>,
    #[cfg(feature = "nvptx")]
    pub ptx_version: Option<nvptx::ptx_version::PtxVersion>,
    pub grid_constants: bool,
}

/// A PTX module as the LLVM backend would return it.
#[derive(Clone, Debug, Default)]
pub struct NvptxModule {
    /// NUL-terminated PTX text.
    pub ptx: Vec<core::ffi::c_char>,
    pub entrypoint: String,
    /// Intermediate representation, for logs.
    pub ir: String,
    pub shared_memory_size: usize,
    pub io: Vec<BufferIOAttr>,
}

/// What a compilation produces.
#[derive(Clone, Debug)]
pub enum PlironArtifact {
    #[cfg(feature = "nvptx")]
    NvptxCode(NvptxModule),
    /// Never produced (keeps the enum inhabited without `nvptx`).
    Unavailable,
}

/// The LLVM backend's compiler: here every compilation fails with a clear error.
#[derive(Clone, Debug, Default)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

impl PlironCompiler {
    /// Always an error: this build has no LLVM backend.
    pub fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &PlironOptions,
    ) -> Result<PlironArtifact, CompilationError> {
        Err(CompilationError::Generic {
            reason: String::from(NO_LLVM),
            backtrace: BackTrace::capture(),
        })
    }

    pub fn lang_tag(&self) -> &'static str {
        "llvm"
    }
}

#[cfg(feature = "nvptx")]
pub mod nvptx {
    pub mod ptx_version {
        /// A PTX ISA version, `major * 10 + minor` (8.7 is 87).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct PtxVersion(pub u32);

        impl PtxVersion {
            /// The PTX version the LLVM backend would emit for a driver (`cuDriverGetVersion`).
            /// Always `None` here: the stand-in emits no PTX, and cubecl-cuda only uses the
            /// value with the LLVM backend (its options and its cache namespace).
            pub fn for_driver(_driver: i32) -> Option<Self> {
                None
            }
        }

        impl core::fmt::Display for PtxVersion {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "ptx{}", self.0)
            }
        }
    }
}

pub mod shared {
    pub mod lowered_features {
        use cubecl_core::ir::DeviceProperties;

        /// GPU targets of the LLVM backend.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum GpuTarget {
            #[cfg(feature = "nvptx")]
            Nvptx,
            #[cfg(feature = "amdgpu")]
            AmdGpu,
        }

        /// The real crate removes the matrix forms its LLVM backend cannot lower. cubecl-cuda
        /// calls it only when that backend is selected, which curate never does; the properties
        /// are left as they are.
        pub fn restrict_features(_props: &mut DeviceProperties, _target: GpuTarget) {}
    }
}
