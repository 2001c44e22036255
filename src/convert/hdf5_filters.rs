//! Decoders for the HDF5 compression filters the field's writers use
//! beyond the library's own (gzip, shuffle), registered with the HDF5
//! library so that any dataset read through it is decoded in-process, with
//! no plugin to install: h5py's `compression="lzf"` (id 32000), and what
//! `hdf5plugin` writes from Python as `Bitshuffle()` (its blocks stored as
//! they are, with LZ4 or with zstd; id 32008), `LZ4()` (32004), `Zstd()`
//! (32015) and `Blosc(...)` (32001, any of its compressors).
//!
//! Only decoding is registered: a file is never written through them. A
//! chunk is decoded straight into the buffer the library gets back. A chunk
//! that does not decode fails the read that needs it, and the reason (kept
//! for this thread, see [`take_error`]) is added to the library's error,
//! which names the dataset and frames.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void, CStr};
use std::sync::Once;

use hdf5_metno_sys::h5::{H5allocate_memory, H5free_memory};
use hdf5_metno_sys::h5z::{H5Z_class2_t, H5Zregister, H5Z_CLASS_T_VERS, H5Z_FLAG_REVERSE};

use super::bitshuffle::{self, BlockCodec};
use crate::contained::contained;

/// Decoded chunks larger than this are refused: HDF5 chunks hold less
/// than 4 GiB.
const CHUNK_LIMIT: u64 = u32::MAX as u64;

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Why the last chunk decoded on this thread failed, once.
pub fn take_error() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow_mut().take())
}

/// A filter's two steps: the decoded size of a stored chunk (from its
/// header or the filter's parameters, bounded by what the stored bytes
/// can expand to), then the decode into exactly that many bytes.
struct Filter {
    id: i32,
    name: &'static CStr,
    size: fn(&[u8], &[c_uint]) -> Result<usize, String>,
    decode: DecodeInto,
}

/// Decodes a stored chunk, with the filter's parameters, into `out`.
type DecodeInto = fn(&[u8], &[c_uint], &mut [u8]) -> Result<(), String>;

const FILTERS: [Filter; 5] = [
    Filter {
        id: 32000,
        name: c"lzf (qemfs decoder)",
        size: lzf_size,
        decode: decode_lzf,
    },
    Filter {
        id: 32008,
        name: c"bitshuffle (qemfs decoder)",
        size: bitshuffle_size,
        decode: decode_bitshuffle,
    },
    Filter {
        id: 32004,
        name: c"lz4 (qemfs decoder)",
        size: |chunk, _| declared(chunk),
        decode: |chunk, _, out| bitshuffle::hdf5_lz4(chunk, out),
    },
    Filter {
        id: 32015,
        name: c"zstd (qemfs decoder)",
        size: |chunk, _| zstd_size(chunk),
        decode: decode_zstd,
    },
    Filter {
        id: 32001,
        name: c"blosc (qemfs decoder)",
        size: |chunk, _| blosc_size(chunk),
        decode: decode_blosc,
    },
];

/// Registers the decoders with the HDF5 library, once per process. Call
/// before a dataset is read.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (i, f) in FILTERS.iter().enumerate() {
            let class = H5Z_class2_t {
                version: H5Z_CLASS_T_VERS as i32,
                id: f.id,
                encoder_present: 0,
                decoder_present: 1,
                name: f.name.as_ptr(),
                can_apply: None,
                set_local: None,
                filter: Some(FILTER_FNS[i]),
            };
            // SAFETY: the class is copied by the library; its name is a
            // static string. A failure leaves the filter unknown, and its
            // datasets fail to read with the library's own message.
            hdf5_metno::sync::sync(|| unsafe {
                H5Zregister((&class as *const H5Z_class2_t).cast::<c_void>())
            });
        }
    });
}

/// One C entry point per filter (the library passes no user data).
const FILTER_FNS: [FilterFn; 5] = [call::<0>, call::<1>, call::<2>, call::<3>, call::<4>];

