//! The XML well-formedness check of attached source documents (§5.5: an
//! `application/xml` document "must parse").
//!
//! quick-xml tokenises the document in one pass, matches end tags to start
//! tags, and refuses duplicate or unquoted attributes, unclosed references
//! and `--` in comments. Its duplicate-attribute check hashes the names once
//! a tag has many, so a start tag with hundreds of thousands of attributes
//! costs linear time (the hand-written check it replaces, and roxmltree,
//! compare each attribute with all before it: 330k attributes took minutes).
//! What quick-xml leaves to its caller is checked here: one root element,
//! nothing but whitespace, comments and processing instructions outside it,
//! names, `<` in attribute values, and entity references (only the five
//! predefined entities and character references; a document has no DTD to
//! declare others, DOCTYPE and ENTITY being refused before this runs).

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

/// `Ok(())` when `doc` is a well-formed XML document, else why not.
pub(crate) fn check_well_formed(doc: &str) -> Result<(), String> {
    let mut reader = Reader::from_str(doc);
    let config = reader.config_mut();
    config.check_end_names = true;
    config.check_comments = true;
    config.allow_unmatched_ends = false;
    // Names of the open elements, for the message about one left unclosed.
    let mut open: Vec<String> = Vec::new();
    let mut roots = 0usize;
    let mut first = true;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("{e} (at byte {})", reader.error_position()))?;
        let at_start = std::mem::replace(&mut first, false);
        match event {
            Event::Start(ref tag) | Event::Empty(ref tag) => {
                if open.is_empty() {
                    roots += 1;
                    if roots > 1 {
                        return Err("more than one root element".into());
                    }
                }
                start_tag(tag)?;
                if let Event::Start(_) = event {
                    open.push(tag.name().0.to_string());
                }
            }
            Event::End(_) => {
                open.pop();
            }
            Event::Text(text) => {
                if open.is_empty() && !text.trim().is_empty() {
                    return Err("text outside the root element".into());
                }
                if text.contains("]]>") {
                    return Err("']]>' in text".into());
                }
            }
            Event::GeneralRef(r) => {
                if open.is_empty() {
                    return Err("text outside the root element".into());
                }
                reference(&r)?;
            }
            Event::CData(_) => {
                if open.is_empty() {
                    return Err("CDATA outside the root element".into());
                }
            }
            Event::Decl(_) => {
                if !at_start {
                    return Err("XML declaration not at the start of the document".into());
                }
            }
            Event::DocType(_) => return Err("declarations are not allowed".into()),
            Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
    }
    if let Some(name) = open.last() {
        return Err(format!("unclosed element <{name}>"));
    }
    if roots != 1 {
        return Err("no root element".into());
    }
    Ok(())
}

fn start_tag(tag: &BytesStart) -> Result<(), String> {
    let name = tag.name().0;
    if !is_name(name) {
        return Err(format!("bad tag name <{name}"));
    }
    separated(tag.attributes_raw()).map_err(|e| format!("<{name}>: {e}"))?;
    for attr in tag.attributes().with_checks(true) {
        let attr = attr.map_err(|e| format!("<{name}>: {e}"))?;
        let key = attr.key.0;
        if !is_name(key) {
            return Err(format!("<{name}>: bad attribute name {key:?}"));
        }
        if attr.value.contains('<') {
            return Err(format!("<{name}>: '<' in the value of attribute {key}"));
        }
        attr.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| format!("<{name}>: attribute {key}: {e}"))?;
    }
    Ok(())
}

/// Attributes must be separated by whitespace (`<a x='1'y='2'>` is not
/// XML); quick-xml's attribute iterator does not insist.
fn separated(raw: &str) -> Result<(), String> {
    let mut quote = None;
    let mut just_closed = false;
    for c in raw.chars() {
        if just_closed && !c.is_whitespace() && c != '/' {
            return Err("attributes must be separated by whitespace".into());
        }
        just_closed = false;
        match quote {
            Some(q) if c == q => {
                quote = None;
                just_closed = true;
            }
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None => {}
        }
    }
    Ok(())
}

