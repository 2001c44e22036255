//! The room left for the header before the body, so that a large body is
//! written once, in place, instead of being moved behind the header at the
//! end (`spool`). On a float import the move read and wrote the whole body
//! a second time after the last chunk: 0.3 s of a 0.74 s, 268 MB EMPAD
//! conversion, with both cores idle.
//!
//! The header's length is known only once the body is (its chunk list and
//! checksums), so the room is an upper bound computed from the shape, and
//! the canonical header text is followed by spaces up to it: JSON
//! whitespace, which readers must accept (spec §4.1). The reference
//! writer's bytes are reproduced only without padding, so the room is
//! taken only where byte-identical output is not asked for (a model other
//! than [`ModelChoice::Reference`]) and the array is large enough for the
//! move to matter: there the padding (at most a few KiB, against tens of
//! megabytes of body) is the one way a file of the default policy can be
//! larger than the reference policy's, whose streams are never shorter. A
//! header that outgrows its room (a bound exceeded) is written exactly,
//! and the body is moved as before.

use super::spool::align_up;
use super::{ModelChoice, MAX_HEADER_BYTES};
use crate::qem::checksum::CHECKSUM_BLOCK;
use crate::qem::envelope::ENVELOPE_BYTES;

/// Arrays holding fewer dense bytes than this keep the exact header: their
/// body moves cheaply, and a small file would grow by most of a page.
pub(super) const ROOM_MIN_DENSE: u64 = 64 << 20;
/// Longest chunk entry of any codec with every number at 20 digits (an
/// integer chunk's six arrays, the longest, take 436 bytes).
const ENTRY_BOUND: u64 = 448;
/// Shortest chunk entry of any codec, every number one digit (a scaled
/// chunk's three arrays, the shortest).
const ENTRY_LEAST: u64 = 112;

/// The least a header can take with `known_bytes` of members known at the
/// start and `chunks` chunk entries, whatever the body: more than the
/// format allows, and the file cannot be written at all.
pub(super) fn least_header(known_bytes: u64, chunks: u64) -> u64 {
    // Entries are separated by commas.
    let list = chunks.saturating_mul(ENTRY_LEAST + 1).saturating_sub(1);
    (known_bytes + ",\"chunks\":[]".len() as u64).saturating_add(list)
}

/// What the header's length depends on beyond its members known at the
/// start.
pub(super) struct Shape {
    /// The canonical text of the header's members known at the start.
    pub known_bytes: u64,
    /// Dense bytes of the whole array.
    pub dense_bytes: u64,
    /// At most this many chunk entries.
    pub chunks: u64,
}

/// Bytes before the body (envelope and header) when the body is to be
/// placed behind reserved room; `None` for the exact header.
pub(super) fn reserve(model: ModelChoice, shape: &Shape) -> Option<u64> {
    if model == ModelChoice::Reference || shape.dense_bytes < ROOM_MIN_DENSE {
        return None;
    }
    // A body larger than this bound only costs the move (its checksum
    // list outgrows the room).
    let body = shape.dense_bytes + shape.dense_bytes / 8 + (1 << 20);
    let checksums = body.div_ceil(CHECKSUM_BLOCK as u64);
    let added = ",\"bytes\":".len() as u64
        + 20
        + ",\"sha256\":[]".len() as u64
        + checksums * (64 + 3)
        + ",\"chunks\":[]".len() as u64
        + shape.chunks * (ENTRY_BOUND + 1)
        + ",\"logical_sha256\":\"\"".len() as u64
        + 64;
    // Aligned as the spool places the body, so that a header filling the
    // room ends exactly where the body starts.
    let room = align_up(ENVELOPE_BYTES as u64 + shape.known_bytes + added);
    (room - ENVELOPE_BYTES as u64 <= MAX_HEADER_BYTES as u64).then_some(room)
}

