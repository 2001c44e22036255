//! The directory a `.semq` file appears as. The file is verified whole
//! when it is opened (digests included), before any of it is shown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::npy::{self, DType};
use crate::python_json::Separators;
use crate::semq::report::{escape_human, push_config, push_json_string, show_json};
use crate::semq::{to_hex, Encoding, IdRef};

use super::content::{copy_range, Bytes, Content, Passthrough, Windowed};
use super::{Directory, Entry, StaticDir, TreeError};
use crate::semq::rows;

/// The line of the id at sorted index `i`, as `semq show` prints it
/// (control characters escaped).
fn id_line(e: &Encoding, i: usize, out: &mut Vec<u8>) {
    match e.id(i) {
        Some(IdRef::U64(v)) => {
            let _ = writeln!(out, "{v}");
        }
        Some(IdRef::Utf8(s)) => {
            out.extend_from_slice(escape_human(s).as_bytes());
            out.push(b'\n');
        }
        // (Cannot happen: the file was verified whole.)
        None => out.push(b'\n'),
    }
}

/// Ids per mark of `ids.txt`'s offset index.
const IDS_PER_MARK: usize = 1024;

/// `ids.txt`, one id per line, made per read from the mapped ids: its size
/// and the offset of every [`IDS_PER_MARK`]th line are found when the file
/// is opened, so a read starts at the nearest mark (8 bytes per 1024 ids
/// held, never the text).
fn ids_file(e: &Encoding) -> Arc<dyn Content> {
    let mut marks = Vec::with_capacity(e.len() / IDS_PER_MARK + 1);
    let mut size = 0u64;
    let mut line = Vec::new();
    for i in 0..e.len() {
        if i % IDS_PER_MARK == 0 {
            marks.push(size);
        }
        line.clear();
        id_line(e, i, &mut line);
        size += line.len() as u64;
    }
    let e = e.clone();
    Arc::new(Windowed::new(size, move |offset, buf: &mut [u8]| {
        let mut line = Vec::new();
        let mark = marks.partition_point(|&m| m <= offset).saturating_sub(1);
        let (mut i, mut at) = (mark * IDS_PER_MARK, marks.get(mark).copied().unwrap_or(0));
        let mut done = 0;
        while done < buf.len() && i < e.len() {
            line.clear();
            id_line(&e, i, &mut line);
            let end = at + line.len() as u64;
            if end > offset {
                let from = offset.saturating_sub(at) as usize;
                done += copy_range(&line, from as u64, &mut buf[done..]);
            }
            at = end;
            i += 1;
        }
        unchanged(&e)
    }))
}

fn manifest_json(e: &Encoding) -> Vec<u8> {
    let mut out = String::from("{");
    for (i, (k, v)) in e.manifest().pairs().iter().enumerate() {
        out.push_str(if i == 0 { "\n  " } else { ",\n  " });
        push_json_string(&mut out, k);
        out.push_str(": ");
        push_json_string(&mut out, v);
    }
    out.push_str(if e.manifest().is_empty() {
        "}\n"
    } else {
        "\n}\n"
    });
    out.into_bytes()
}

fn config_json(e: &Encoding) -> Vec<u8> {
    let c = e.config();
    let mut out = String::new();
    push_config(&mut out, &c, Separators::SPACED);
    // Derived sizes help consumers of symbols.npy and rows.bin.
    out.pop();
    let _ = writeln!(
        out,
        ", \"units_per_row\": {}, \"alphabet\": {}, \"bytes_per_vector\": {}, \"id_kind\": \"{}\"}}",
        c.units_per_row(),
        c.alphabet(),
        c.bytes_per_vector(),
        e.id_kind().name()
    );
    out.into_bytes()
}