fn reference(r: &str) -> Result<(), String> {
    let ok = match r {
        "amp" | "lt" | "gt" | "quot" | "apos" => true,
        _ => {
            if let Some(h) = r.strip_prefix("#x") {
                u32::from_str_radix(h, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .is_some()
            } else if let Some(d) = r.strip_prefix('#') {
                d.parse::<u32>().ok().and_then(char::from_u32).is_some()
            } else {
                false
            }
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("unknown entity &{r};"))
    }
}

/// An XML name: a letter, `_` or `:` first, then letters, digits, `_`, `:`,
/// `-` or `.` (XML 1.0 §2.3, with Unicode letters standing in for its ranges).
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::check_well_formed as ok;

    #[test]
    fn accepts_and_refuses() {
        assert!(ok("<?xml version=\"1.0\"?>\n<a x='1' y=\"&amp;\"><b/>t&#x41;<!-- c --><![CDATA[<>]]></a>\n").is_ok());
        assert!(ok("<a><b></a></b>").is_err());
        assert!(ok("<a>").is_err());
        assert!(ok("<a/><b/>").is_err());
        assert!(ok("<a x=1/>").is_err());
        assert!(ok("<a>&foo;</a>").is_err());
        assert!(ok("<a x='1' x='2'/>").is_err());
        assert!(ok("text").is_err());
    }

    #[test]
    fn refusals_name_the_fault() {
        for (doc, why) in [
            ("<a><b></a></b>", "expected `</b>`, but `</a>` was found"),
            ("<a><b>", "unclosed element <b>"),
            ("</a>", "does not match any open tag"),
            ("<a/><b/>", "more than one root element"),
            ("", "no root element"),
            ("<a/>tail", "text outside the root element"),
            ("<a/>&amp;", "text outside the root element"),
            ("<![CDATA[x]]><a/>", "CDATA outside the root element"),
            ("<a x='1' x='2'/>", "duplicated attribute"),
            ("<a x='1'y='2'/>", "separated by whitespace"),
            ("<a x='<'/>", "'<' in the value of attribute x"),
            ("<a x='&foo;'/>", "unrecognized entity `foo`"),
            ("<a>&foo;</a>", "unknown entity &foo;"),
            ("<a>a & b</a>", "not closed"),
            ("<1a/>", "bad tag name <1a"),
            ("<a><!-- x -- y --></a>", "`--`"),
            ("<a>]]></a>", "']]>' in text"),
            (
                "<a/><?xml version='1.0'?>",
                "XML declaration not at the start",
            ),
        ] {
            let e = ok(doc).expect_err(doc);
            assert!(e.contains(why), "{doc:?}: {e:?} lacks {why:?}");
        }
    }

    #[test]
    fn accepts_what_xml_allows() {
        for doc in [
            "<a/>",
            "  <a/>\n",
            "<?xml version='1.0' encoding='UTF-8'?><a/>",
            "<!-- before --><?pi data?><a/><!-- after -->",
            "<a:b xmlns:a='urn:x' a:c=\"1\"/>",
            "<a x=\"'\" y='\"' z='&lt;&#60;&#x3C;'/>",
            "<a>&lt;&gt;&amp;&quot;&apos;&#233;&#xE9;</a>",
            "<décor ü='1'><_x.y-z/></décor>",
            "<a x = '1'\n\ty='2' />",
        ] {
            assert_eq!(ok(doc), Ok(()), "{doc:?}");
        }
    }

    /// Issue 16: 330k attributes on one element took 430 s when every
    /// attribute was compared with all before it. Linear now: well under a
    /// second in release; the bound is loose so a slow machine passes, a
    /// quadratic check does not.
    #[test]
    fn many_attributes_in_linear_time() {
        let mut doc = String::from("<root");
        for i in 0..330_000 {
            doc.push_str(&format!(" a{i}=\"1\""));
        }
        let well_formed = format!("{doc}/>");
        let t = std::time::Instant::now();
        assert_eq!(ok(&well_formed), Ok(()));
        let with_duplicate = format!("{doc} a329999=\"2\"/>");
        assert!(ok(&with_duplicate)
            .unwrap_err()
            .contains("duplicated attribute"));
        assert!(t.elapsed().as_secs() < 20, "{:?}", t.elapsed());
    }
}
