//! Tile sums read from the spatial index, for any frame range (starting
//! inside a block, spanning blocks and chunks) and either tile size, equal
//! the sums of the decoded frames' pixels over each tile.

use qemfs::qem::write::{encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec};
use qemfs::qem::{QemFile, Tile};

const SHAPE: [u64; 4] = [1, 1100, 40, 36];

/// Counts with zeros, small values and some large ones, so that the
/// index's bit widths vary from block to block.
fn counts(n: usize) -> Vec<u16> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 16 {
                0..=8 => 0,
                9..=14 => (x >> 20) as u16 % 9,
                _ => (x >> 24) as u16,
            }
        })
        .collect()
}

/// Per frame, the sum over each `edge × edge` tile, tile-row order.
fn tile_sums(frames: &[u16], r: usize, c: usize, tile: Tile) -> Vec<u32> {
    let (gr, gc) = tile.grid(r, c);
    let edge = tile.edge();
    let mut out = vec![];
    for frame in frames.chunks_exact(r * c) {
        let mut sums = vec![0u32; gr * gc];
        for (i, &v) in frame.iter().enumerate() {
            let (y, x) = (i / c, i % c);
            sums[(y / edge) * gc + x / edge] += u32::from(v);
        }
        out.extend(sums);
    }
    out
}

#[test]
fn index_sums_of_any_frame_range_match_the_decoded_frames() {
    let [_, n, r, c] = SHAPE.map(|d| d as usize);
    let values = counts(n * r * c);
    let dense: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Chunks of 600 scans: blocks of 512 and 88 frames, then 500.
    let spec = WriteSpec::counts(
        SHAPE,
        CountDtype::U16,
        scientific_metadata(SHAPE, &Calibration::default()).unwrap(),
    )
    .with_chunk_scans(600);
    let file = QemFile::from_bytes(encode_to_vec(spec, &dense).unwrap()).unwrap();
    let mut decoded = vec![0u8; dense.len()];
    file.read_frames(0..n, &mut decoded).unwrap();
    assert_eq!(decoded, dense);
    for tile in [Tile::Px8, Tile::Px32] {
        let (gr, gc) = tile.grid(r, c);
        let per_frame = gr * gc;
        let all = tile_sums(&values, r, c, tile);
        for range in [
            0..n,
            0..1,
            3..4,
            100..700,
            511..513,
            590..610,
            1099..1100,
            7..7,
        ] {
            let got = file.spatial_sums(tile, range.clone()).unwrap();
            let want = &all[range.start * per_frame..range.end * per_frame];
            assert_eq!(got, want, "{tile:?} tile sums of frames {range:?}");
        }
    }
}