/// Builds the directory of an opened (fully verified) `.semq` file.
pub fn directory(source: &Path, e: Encoding) -> Result<Arc<dyn Directory>, TreeError> {
    let opened = e.clone();
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let file = |c: Arc<dyn Content>| Entry::File(c);
    // The file as stored, for a local source only (see qem_view).
    if crate::remote::Address::of_path(source).is_none() {
        entries.insert(
            "raw.semq".into(),
            file(Arc::new(Passthrough::new(source, e.image().len() as u64))),
        );
    }
    entries.insert(
        "info.json".into(),
        file(Arc::new(Bytes::new(show_json(&e)))),
    );
    entries.insert(
        "config.json".into(),
        file(Arc::new(Bytes::new(config_json(&e)))),
    );
    entries.insert(
        "manifest.json".into(),
        file(Arc::new(Bytes::new(manifest_json(&e)))),
    );
    entries.insert(
        "content_digest".into(),
        file(Arc::new(Bytes::new(format!(
            "{}\n",
            to_hex(e.content_digest())
        )))),
    );
    entries.insert(
        "state_id".into(),
        file(Arc::new(Bytes::new(format!("{}\n", to_hex(e.state_id()))))),
    );
    entries.insert("ids.txt".into(), file(ids_file(&e)));
    let rows = e.clone();
    entries.insert(
        "rows.bin".into(),
        file(Arc::new(Windowed::new(
            e.rows_section().len() as u64,
            move |offset, buf: &mut [u8]| {
                copy_range(rows.rows_section(), offset, buf);
                unchanged(&rows)
            },
        ))),
    );

    let xattrs = vec![
        (
            "user.semq.state_id".to_string(),
            to_hex(e.state_id()).into_bytes(),
        ),
        (
            "user.semq.content_digest".to_string(),
            to_hex(e.content_digest()).into_bytes(),
        ),
        (
            "user.semq.config".to_string(),
            format!(
                "{} dim={} {}={}",
                e.config().operator().name(),
                e.config().dim(),
                e.config().operator().param_name(),
                e.config().param()
            )
            .into_bytes(),
        ),
        (
            "user.semq.rows".to_string(),
            e.len().to_string().into_bytes(),
        ),
    ];
    let n = e.len();
    let config = e.config();
    let units = config.units_per_row();
    let dim = config.dim() as usize;
    let symbols_header = npy::encode_header(DType::U8, &[n, units]);
    let vectors_header = npy::encode_header(DType::F32, &[n, dim]);
    let enc = e.clone();
    entries.insert(
        "symbols.npy".into(),
        file(Arc::new(npy_rows(
            symbols_header,
            n,
            units,
            move |rows, out| {
                for (i, dst) in rows.zip(out.chunks_exact_mut(units)) {
                    if let Some(row) = enc.row(i) {
                        rows::unpack(&config, row, dst);
                    }
                }
            },
            e.clone(),
        ))),
    );
    let enc = e.clone();
    entries.insert(
        "vectors.npy".into(),
        file(Arc::new(npy_rows(
            vectors_header,
            n,
            dim * 4,
            move |rows, out| {
                let values = enc.decode_rows(rows);
                for (dst, v) in out.chunks_exact_mut(4).zip(values) {
                    dst.copy_from_slice(&v.to_le_bytes());
                }
            },
            e,
        ))),
    );
    // Opening verified the whole file and the id marks read every id: the
    // pages are in the page cache, not kept in the daemon.
    opened.release_mapped_pages();
    Ok(Arc::new(StaticDir::new(entries).with_xattrs(xattrs)))
}

/// Rows of this many bytes at most are made per piece of a read.
const WINDOW_BYTES: usize = 1 << 20;

/// An `.npy` of `n` rows of `row_bytes` each after `header`, made per
/// read: `fill(rows, out)` writes the bytes of sorted rows `rows` into
/// `out`, from the mapped `.semq` (a read of `vectors.npy` decodes only
/// the rows it covers; nothing is built whole or held).
fn npy_rows(
    header: Vec<u8>,
    n: usize,
    row_bytes: usize,
    fill: impl Fn(std::ops::Range<usize>, &mut [u8]) + Send + Sync + 'static,
    e: Encoding,
) -> impl Content {
    let h = header.len() as u64;
    let size = h + (n * row_bytes) as u64;
    Windowed::new(size, move |offset, buf: &mut [u8]| {
        let mut done = 0;
        if offset < h {
            done = copy_range(&header, offset, buf);
        }
        let rows_per_window = (WINDOW_BYTES / row_bytes.max(1)).max(1);
        let mut window = Vec::new();
        while done < buf.len() && row_bytes > 0 {
            let at = offset + done as u64 - h;
            let first = (at / row_bytes as u64) as usize;
            let want = buf.len() - done;
            let last = ((at + want as u64).div_ceil(row_bytes as u64) as usize)
                .min(n)
                .min(first + rows_per_window);
            if last <= first {
                break;
            }
            window.resize((last - first) * row_bytes, 0);
            fill(first..last, &mut window);
            let skip = at - (first * row_bytes) as u64;
            done += copy_range(&window, skip, &mut buf[done..]);
        }
        // As a `.qem` window's decode does (`QemView::load_window`): a
        // whole `vectors.npy` read would keep the whole file resident.
        e.release_mapped_pages();
        unchanged(&e)
    })
}

/// Fails when `encoding`'s file changed under its mapping (a fault, or a
/// file now shorter, whose bytes past the new end read as zeros with no
/// fault): the rows read may be zeros.
fn unchanged(encoding: &Encoding) -> Result<(), TreeError> {
    if !encoding.changed() {
        Ok(())
    } else {
        Err(TreeError::SourceChanged)
    }
}
