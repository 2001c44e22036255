//! The JSON and text reports of `semq show` and `semq diff` (spec 9.1 and
//! 13), produced here so that the CLI only prints them.
//!
//! JSON text follows Python's `json.dump(..., ensure_ascii=False)`: `", "`
//! and `": "` separators, non-ASCII written raw, control characters below
//! U+0020 escaped — the exact bytes the upstream CLI prints.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;

use super::config::Config;
use super::diff::Diff;
use super::encoding::Encoding;
use super::floor::{Floor, Verdict};
use super::identity::to_hex;
use super::ids::{Id, IdRef};
use crate::python_json::{push_string, Escape, Separators};

/// Appends `s` as a JSON string the way Python's encoder does with
/// `ensure_ascii=False`.
pub fn push_json_string(out: &mut String, s: &str) {
    push_string(out, s, Escape::Unicode);
}

fn push_id(out: &mut String, id: IdRef<'_>) {
    match id {
        // Ids are strings in both kinds (JavaScript cannot hold 2^64−1).
        IdRef::U64(v) => {
            let _ = write!(out, "\"{v}\"");
        }
        IdRef::Utf8(s) => push_json_string(out, s),
    }
}

fn push_list<T>(
    out: &mut String,
    items: impl IntoIterator<Item = T>,
    mut each: impl FnMut(&mut String, T),
) {
    out.push('[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        each(out, item);
    }
    out.push(']');
}

/// `{"operator": ..., "dim": ..., "<param>": ..., "rule_revision": ...}`
pub(crate) fn push_config(out: &mut String, c: &Config, sep: Separators) {
    let Separators { item: i, key: k } = sep;
    let _ = write!(
        out,
        "{{\"operator\"{k}\"{}\"{i}\"dim\"{k}{}{i}\"{}\"{k}{}{i}\"rule_revision\"{k}{}}}",
        c.operator().name(),
        c.dim(),
        c.operator().param_name(),
        c.param(),
        c.rule_revision()
    );
}

/// The stdout of `semq show --json FILE`, final newline included. All
/// ids are listed whatever the limit.
pub fn show_json(e: &Encoding) -> String {
    let mut out = String::with_capacity(256 + e.len() * 24);
    out.push_str("{\"config\": ");
    push_config(&mut out, &e.config(), Separators::SPACED);
    let _ = write!(
        out,
        ", \"id_kind\": \"{}\", \"n\": {}, \"content_digest\": \"{}\", \"state_id\": \"{}\", \"manifest\": {{",
        e.id_kind().name(),
        e.len(),
        to_hex(e.content_digest()),
        to_hex(e.state_id())
    );
    for (i, (k, v)) in e.manifest().pairs().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_json_string(&mut out, k);
        out.push_str(": ");
        push_json_string(&mut out, v);
    }
    out.push_str("}, \"ids\": ");
    push_list(&mut out, e.ids(), push_id);
    out.push_str("}\n");
    out
}

fn push_opt(out: &mut String, v: &Option<String>) {
    match v {
        Some(s) => push_json_string(out, s),
        None => out.push_str("null"),
    }
}

fn push_owned_id(out: &mut String, id: &Id) {
    push_id(out, id.as_ref());
}

