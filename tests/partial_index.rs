//! Decodes of some of a block's pixels check the spatial index fields they
//! cover: once one finds a field that disagrees with the decoded counts, no
//! index product is served from that block (issue 16). The index is forged
//! as `tests/clients/test_forged_index.py` does it: one index bit flipped
//! and the file's checksums recomputed, so that only a decode can tell.

use qemfs::qem::{QemError, QemFile, Tile};
use qemfs::reduce::{Cpu, Reducer};

#[path = "support/reseal.rs"]
mod reseal;
use reseal::{array_offset, body_start, refresh_checksums};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/conformance/qem/u8-mixed-13x7.qem"
);

/// The fixture with the lowest bit of chunk 0's first spatial-index word
/// flipped, its body checksum and header digest recomputed (spec §3, §4).
fn forged() -> Vec<u8> {
    let original = std::fs::read(FIXTURE).unwrap();
    let mut forged = original.clone();
    forged[body_start(&original) + array_offset(&original, 3)] ^= 1;
    refresh_checksums(forged, &original)
}

fn is_index_error(e: &QemError) -> bool {
    matches!(e, QemError::SpatialIndex { .. })
}

/// What a whole-block decode finds (the reference verdict).
fn whole_block_verdict(bytes: Vec<u8>) -> String {
    let file = QemFile::from_bytes(bytes).unwrap();
    file.verify_block_index(0).unwrap_err().to_string()
}

#[test]
fn the_forgery_is_served_until_a_decode_covers_its_tile() {
    let file = QemFile::from_bytes(forged()).unwrap();
    let n = file.frames();
    // Nothing decoded yet: the index is all there is (the default).
    file.spatial_sums(Tile::Px8, 0..n).unwrap();
    // One pixel of the lower 8×8 tile covers no field holding the flip.
    let [_, _, _, c] = file.shape();
    file.decode_pixels(&[9 * c]).unwrap();
    assert!(file.block_index_verdict(0).is_none());
    file.spatial_sums(Tile::Px8, 0..n).unwrap();
    // Every pixel of the first 8×8 tile (rows 0..8), some twice: its field
    // is checked, found forged, and no index product is served any more.
    let mut tile: Vec<usize> = (0..8 * c).collect();
    tile.extend(0..4);
    let pixels = file.decode_pixels(&tile).unwrap();
    assert_eq!(pixels.frames, n);
    let err = file.spatial_sums(Tile::Px8, 0..n).unwrap_err();
    assert!(is_index_error(&err), "{err}");
    assert_eq!(err.to_string(), whole_block_verdict(forged()));
    let err = file.spatial_sums(Tile::Px32, 0..1).unwrap_err();
    assert!(is_index_error(&err), "{err}");
}

#[test]
fn a_reduction_over_every_pixel_finds_the_forgery() {
    let file = QemFile::from_bytes(forged()).unwrap();
    // The centre of mass and the patterns decode every valid pixel, in
    // groups; their values are the decoded counts and are served.
    let reducer = Reducer::new(&file, &Cpu).unwrap();
    reducer.full().unwrap();
    let verdict = file.block_index_verdict(0).expect("checked on the way");
    assert_eq!(
        verdict.unwrap_err().to_string(),
        whole_block_verdict(forged())
    );
    // The index products of the block are refused from now on.
    let err = file.spatial_sums(Tile::Px32, 0..file.frames()).unwrap_err();
    assert!(is_index_error(&err), "{err}");
    let err = reducer
        .images(&[qemfs::reduce::PixelSet::new((0..8 * 7).collect())])
        .unwrap_err();
    assert!(err.to_string().contains("spatial index"), "{err}");
}

#[test]
fn a_sound_index_checked_by_a_reduction_is_known_sound() {
    let file = QemFile::open(FIXTURE).unwrap();
    Reducer::new(&file, &Cpu).unwrap().full().unwrap();
    for b in 0..file.blocks().len() {
        assert!(
            matches!(file.block_index_verdict(b), Some(Ok(()))),
            "block {b}: every field covered and agreeing"
        );
    }
    let n = file.frames();
    let sums = file.spatial_sums(Tile::Px32, 0..n).unwrap();
    assert_eq!(
        sums,
        file.spatial_sums_checked(Tile::Px32, 0..n, true).unwrap()
    );
}