type FilterFn = unsafe extern "C" fn(
    c_uint,
    usize,
    *const c_uint,
    usize,
    *mut usize,
    *mut *mut c_void,
) -> usize;

/// The library's filter call for `FILTERS[I]`: decodes `*buf` (`nbytes`
/// stored bytes) into a new buffer of the library's allocator, frees the
/// old one and returns the new length; 0 on failure (and for encoding,
/// which these filters do not do).
unsafe extern "C" fn call<const I: usize>(
    flags: c_uint,
    cd_nelmts: usize,
    cd_values: *const c_uint,
    nbytes: usize,
    buf_size: *mut usize,
    buf: *mut *mut c_void,
) -> usize {
    if flags & H5Z_FLAG_REVERSE == 0 || buf.is_null() || buf_size.is_null() {
        return 0;
    }
    // SAFETY: the library passes its chunk buffer of at least `nbytes`
    // bytes and the filter's `cd_nelmts` parameters.
    let (input, params) = unsafe {
        (
            std::slice::from_raw_parts((*buf).cast::<u8>(), nbytes),
            if cd_values.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(cd_values, cd_nelmts)
            },
        )
    };
    let filter = &FILTERS[I];
    let fail = |e: String| {
        let name = filter.name.to_string_lossy();
        let name = name.split(' ').next().unwrap_or("filter").to_string();
        LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(format!("{name} chunk: {e}")));
        0
    };
    let size = match contained(|| (filter.size)(input, params)).and_then(|r| r) {
        Ok(size) if size > 0 && size as u64 <= CHUNK_LIMIT => size,
        Ok(size) => return fail(format!("a decoded chunk of {size} bytes")),
        Err(e) => return fail(e),
    };
    // SAFETY: the library frees the chunk buffer with its own allocator,
    // so the new one comes from it (zeroed: it is a slice before it is
    // written); the old one is ours to free once replaced.
    let out = unsafe { H5allocate_memory(size, 1) }.cast::<u8>();
    if out.is_null() {
        return fail(format!("out of memory for a decoded chunk of {size} bytes"));
    }
    // SAFETY: `out` is a fresh allocation of `size` bytes, this slice its
    // only reference.
    let slice = unsafe { std::slice::from_raw_parts_mut(out, size) };
    match contained(|| (filter.decode)(input, params, slice)).and_then(|r| r) {
        // SAFETY: as above; `*buf` is the library's chunk buffer.
        Ok(()) => unsafe {
            H5free_memory(*buf);
            *buf = out.cast();
            *buf_size = size;
            size
        },
        Err(e) => {
            // SAFETY: ours, never handed to the library.
            unsafe { H5free_memory(out.cast()) };
            fail(e)
        }
    }
}

/// The decoded size a chunk's big-endian header declares, bounded: LZ4
/// expands at most 255-fold, so a header claiming more than that of the
/// stored bytes is corrupt, and allocating it would let a few bytes of a
/// file ask for gigabytes.
fn declared(chunk: &[u8]) -> Result<usize, String> {
    declared_within(chunk, 255)
}

/// As [`declared`], for blocks that expand up to `ratio`-fold (zstd
/// frames of a run of zeros: some 32,000-fold).
fn declared_within(chunk: &[u8], ratio: u64) -> Result<usize, String> {
    let total = bitshuffle::be64(chunk, 0).ok_or("chunk shorter than its 12-byte header")?;
    let most = (chunk.len() as u64).saturating_mul(ratio).min(CHUNK_LIMIT);
    if total > most {
        return Err(format!(
            "chunk of {} bytes declares {total} bytes decoded",
            chunk.len()
        ));
    }
    Ok(total as usize)
}

/// Bitshuffle (id 32008): parameters `[major, minor, element bytes, block
/// elements, compression]`, compression 0 (none), 2 (LZ4, hdf5plugin's
/// default) or 3 (zstd).
fn bitshuffle_codec(params: &[c_uint]) -> Result<BlockCodec, String> {
    match params.get(4).copied().unwrap_or(0) {
        0 => Ok(BlockCodec::None),
        2 => Ok(BlockCodec::Lz4),
        3 => Ok(BlockCodec::Zstd),
        c => Err(format!("unknown bitshuffle compression {c}")),
    }
}

