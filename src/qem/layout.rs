//! The chunk table (§6.2, §8.2, §9.2): frame coverage, array spans and the
//! decoded blocks they define, checked against the body size before any
//! array is read.

use std::ops::Range;

use serde_json::{Map, Value};

use super::error::QemError;
use super::header::{json_uint, Codec, Header, INTERVAL};

/// The byte ranges of the spatial index arrays 3–5 of an integer chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpatialArrays {
    /// Array 3: packed sums, u32 words.
    pub words: Range<usize>,
    /// Array 4: `B*F + 1` u64 word offsets.
    pub word_offsets: Range<usize>,
    /// Array 5: `B*F` bit widths.
    pub widths: Range<usize>,
}

/// One chunk; all ranges are body-relative byte ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub first: usize,
    pub scans: usize,
    /// Calibration region (scaled codec).
    pub region: Option<usize>,
    /// Stream payload (array 0, or the float payload).
    pub payload: Range<usize>,
    /// u32 stream offsets into the payload.
    pub offsets: Range<usize>,
    /// One model selector per stream.
    pub selectors: Range<usize>,
    pub spatial: Option<SpatialArrays>,
    /// Global index of this chunk's first decoded block.
    pub first_block: usize,
    /// Decoded blocks in this chunk (`ceil(scans/512)`, or 1 for float).
    pub blocks: usize,
}

impl Chunk {
    /// Body range from the first to the last byte of the chunk's arrays.
    pub fn body_range(&self) -> Range<usize> {
        let end = self
            .spatial
            .as_ref()
            .map_or(self.selectors.end.max(self.offsets.end), |s| s.widths.end);
        self.payload.start..end
    }
}

/// One decoded block: the unit of decoding and caching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockInfo {
    /// Global block index (chunk-major), stable for a file.
    pub index: usize,
    pub chunk: usize,
    /// Block number inside its chunk (always 0 for float).
    pub block_in_chunk: usize,
    /// First global frame.
    pub first_frame: usize,
    /// Frames in the block (`m`).
    pub frames: usize,
    /// Size of the block's decoded dense bytes.
    pub decoded_bytes: usize,
}

impl BlockInfo {
    pub fn frame_range(&self) -> Range<usize> {
        self.first_frame..self.first_frame + self.frames
    }

    /// The error for a disagreement of this block's index with its counts
    /// at block frame `frame`.
    pub(crate) fn index_disagreement(
        &self,
        (frame, field, stored, computed): super::spatial::Disagreement,
    ) -> QemError {
        QemError::SpatialIndex {
            chunk: self.chunk,
            block: self.block_in_chunk,
            field,
            frame: self.first_frame + frame,
            stored,
            computed,
        }
    }

    /// Where global frame `frame` lies in this block's decoded bytes, for
    /// frames of `frame_bytes` bytes; `None` if the block does not hold it.
    pub fn frame_bytes_in_block(&self, frame: usize, frame_bytes: usize) -> Option<Range<usize>> {
        let k = frame
            .checked_sub(self.first_frame)
            .filter(|&k| k < self.frames)?;
        Some(k * frame_bytes..(k + 1) * frame_bytes)
    }
}

/// The whole chunk table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub chunks: Vec<Chunk>,
    pub blocks: Vec<BlockInfo>,
    /// Spatial fields per frame (integer codec; 0 otherwise).
    pub fields: usize,
}

/// `F` of §6.3 for an `r × c` detector.
pub fn spatial_fields(r: usize, c: usize) -> usize {
    r.div_ceil(8) * c.div_ceil(8) + r.div_ceil(32) * c.div_ceil(32)
}

const FLOAT_FRAME_BUDGET: usize = 32 * 1024 * 1024;

fn member(o: &Map<String, Value>, key: &str, chunk: usize) -> Result<usize, QemError> {
    json_uint(o.get(key))
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            QemError::layout(
                Some(chunk),
                format!("member {key} missing or not an integer"),
            )
        })
}

/// Running body cursor with overflow-checked spans.
struct Cursor {
    at: usize,
    body: usize,
    /// How a misplaced array is described for this codec.
    fault: &'static str,
}

impl Cursor {
    fn take(
        &mut self,
        chunk: usize,
        name: &str,
        offset: usize,
        bytes: Option<usize>,
        align: bool,
    ) -> Result<Range<usize>, QemError> {
        let expected = if align {
            self.at.next_multiple_of(8)
        } else {
            self.at
        };
        if offset != expected {
            return Err(QemError::layout(
                Some(chunk),
                format!(
                    "{}: {name} at offset {offset}, expected {expected}",
                    self.fault
                ),
            ));
        }
        let end = bytes
            .and_then(|b| offset.checked_add(b))
            .filter(|&e| e <= self.body)
            .ok_or_else(|| {
                QemError::layout(
                    Some(chunk),
                    format!("{}: {name} extends past the body", self.fault),
                )
            })?;
        self.at = end;
        Ok(offset..end)
    }
}

