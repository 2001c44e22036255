//! A small XML well-formedness check for attached source documents (§5.5):
//! one root element, balanced tags, quoted unique attributes, only the
//! predefined and numeric entity references. DOCTYPE/ENTITY declarations are
//! refused before this runs, so no DTD handling is needed.

pub(crate) fn check_well_formed(doc: &str) -> Result<(), String> {
    let b = doc.as_bytes();
    let mut i = 0;
    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0usize;
    while i < b.len() {
        if b[i] == b'<' {
            let rest = &doc[i..];
            if rest.starts_with("<?") {
                let end = rest
                    .find("?>")
                    .ok_or("unterminated processing instruction")?;
                i += end + 2;
            } else if let Some(body) = rest.strip_prefix("<!--") {
                let end = body.find("-->").ok_or("unterminated comment")?;
                i += 4 + end + 3;
            } else if rest.starts_with("<![CDATA[") {
                if stack.is_empty() {
                    return Err("CDATA outside the root element".into());
                }
                let end = rest.find("]]>").ok_or("unterminated CDATA section")?;
                i += end + 3;
            } else if rest.starts_with("<!") {
                return Err("declarations are not allowed".into());
            } else if let Some(after) = rest.strip_prefix("</") {
                let (name, used) = name_at(after).ok_or("bad closing tag name")?;
                let tail = after[used..].trim_start();
                if !tail.starts_with('>') {
                    return Err(format!("bad closing tag </{name}"));
                }
                if stack.pop() != Some(name) {
                    return Err(format!("mismatched closing tag </{name}>"));
                }
                i += 2 + used + (after.len() - used - tail.len()) + 1;
            } else {
                let (name, used) = name_at(&rest[1..]).ok_or("bad tag name")?;
                if stack.is_empty() {
                    roots += 1;
                    if roots > 1 {
                        return Err("more than one root element".into());
                    }
                }
                let (consumed, empty) = attributes(&rest[1 + used..])?;
                if !empty {
                    stack.push(name);
                }
                i += 1 + used + consumed;
            }
        } else {
            let next = doc[i..].find('<').map_or(b.len(), |k| i + k);
            let text = &doc[i..next];
            if stack.is_empty() && !text.trim().is_empty() {
                return Err("text outside the root element".into());
            }
            check_references(text)?;
            i = next;
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed element <{}>", stack[stack.len() - 1]));
    }
    if roots != 1 {
        return Err("no root element".into());
    }
    Ok(())
}

fn name_at(s: &str) -> Option<(&str, usize)> {
    let mut end = 0;
    for (k, c) in s.char_indices() {
        let ok = if k == 0 {
            c.is_alphabetic() || c == '_' || c == ':'
        } else {
            c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.')
        };
        if !ok {
            break;
        }
        end = k + c.len_utf8();
    }
    (end > 0).then(|| (&s[..end], end))
}

/// Parses attributes up to the end of a start tag; returns bytes consumed
/// (including `>`) and whether the tag was empty (`/>`).
fn attributes(s: &str) -> Result<(usize, bool), String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 0;
    loop {
        let ws = s[i..].len() - s[i..].trim_start().len();
        i += ws;
        let rest = &s[i..];
        if rest.starts_with("/>") {
            return Ok((i + 2, true));
        }
        if rest.starts_with('>') {
            return Ok((i + 1, false));
        }
        if ws == 0 {
            return Err("malformed start tag".into());
        }
        let (name, used) = name_at(rest).ok_or("bad attribute name")?;
        if seen.contains(&name) {
            return Err(format!("duplicate attribute {name}"));
        }
        seen.push(name);
        i += used;
        let rest = s[i..].trim_start();
        i = s.len() - rest.len();
        let rest = rest.strip_prefix('=').ok_or("attribute without value")?;
        i += 1;
        let rest2 = rest.trim_start();
        i += rest.len() - rest2.len();
        let q = rest2.chars().next().ok_or("unterminated start tag")?;
        if q != '"' && q != '\'' {
            return Err("unquoted attribute value".into());
        }
        let end = rest2[1..].find(q).ok_or("unterminated attribute value")?;
        let value = &rest2[1..1 + end];
        if value.contains('<') {
            return Err("'<' in attribute value".into());
        }
        check_references(value)?;
        i += end + 2;
    }
}

fn check_references(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(k) = rest.find('&') {
        let after = &rest[k + 1..];
        let end = after.find(';').ok_or("unterminated entity reference")?;
        let name = &after[..end];
        let ok = match name {
            "amp" | "lt" | "gt" | "quot" | "apos" => true,
            _ => {
                if let Some(h) = name.strip_prefix("#x") {
                    u32::from_str_radix(h, 16)
                        .ok()
                        .and_then(char::from_u32)
                        .is_some()
                } else if let Some(d) = name.strip_prefix('#') {
                    d.parse::<u32>().ok().and_then(char::from_u32).is_some()
                } else {
                    false
                }
            }
        };
        if !ok {
            return Err(format!("unknown entity &{name};"));
        }
        rest = &after[end + 1..];
    }
    Ok(())
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
}
