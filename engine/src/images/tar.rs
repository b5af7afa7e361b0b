//! A tar sample's image member (`--format tar`): which member is the image
//! (its label member is read by `labels.rs`).

/// Which members of a tar sample (`--format tar`) are its image and its
/// label, by field name (the extension, lowercased).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarFields {
    /// The image's field (`--image-field`); None: the first of jpg, jpeg,
    /// png, webp.
    pub image: Option<String>,
    /// The label's field (`--label-field`, default cls): a decimal integer
    /// (read by `Labels`).
    pub label: String,
}

/// Fields an image is found in when `--image-field` is not given.
const IMAGE_FIELDS: [&[u8]; 4] = [b"jpg", b"jpeg", b"png", b"webp"];

/// A tar sample's image bytes (its label is read by `Labels`).
pub(super) fn tar_image<'a>(sample: &'a [u8], fields: &TarFields) -> Result<&'a [u8], String> {
    let mut cursor = 0;
    while let Some(f) = crate::ring::tar_fields::next_field(sample, &mut cursor)
        .map_err(|e| format!("its tar members cannot be read: {e}"))?
    {
        let name = f.field_name();
        let wanted = match &fields.image {
            Some(want) => name.as_ref() == want.as_bytes(),
            None => IMAGE_FIELDS.contains(&name.as_ref()),
        };
        if wanted {
            return Ok(f.data);
        }
    }
    Err(match &fields.image {
        Some(want) => format!("it has no .{want} member (--image-field)"),
        None => {
            "it has no .jpg, .jpeg, .png or .webp member; name the image's field with --image-field"
                .to_string()
        }
    })
}
