//! A tar sample's image and label members (`--format tar`): which member
//! is the image, and the label's decimal class index.

/// Which members of a tar sample (`--format tar`) are its image and its
/// label, by field name (the extension, lowercased).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarFields {
    /// The image's field (`--image-field`); None: the first of jpg, jpeg,
    /// png, webp.
    pub image: Option<String>,
    /// The label's field (`--label-field`, default cls): a decimal integer;
    /// a sample without one has label -1.
    pub label: String,
}

/// Fields an image is found in when `--image-field` is not given.
const IMAGE_FIELDS: [&[u8]; 4] = [b"jpg", b"jpeg", b"png", b"webp"];

/// A tar sample's label alone (one without an image has one too).
pub(super) fn label_only(sample: &[u8], fields: &TarFields) -> Option<i64> {
    let mut cursor = 0;
    while let Ok(Some(f)) = crate::ring::tar_fields::next_field(sample, &mut cursor) {
        if f.field_name().as_ref() == fields.label.as_bytes() {
            return String::from_utf8_lossy(f.data).trim().parse().ok();
        }
    }
    None
}

/// A tar sample's image bytes and its label, if it has one.
pub(super) fn tar_parts<'a>(
    sample: &'a [u8],
    fields: &TarFields,
) -> Result<(&'a [u8], Option<i64>), String> {
    let mut cursor = 0;
    let (mut image, mut label) = (None, None);
    while let Some(f) = crate::ring::tar_fields::next_field(sample, &mut cursor)
        .map_err(|e| format!("its tar members cannot be read: {e}"))?
    {
        let name = f.field_name();
        let wanted = match &fields.image {
            Some(want) => name.as_ref() == want.as_bytes(),
            None => IMAGE_FIELDS.contains(&name.as_ref()),
        };
        if wanted && image.is_none() {
            image = Some(f.data);
        }
        if name.as_ref() == fields.label.as_bytes() {
            let text = String::from_utf8_lossy(f.data);
            label = Some(text.trim().parse::<i64>().map_err(|_| {
                format!(
                    "its .{} member {:?} is not a whole number (a class index)",
                    fields.label,
                    text.chars().take(40).collect::<String>()
                )
            })?);
        }
    }
    let image = image.ok_or_else(|| match &fields.image {
        Some(want) => format!("it has no .{want} member (--image-field)"),
        None => {
            "it has no .jpg, .jpeg, .png or .webp member; name the image's field with --image-field"
                .to_string()
        }
    })?;
    Ok((image, label))
}
