//! The directory a `.semq` file appears as. The file is verified whole
//! when it is opened (digests included), before any of it is shown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::npy::{self, DType};
use crate::python_json::Separators;
use crate::semq::report::{escape_human, push_config, push_json_string, show_json};
use crate::semq::{to_hex, Encoding, IdRef};

use super::content::{Bytes, Content, Lazy, Passthrough};
use super::{Directory, Entry, StaticDir, TreeError};

/// One id per line, control characters escaped as `semq show` prints them.
fn ids_text(e: &Encoding) -> Vec<u8> {
    let mut out = String::with_capacity(e.len() * 12);
    for id in e.ids() {
        match id {
            IdRef::U64(v) => {
                let _ = writeln!(out, "{v}");
            }
            IdRef::Utf8(s) => {
                out.push_str(&escape_human(s));
                out.push('\n');
            }
        }
    }
    out.into_bytes()
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
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let file = |c: Arc<dyn Content>| Entry::File(c);
    entries.insert(
        "raw.semq".into(),
        file(Arc::new(Passthrough::new(source, e.image().len() as u64))),
    );
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
    entries.insert("ids.txt".into(), file(Arc::new(Bytes::new(ids_text(&e)))));
    entries.insert(
        "rows.bin".into(),
        file(Arc::new(Bytes::new(e.rows_section().to_vec()))),
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
        file(Arc::new(Lazy::new(
            (symbols_header.len() + n * units) as u64,
            move || {
                let mut out = symbols_header.clone();
                out.extend_from_slice(&enc.unpack());
                unchanged(&enc)?;
                Ok(out)
            },
        ))),
    );
    entries.insert(
        "vectors.npy".into(),
        file(Arc::new(Lazy::new(
            (vectors_header.len() + n * dim * 4) as u64,
            move || {
                let mut out = vectors_header.clone();
                out.extend(e.decode().iter().flat_map(|v| v.to_le_bytes()));
                unchanged(&e)?;
                Ok(out)
            },
        ))),
    );
    Ok(Arc::new(StaticDir::new(entries).with_xattrs(xattrs)))
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