/// The stdout of `semq diff --json REF NEW`, final newline included; with
/// a gate, `"within"` (base checks) and `"verdict"` follow.
pub fn diff_json(d: &Diff, gate: Option<(bool, &Verdict)>) -> String {
    let mut out =
        String::with_capacity(512 + (d.added.len() + d.removed.len() + d.changed.len()) * 24);
    let _ = write!(
        out,
        "{{\"reference_id\": \"{}\", \"candidate_id\": \"{}\", \"id_kind\": \"{}\", \"config\": ",
        to_hex(&d.reference_id),
        to_hex(&d.candidate_id),
        d.id_kind.name()
    );
    push_config(&mut out, &d.config, Separators::SPACED);
    out.push_str(", \"added\": ");
    push_list(&mut out, &d.added, push_owned_id);
    out.push_str(", \"removed\": ");
    push_list(&mut out, &d.removed, push_owned_id);
    out.push_str(", \"changed\": ");
    push_list(&mut out, &d.changed, |o, (id, h)| {
        o.push('[');
        push_owned_id(o, id);
        let _ = write!(o, ", {h}]");
    });
    let _ = write!(
        out,
        ", \"n_unchanged\": {}, \"manifest_changes\": {{",
        d.n_unchanged
    );
    for (i, c) in d.manifest_changes.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_json_string(&mut out, &c.key);
        out.push_str(": [");
        push_opt(&mut out, &c.before);
        out.push_str(", ");
        push_opt(&mut out, &c.after);
        out.push(']');
    }
    out.push('}');
    if let Some((within, v)) = gate {
        let _ = write!(
            out,
            ", \"within\": {}, \"verdict\": {{\"passed\": {}, \"reasons\": ",
            within, v.passed
        );
        push_list(&mut out, &v.reasons, |o, r| {
            let _ = write!(o, "\"{}\"", r.name());
        });
        out.push_str(", \"rows\": ");
        push_list(&mut out, &v.rows, push_owned_id);
        out.push('}');
    }
    out.push_str("}\n");
    out
}

/// Writes the stdout of `semq show FILE --limit N` (human form), streamed:
/// a limit may list millions of ids. A negative limit prints the raw
/// minimum and lists no ids, like upstream.
pub fn write_show_text(out: &mut impl io::Write, e: &Encoding, limit: i64) -> io::Result<()> {
    let c = e.config();
    writeln!(
        out,
        "config:         {} dim={} {}={}",
        c.operator().name(),
        c.dim(),
        c.operator().param_name(),
        c.param()
    )?;
    writeln!(out, "id_kind:        {}", e.id_kind().name())?;
    writeln!(out, "rows:           {}", e.len())?;
    writeln!(out, "content_digest: {}", to_hex(e.content_digest()))?;
    writeln!(out, "state_id:       {}", to_hex(e.state_id()))?;
    writeln!(out, "manifest:       {} pair(s)", e.manifest().len())?;
    for (k, v) in e.manifest().pairs() {
        writeln!(out, "  {} = {}", escape_human(k), escape_human(v))?;
    }
    let n = i64::try_from(e.len()).unwrap_or(i64::MAX);
    let shown = n.min(limit);
    writeln!(out, "ids:            first {shown} of {n}")?;
    for id in e.ids().take(usize::try_from(shown).unwrap_or(0)) {
        writeln!(out, "  {}", escape_id(id))?;
    }
    Ok(())
}

/// Writes the stdout of `semq diff REF NEW --limit N` (human form),
/// without the gate lines (see [`gate_text`]). A negative limit lists no
/// ids.
pub fn write_diff_text(out: &mut impl io::Write, d: &Diff, limit: i64) -> io::Result<()> {
    let take = usize::try_from(limit).unwrap_or(0);
    writeln!(out, "reference_id:  {}", to_hex(&d.reference_id))?;
    writeln!(out, "candidate_id:  {}", to_hex(&d.candidate_id))?;
    writeln!(out, "added:         {}", d.added.len())?;
    for id in d.added.iter().take(take) {
        writeln!(out, "  + {}", escape_id(id.as_ref()))?;
    }
    writeln!(out, "removed:       {}", d.removed.len())?;
    for id in d.removed.iter().take(take) {
        writeln!(out, "  - {}", escape_id(id.as_ref()))?;
    }
    writeln!(out, "changed:       {}", d.changed.len())?;
    for (id, h) in d.changed.iter().take(take) {
        writeln!(out, "  ~ {} hamming={h}", escape_id(id.as_ref()))?;
    }
    writeln!(out, "unchanged:     {}", d.n_unchanged)?;
    writeln!(out, "manifest:      {} change(s)", d.manifest_changes.len())?;
    let side = |v: &Option<String>| match v {
        Some(s) => escape_human(s).into_owned(),
        None => "<absent>".to_owned(),
    };
    for c in &d.manifest_changes {
        writeln!(
            out,
            "  {}: {} -> {}",
            escape_human(&c.key),
            side(&c.before),
            side(&c.after)
        )?;
    }
    Ok(())
}