/// The chunk table as it is read: the running body cursor and frame count.
struct Builder<'h> {
    header: &'h Header,
    body: usize,
    frames: usize,
    pixels: usize,
    fields: usize,
    elem: usize,
    cursor: Cursor,
    next_frame: usize,
    chunks: Vec<Chunk>,
    blocks: Vec<BlockInfo>,
}

impl<'h> Builder<'h> {
    fn new(header: &'h Header) -> Result<Self, QemError> {
        let body = usize::try_from(header.bytes)
            .map_err(|_| QemError::layout(None, "body too large for this machine"))?;
        let pixels = header.pixels();
        let fields = if header.codec == Codec::Integer {
            spatial_fields(header.shape[2] as usize, header.shape[3] as usize)
        } else {
            0
        };
        if header.codec == Codec::Float && pixels > FLOAT_FRAME_BUDGET / 4 {
            return Err(QemError::layout(
                None,
                "float frame exceeds the 32 MiB decode budget",
            ));
        }
        Ok(Builder {
            header,
            body,
            frames: header.frames(),
            pixels,
            fields,
            elem: header.decoded_dtype().size(),
            cursor: Cursor {
                at: 0,
                body,
                fault: if header.codec == Codec::Float {
                    "invalid float array bounds"
                } else {
                    "invalid array span"
                },
            },
            next_frame: 0,
            chunks: Vec::new(),
            blocks: Vec::new(),
        })
    }

    /// Checks chunk entry `c` against the ones before it.
    fn chunk(&mut self, c: usize, v: &Value) -> Result<(), QemError> {
        let (header, frames, pixels, fields, elem) = (
            self.header,
            self.frames,
            self.pixels,
            self.fields,
            self.elem,
        );
        let next_frame = self.next_frame;
        let cursor = &mut self.cursor;
        let blocks = &mut self.blocks;
        let o = v
            .as_object()
            .ok_or_else(|| QemError::layout(Some(c), "chunk entry is not an object"))?;
        let first = member(o, "first", c)?;
        let scans = member(o, "scans", c)?;
        if first != next_frame || scans == 0 || scans > frames - next_frame {
            return Err(QemError::layout(
                Some(c),
                format!("invalid chunk scan coverage: first {first}, scans {scans}, expected first {next_frame} within {frames} frames"),
            ));
        }
        self.next_frame += scans;
        let first_block = blocks.len();
        let chunk = match header.codec {
            Codec::Float => {
                let max_scans = INTERVAL.min(8_388_608 / pixels);
                if scans > max_scans {
                    return Err(QemError::layout(
                        Some(c),
                        format!("{scans} scans exceed the float chunk bound {max_scans}"),
                    ));
                }
                let span = |name: &str| -> Result<(usize, usize), QemError> {
                    let off = member(o, &format!("{name}_offset"), c)?;
                    let len = member(o, &format!("{name}_bytes"), c)?;
                    if len == 0 {
                        return Err(QemError::layout(
                            Some(c),
                            format!("invalid float array bounds: {name}_bytes is 0"),
                        ));
                    }
                    Ok((off, len))
                };
                let (po, pl) = span("payload")?;
                let (oo, ol) = span("offset")?;
                let (mo, ml) = span("model")?;
                let lanes = 2 * pixels;
                if ol != 4 * (lanes + 1) || ml != lanes {
                    return Err(QemError::layout(
                        Some(c),
                        format!("invalid float array bounds: offset_bytes {ol} / model_bytes {ml}, expected {} / {lanes}", 4 * (lanes + 1)),
                    ));
                }
                let payload = cursor.take(c, "payload", po, Some(pl), false)?;
                let offsets = cursor.take(c, "offsets", oo, Some(ol), false)?;
                let selectors = cursor.take(c, "models", mo, Some(ml), false)?;
                Chunk {
                    first,
                    scans,
                    region: None,
                    payload,
                    offsets,
                    selectors,
                    spatial: None,
                    first_block,
                    blocks: 1,
                }
            }
            Codec::Integer | Codec::Scaled => {
                let b = scans.div_ceil(INTERVAL);
                let streams = b as u128 * pixels as u128;
                if streams * (2 * scans.min(INTERVAL) as u128 + 4) >= 1u128 << 32 {
                    return Err(QemError::layout(
                        Some(c),
                        "chunk offsets exceed the codec's uint32 range",
                    ));
                }
                let streams = streams as usize;
                let n_arrays = if header.codec == Codec::Integer { 6 } else { 3 };
                let arrays = o
                    .get("arrays")
                    .and_then(Value::as_array)
                    .filter(|a| a.len() == n_arrays)
                    .ok_or_else(|| {
                        QemError::layout(
                            Some(c),
                            format!("incomplete chunk arrays: exactly {n_arrays} required"),
                        )
                    })?;
                let mut spans = Vec::with_capacity(n_arrays);
                for (k, a) in arrays.iter().enumerate() {
                    let ao = a.as_object().ok_or_else(|| {
                        QemError::layout(Some(c), format!("array {k} is not an object"))
                    })?;
                    spans.push((member(ao, "offset", c)?, member(ao, "count", c)?));
                }
                let bf = b * fields;
                let expected_counts: [Option<usize>; 6] = [
                    None,
                    Some(streams + 1),
                    Some(streams),
                    None,
                    Some(bf + 1),
                    Some(bf),
                ];
                let elem_size = [1usize, 4, 1, 4, 8, 1];
                let mut ranges = Vec::with_capacity(n_arrays);
                for (k, &(off, count)) in spans.iter().enumerate() {
                    if let Some(want) = expected_counts[k] {
                        if count != want {
                            return Err(QemError::layout(
                                Some(c),
                                format!("invalid array span: array {k} has {count} elements, {want} expected"),
                            ));
                        }
                    }
                    ranges.push(cursor.take(
                        c,
                        &format!("array {k}"),
                        off,
                        count.checked_mul(elem_size[k]),
                        true,
                    )?);
                }
                let region = if header.codec == Codec::Scaled {
                    let r = member(o, "region", c)?;
                    let cal = header
                        .intensity_calibration
                        .as_ref()
                        .ok_or_else(|| QemError::layout(Some(c), "no calibration regions"))?;
                    let ok = cal.regions.get(r).is_some_and(|reg| {
                        reg.first_frame <= first && first + scans <= reg.stop_frame
                    });
                    if !ok {
                        return Err(QemError::layout(
                            Some(c),
                            format!("invalid scaled chunk coverage: region {r} does not contain frames {first}..{}", first + scans),
                        ));
                    }
                    Some(r)
                } else {
                    None
                };
                let spatial = (header.codec == Codec::Integer).then(|| SpatialArrays {
                    words: ranges[3].clone(),
                    word_offsets: ranges[4].clone(),
                    widths: ranges[5].clone(),
                });
                Chunk {
                    first,
                    scans,
                    region,
                    payload: ranges[0].clone(),
                    offsets: ranges[1].clone(),
                    selectors: ranges[2].clone(),
                    spatial,
                    first_block,
                    blocks: b,
                }
            }
        };
        let per_block = if header.codec == Codec::Float {
            scans
        } else {
            INTERVAL
        };
        for k in 0..chunk.blocks {
            let start = k * per_block;
            let m = per_block.min(scans - start);
            blocks.push(BlockInfo {
                index: blocks.len(),
                chunk: c,
                block_in_chunk: k,
                first_frame: first + start,
                frames: m,
                decoded_bytes: m * pixels * elem,
            });
        }
        self.chunks.push(chunk);
        Ok(())
    }

