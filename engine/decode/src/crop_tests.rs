use super::*;
use crate::spec::{Crop, ImageSpec, Layout, DEFAULT_MAX_PIXELS};

fn rrc_spec(flip: bool) -> ImageSpec {
    ImageSpec::new(
        224,
        224,
        Layout::Chw,
        Crop::RANDOM_RESIZED_DEFAULT,
        flip,
        DEFAULT_MAX_PIXELS,
    )
    .unwrap()
}

#[test]
fn random_resized_boxes_stay_inside_torchvisions_bounds() {
    let spec = rrc_spec(true);
    let sizes = [
        (500u32, 375u32),
        (375, 500),
        (224, 224),
        (1500, 300),
        (7, 5),
        (1, 1),
        (4000, 3000),
    ];
    for &(w_img, h_img) in &sizes {
        let area = f64::from(w_img) * f64::from(h_img);
        for index in 0..2000 {
            let b = crop_box(&spec, 9, 3, index, w_img, h_img);
            assert!(b.w >= 1 && b.h >= 1, "{b:?}");
            assert!(
                b.x + b.w <= w_img && b.y + b.h <= h_img,
                "{b:?} outside {w_img}x{h_img}"
            );
            assert_eq!(b.resized, None);
            // A box from a try has area and ratio within the bounds, up to
            // the rounding of w and h to whole pixels; a fallback box spans
            // a whole side.
            let (bw, bh) = (f64::from(b.w), f64::from(b.h));
            let fallback = b.w == w_img || b.h == h_img;
            assert!(
                fallback || bw * bh >= 0.08 * area - (bw + bh),
                "{b:?} area under 8%"
            );
            if !fallback && b.w > 8 && b.h > 8 {
                let ratio = bw / bh;
                let slack = 1.0 / bw.min(bh) + 1e-9;
                assert!(
                    ratio >= 0.75 - 2.0 * slack && ratio <= 4.0 / 3.0 + 2.0 * slack,
                    "{b:?} ratio {ratio}"
                );
            }
        }
    }
}

#[test]
fn a_very_wide_image_takes_the_centre_crop_fallback_at_the_widest_ratio() {
    // Every try needs h >= sqrt(0.08 * 10,000 / (4/3)) = 24 > 10 rows: all 10 fail.
    let b = crop_box(&rrc_spec(false), 1, 0, 0, 1000, 10);
    assert_eq!((b.x, b.y, b.w, b.h), (493, 0, 13, 10));
}

#[test]
fn a_very_tall_image_takes_the_centre_crop_fallback_at_the_narrowest_ratio() {
    let b = crop_box(&rrc_spec(false), 1, 0, 0, 10, 1000);
    // w = 10, h = round(10 / (3/4)) = 13, centred: y = (1000 - 13) // 2.
    assert_eq!((b.x, b.y, b.w, b.h), (0, 493, 10, 13));
}

#[test]
fn a_fallback_within_the_ratio_bounds_is_the_whole_image() {
    // scale (2, 3): every try wants more area than the image has.
    let crop = Crop::RandomResized {
        scale: (2.0, 3.0),
        ratio: (0.75, 4.0 / 3.0),
    };
    let spec = ImageSpec::new(8, 8, Layout::Hwc, crop, false, DEFAULT_MAX_PIXELS).unwrap();
    let b = crop_box(&spec, 5, 5, 5, 120, 100);
    assert_eq!((b.x, b.y, b.w, b.h), (0, 0, 120, 100));
}

#[test]
fn the_same_seed_epoch_and_index_give_the_same_box_in_any_order() {
    let spec = rrc_spec(true);
    let forward: Vec<CropBox> = (0..500)
        .map(|i| crop_box(&spec, 42, 7, i, 640, 480))
        .collect();
    let backward: Vec<CropBox> = (0..500)
        .rev()
        .map(|i| crop_box(&spec, 42, 7, i, 640, 480))
        .collect();
    assert!(forward.iter().eq(backward.iter().rev()));
}

#[test]
fn different_indices_epochs_and_seeds_give_different_boxes() {
    let spec = rrc_spec(true);
    let base = crop_box(&spec, 42, 0, 0, 640, 480);
    let by_index: std::collections::HashSet<_> = (0..200)
        .map(|i| crop_box(&spec, 42, 0, i, 640, 480))
        .map(|b| (b.x, b.y, b.w, b.h))
        .collect();
    assert!(
        by_index.len() > 190,
        "only {} distinct boxes in 200 indices",
        by_index.len()
    );
    assert_ne!(crop_box(&spec, 42, 1, 0, 640, 480), base, "another epoch");
    assert_ne!(crop_box(&spec, 43, 0, 0, 640, 480), base, "another seed");
}

#[test]
fn the_algorithm_is_pinned_so_a_change_shows_up_here() {
    // docs/images.md promises boxes stable across versions: these values
    // were computed by the documented algorithm when it was written.
    let spec = rrc_spec(true);
    let got: Vec<(u32, u32, u32, u32, bool)> = (0..3)
        .map(|i| crop_box(&spec, 0, 0, i, 500, 375))
        .map(|b| (b.x, b.y, b.w, b.h, b.flip))
        .collect();
    assert_eq!(got, PINNED);
}

const PINNED: [(u32, u32, u32, u32, bool); 3] = [
    (139, 7, 294, 364, true),
    (208, 77, 223, 214, true),
    (77, 186, 170, 161, true),
];

#[test]
fn flips_are_drawn_about_half_the_time_and_only_when_asked() {
    let flips = (0..10_000)
        .filter(|&i| crop_box(&rrc_spec(true), 1, 2, i, 64, 64).flip)
        .count();
    assert!((4_500..5_500).contains(&flips), "{flips} flips in 10,000");
    assert!((0..1000).all(|i| !crop_box(&rrc_spec(false), 1, 2, i, 64, 64).flip));
}

#[test]
fn the_flip_does_not_change_the_box() {
    for i in 0..200 {
        let (a, b) = (
            crop_box(&rrc_spec(true), 3, 0, i, 300, 200),
            crop_box(&rrc_spec(false), 3, 0, i, 300, 200),
        );
        assert_eq!((a.x, a.y, a.w, a.h), (b.x, b.y, b.w, b.h));
    }
}

#[test]
fn center_crop_resizes_the_shorter_side_then_centres_like_torchvision() {
    let spec = ImageSpec::new(
        224,
        224,
        Layout::Hwc,
        Crop::Center { resize: 256 },
        false,
        DEFAULT_MAX_PIXELS,
    )
    .unwrap();
    // 500x375: shorter side 375 -> 256, longer int(256 * 500 / 375) = 341;
    // left = int(round((341 - 224) / 2)) = round(58.5) = 58 (half to even), top = 16.
    let b = crop_box(&spec, 0, 0, 0, 500, 375);
    assert_eq!(
        b,
        CropBox {
            x: 58,
            y: 16,
            w: 224,
            h: 224,
            flip: false,
            resized: Some((341, 256))
        }
    );
    let tall = crop_box(&spec, 0, 0, 0, 375, 500);
    assert_eq!((tall.x, tall.y, tall.resized), (16, 58, Some((256, 341))));
}

#[test]
fn python_rounding_is_half_to_even() {
    assert_eq!(
        (py_round(0.5), py_round(1.5), py_round(2.5), py_round(2.6)),
        (0, 2, 2, 3)
    );
}