/// Pads the canonical header `text` with spaces so that it fills `room`
/// (envelope included), when it fits; otherwise leaves it exact.
pub(super) fn fill(text: &mut String, room: Option<u64>) {
    if let Some(room) = room {
        let want = room as usize - ENVELOPE_BYTES;
        if text.len() <= want {
            text.extend(std::iter::repeat_n(' ', want - text.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_entry_bound_holds_every_codecs_longest_entry() {
        let n = u64::MAX;
        let array = json!({"count": n, "offset": n});
        let entries = [
            json!({"arrays": vec![array.clone(); 6], "first": n, "scans": n}),
            json!({"arrays": vec![array; 3], "first": n, "region": n, "scans": n}),
            json!({"first": n, "scans": n, "payload_offset": n, "payload_bytes": n,
                   "offset_offset": n, "offset_bytes": n, "model_offset": n, "model_bytes": n}),
        ];
        for entry in entries {
            let text = super::super::to_canonical_json(&entry).unwrap();
            assert!(
                text.len() as u64 <= ENTRY_BOUND,
                "{} > {ENTRY_BOUND}: {text}",
                text.len()
            );
        }
    }

    #[test]
    fn the_least_entry_is_no_longer_than_any_codecs_shortest() {
        let array = json!({"count": 0, "offset": 0});
        let shortest = [
            json!({"arrays": vec![array.clone(); 6], "first": 0, "scans": 0}),
            json!({"arrays": vec![array; 3], "first": 0, "region": 0, "scans": 0}),
            json!({"first": 0, "scans": 0, "payload_offset": 0, "payload_bytes": 0,
                   "offset_offset": 0, "offset_bytes": 0, "model_offset": 0, "model_bytes": 0}),
        ]
        .map(|entry| super::super::to_canonical_json(&entry).unwrap().len() as u64);
        assert_eq!(shortest.iter().min(), Some(&ENTRY_LEAST), "{shortest:?}");
        // Entries and the commas between them.
        let member = ",\"chunks\":[]".len() as u64;
        assert_eq!(least_header(10, 1), 10 + member + ENTRY_LEAST);
        assert_eq!(least_header(10, 3), 10 + member + 3 * ENTRY_LEAST + 2);
        assert!(least_header(0, u64::MAX) > MAX_HEADER_BYTES as u64);
    }

    #[test]
    fn room_is_aligned_and_taken_only_for_large_non_reference_arrays() {
        let shape = |dense_bytes| Shape {
            known_bytes: 5000,
            dense_bytes,
            chunks: 40,
        };
        let room = reserve(ModelChoice::Smallest, &shape(ROOM_MIN_DENSE)).unwrap();
        assert_eq!(room, align_up(room));
        assert!(room >= ENVELOPE_BYTES as u64 + 5000 + 40 * ENTRY_BOUND);
        assert_eq!(
            reserve(ModelChoice::Reference, &shape(ROOM_MIN_DENSE)),
            None
        );
        assert_eq!(
            reserve(ModelChoice::Smallest, &shape(ROOM_MIN_DENSE - 1)),
            None
        );
        // A room the format's 16 MiB header limit cannot hold is not taken.
        let huge = Shape {
            known_bytes: MAX_HEADER_BYTES as u64 - 100,
            ..shape(ROOM_MIN_DENSE)
        };
        assert_eq!(reserve(ModelChoice::Smallest, &huge), None);
    }

    #[test]
    fn fill_pads_to_the_room_or_leaves_the_text_exact() {
        let mut text = String::from("{\"a\":1}");
        fill(&mut text, Some(4096));
        assert_eq!(text.len() + ENVELOPE_BYTES, 4096);
        assert!(text.starts_with("{\"a\":1}") && text[7..].bytes().all(|b| b == b' '));
        let mut long = "x".repeat(5000);
        fill(&mut long, Some(4096));
        assert_eq!(long.len(), 5000);
        let mut exact = String::from("{}");
        fill(&mut exact, None);
        assert_eq!(exact, "{}");
    }
}