    /// Checks that the chunks cover every frame and the whole body.
    fn finish(self) -> Result<Layout, QemError> {
        let Builder {
            frames,
            body,
            fields,
            cursor,
            next_frame,
            chunks,
            blocks,
            ..
        } = self;
        if next_frame != frames {
            return Err(QemError::layout(
                None,
                format!(
                    "invalid chunk scan coverage: chunks cover {next_frame} of {frames} frames"
                ),
            ));
        }
        if cursor.at != body {
            return Err(QemError::layout(
                None,
                format!(
                    "incomplete coverage: arrays end at {}, body has {body} bytes",
                    cursor.at
                ),
            ));
        }
        Ok(Layout {
            chunks,
            blocks,
            fields,
        })
    }
}

impl Layout {
    /// Reads the chunk table. `walk` hands each entry to its argument, in
    /// order, and returns how many there were (`None`: absent or not a
    /// list), so the table is checked entry by entry as it is read and its
    /// parsed text is never held whole.
    pub fn read(
        header: &Header,
        walk: impl FnOnce(
            &mut dyn FnMut(usize, Value) -> Result<(), QemError>,
        ) -> Result<Option<usize>, QemError>,
    ) -> Result<Self, QemError> {
        let mut building: Option<Builder<'_>> = None;
        let listed = walk(&mut |c, v| {
            let builder = match &mut building {
                Some(b) => b,
                empty => empty.insert(Builder::new(header)?),
            };
            builder.chunk(c, &v)
        })?;
        match (listed, building) {
            (Some(n), Some(builder)) if n > 0 => builder.finish(),
            _ => Err(QemError::layout(None, "chunks must be a non-empty list")),
        }
    }

    /// The block holding global frame `f` (`f` < frames).
    pub fn block_of_frame(&self, f: usize) -> Option<&BlockInfo> {
        let k = self
            .blocks
            .partition_point(|b| b.first_frame + b.frames <= f);
        self.blocks.get(k)
    }
}

#[cfg(test)]
mod tests {
    use super::spatial_fields;

    #[test]
    fn fields_from_the_spec() {
        assert_eq!(spatial_fields(13, 7), 3);
        assert_eq!(spatial_fields(33, 40), 29);
        assert_eq!(spatial_fields(2, 3), 2);
    }
}