fn bitshuffle_size(chunk: &[u8], params: &[c_uint]) -> Result<usize, String> {
    match bitshuffle_codec(params)? {
        BlockCodec::None => Ok(chunk.len()),
        BlockCodec::Lz4 => declared(chunk),
        BlockCodec::Zstd => declared_within(chunk, 1 << 16),
    }
}

fn decode_bitshuffle(chunk: &[u8], params: &[c_uint], out: &mut [u8]) -> Result<(), String> {
    let elem = *params
        .get(2)
        .ok_or("no element size among its parameters")? as usize;
    let block = params.get(3).copied().unwrap_or(0) as usize;
    bitshuffle::bitshuffle(chunk, elem, block, bitshuffle_codec(params)?, out)
}

/// LZF (id 32000), h5py's filter: parameters `[version, revision, chunk
/// bytes]`, the chunk one liblzf stream. A back reference of 3 bytes copies
/// at most 264, so the chunk size is bounded by the stored bytes.
fn lzf_size(chunk: &[u8], params: &[c_uint]) -> Result<usize, String> {
    let size = u64::from(*params.get(2).ok_or("no chunk size among its parameters")?);
    if size > (chunk.len() as u64).saturating_mul(96) {
        return Err(format!(
            "chunk of {} bytes declared to hold {size} bytes decoded",
            chunk.len()
        ));
    }
    Ok(size as usize)
}

fn decode_lzf(chunk: &[u8], _: &[c_uint], out: &mut [u8]) -> Result<(), String> {
    let decoded =
        lzf::decompress(chunk, out.len()).map_err(|e| format!("corrupt LZF stream: {e:?}"))?;
    if decoded.len() != out.len() {
        return Err(format!(
            "LZF stream of {} bytes, not {}",
            decoded.len(),
            out.len()
        ));
    }
    out.copy_from_slice(&decoded);
    Ok(())
}

/// Zstandard (id 32015): one zstd frame, which records its decoded size.
fn zstd_size(chunk: &[u8]) -> Result<usize, String> {
    let size = zstd::zstd_safe::get_frame_content_size(chunk)
        .map_err(|_| "not a zstd frame".to_string())?
        .ok_or("a zstd frame that does not record its decoded size")?;
    usize::try_from(size).map_err(|_| format!("a zstd frame declaring {size} bytes decoded"))
}

fn decode_zstd(chunk: &[u8], _: &[c_uint], out: &mut [u8]) -> Result<(), String> {
    let n = zstd::bulk::decompress_to_buffer(chunk, out)
        .map_err(|e| format!("corrupt zstd frame: {e}"))?;
    if n != out.len() {
        return Err(format!(
            "a zstd frame of {n} bytes, declaring {}",
            out.len()
        ));
    }
    Ok(())
}

/// Blosc (id 32001): a Blosc 1 buffer, whose header says its sizes and
/// compressor; checked by the library before it is decoded.
fn blosc_size(chunk: &[u8]) -> Result<usize, String> {
    let mut size = 0usize;
    // SAFETY: `chunk` is readable for its length; the call only reads it.
    let valid =
        unsafe { blosc_src::blosc_cbuffer_validate(chunk.as_ptr().cast(), chunk.len(), &mut size) };
    if valid < 0 {
        return Err("not a valid Blosc buffer".into());
    }
    Ok(size)
}

fn decode_blosc(chunk: &[u8], _: &[c_uint], out: &mut [u8]) -> Result<(), String> {
    // SAFETY: `out` is writable for its length, which Blosc never exceeds;
    // the context call keeps no state between calls.
    let n = unsafe {
        blosc_src::blosc_decompress_ctx(
            chunk.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            out.len(),
            1,
        )
    };
    if n < 0 || n as usize != out.len() {
        return Err("corrupt Blosc buffer".into());
    }
    Ok(())
}