/// An id as the human reports print it.
fn escape_id(id: IdRef<'_>) -> Cow<'_, str> {
    match id {
        IdRef::U64(v) => Cow::Owned(v.to_string()),
        IdRef::Utf8(s) => escape_human(s),
    }
}

/// The gate lines that follow [`write_diff_text`] with `--floor`: `within` (the
/// base verdict) and, with `--per-row`, `passed` (the full verdict).
pub fn gate_text(within: bool, passed: Option<bool>) -> String {
    let py = |b: bool| if b { "True" } else { "False" };
    let mut out = format!("within:        {}\n", py(within));
    if let Some(p) = passed {
        let _ = writeln!(out, "passed:        {}", py(p));
    }
    out
}

/// The warning `semq diff --floor F --per-row` writes to stderr (before
/// stdout) when the floor comes from fewer than 20 nulls that are not
/// known to be one state: each per-row check may then reject an unchanged
/// rebuild with probability up to 1/(nulls+1).
pub fn per_row_warning(floor: &Floor) -> Option<String> {
    if floor.nulls() >= 20 || floor.distinct_nulls() == Some(1) {
        return None;
    }
    let states = match floor.distinct_nulls() {
        Some(d) => format!(
            "{d} of the floor's {} nulls are different states",
            floor.nulls()
        ),
        None => "the floor does not record whether its nulls vary".to_owned(),
    };
    Some(format!(
        "warning: {states}, so each check can reject an unchanged rebuild with probability up to 1/{} ({}%); measure the floor from at least 20 nulls for --per-row\n",
        floor.nulls() + 1,
        percent(floor.nulls())
    ))
}

/// `100/(nulls+1)` with zero decimals: `{:.0}` rounds half to even on the
/// binary value, like Python's `.0f`.
fn percent(nulls: u64) -> String {
    format!("{:.0}", 100.0 / (nulls as f64 + 1.0))
}

/// The stderr lines of a gate written after stdout: every changed
/// manifest key, the failed verdict's reasons, and the rows above
/// max_hamming (at most `limit`, with the upstream slicing of a negative
/// limit).
pub fn gate_messages(d: &Diff, verdict: &Verdict, limit: i64) -> String {
    let mut out = String::new();
    for c in &d.manifest_changes {
        let _ = writeln!(out, "manifest key {} changed", escape_human(&c.key));
    }
    if !verdict.passed {
        let reasons: Vec<&str> = verdict.reasons.iter().map(|r| r.name()).collect();
        let _ = writeln!(
            out,
            "error: candidate is not within the floor ({})",
            reasons.join(", ")
        );
    }
    if !verdict.rows.is_empty() {
        let len = verdict.rows.len() as i64;
        // Python's rows[:limit]: a negative limit counts from the end.
        let end = if limit < 0 {
            (len + limit).max(0)
        } else {
            limit.min(len)
        };
        let shown: Vec<Cow<'_, str>> = verdict.rows[..end as usize]
            .iter()
            .map(|id| escape_id(id.as_ref()))
            .collect();
        let _ = write!(out, "rows above max_hamming: {}", shown.join(", "));
        if len > limit {
            let _ = write!(out, ", and {} more", len - limit);
        }
        out.push('\n');
    }
    out
}

/// Human output escaping: every Unicode Cc character (U+0000..U+001F,
/// U+007F..U+009F) becomes `\uXXXX` in lowercase hex; nothing else changes.
pub fn escape_human(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_string_escapes() {
        let mut s = String::new();
        push_json_string(&mut s, "a\"\\\n\u{1}\u{7f}é\u{2028}");
        assert_eq!(s, "\"a\\\"\\\\\\n\\u0001\u{7f}é\u{2028}\"");
    }

    #[test]
    fn percentages_round_like_python() {
        assert_eq!(percent(3), "25");
        assert_eq!(percent(4), "20");
        assert_eq!(percent(2), "33");
        assert_eq!(percent(7), "12"); // 12.5 rounds half to even
        assert_eq!(percent(0), "100");
    }

    #[test]
    fn human_escapes_cc_only() {
        assert_eq!(
            escape_human("a\tb\u{7f}\u{85}\u{2028}\\"),
            "a\\u0009b\\u007f\\u0085\u{2028}\\"
        );
    }
}
