//! The decode stage: image bytes (JPEG, PNG, WebP) to a fixed-shape uint8
//! RGB tensor, with torchvision's `RandomResizedCrop`/`Resize`+`CenterCrop`
//! and a horizontal flip drawn from (seed, epoch, sample index) alone.
//!
//! ```no_run
//! use ringfeed_decode::{Crop, Decoder, ImageSpec, Layout, DEFAULT_MAX_PIXELS};
//! let spec = ImageSpec::new(224, 224, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, true, DEFAULT_MAX_PIXELS)?;
//! let mut decoder = Decoder::new(); // one per thread
//! let mut out = vec![0u8; spec.output_len()];
//! let bytes = std::fs::read("cat.jpg")?;
//! let info = decoder.decode_into(&bytes, &spec, 42, 0, 7, &mut out)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! docs/images.md specifies the crop algorithm and says why these decoders.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod budget;
mod crop;
mod decoder;
mod error;
mod formats;
mod probe;
mod spec;

pub use budget::{max_pixels_within, MemoryBudget, DEFAULT_MEMORY_BUDGET};
pub use crop::{crop_box, CropBox};
pub use decoder::{zero_fill, Decoder, ImageInfo};
pub use error::{DecodeError, Format};
pub use spec::{Crop, ImageSpec, Layout, SpecError, DEFAULT_MAX_PIXELS, MAX_OUTPUT_SIDE};
