//! The text of an HTML page, for `web_fetch`: a small, forgiving extractor
//! (no DOM, no dependency): `<script>`, `<style>`, `<noscript>`,
//! `<template>`, `<svg>`, `<title>` (read apart by [`title`]) and comments
//! dropped, block elements become line
//! breaks, every other tag goes, entities are decoded, runs of blanks fold.
//!
//! Must never: run, load or follow anything the page names (it only reads
//! characters), or loop on malformed markup (every step advances).

/// Elements whose content is not text a reader sees.
const SKIPPED: &[&str] = &["script", "style", "noscript", "template", "svg", "title"];
/// Elements that break a line.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "main",
    "aside",
    "blockquote",
    "pre",
    "hr",
    "dd",
    "dt",
    "dl",
    "form",
    "figure",
    "figcaption",
    "title",
    "td",
    "th",
];

/// The page's `<title>` (decoded, folded), if it has one.
pub fn title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let open_end = lower[start..].find('>')? + start + 1;
    let close = lower[open_end..].find("</title")? + open_end;
    let t = fold(&decode_entities(&html[open_end..close]));
    (!t.is_empty()).then_some(t)
}

/// The visible text of `html`.
pub fn extract(html: &str) -> String {
    let bytes = html.as_bytes();
    let lower = html.to_ascii_lowercase();
    let mut out = String::with_capacity(html.len() / 2);
    let mut text_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // A '<' starts markup only before a letter, '/' or '!' (else it is text).
        let opens = bytes[i] == b'<'
            && bytes
                .get(i + 1)
                .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'/' | b'!'));
        if !opens {
            i += 1;
            continue;
        }
        out.push_str(&decode_entities(&html[text_start..i]));
        if lower[i..].starts_with("<!--") {
            i = lower[i + 4..]
                .find("-->")
                .map_or(bytes.len(), |e| i + 4 + e + 3);
            text_start = i;
            continue;
        }
        let Some(end) = lower[i..].find('>').map(|e| i + e) else {
            // A lone '<' with no tag after it is text.
            out.push('<');
            i += 1;
            text_start = i;
            continue;
        };
        let tag = &lower[i + 1..end];
        let closing = tag.starts_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        i = end + 1;
        if !closing && SKIPPED.contains(&name.as_str()) && !tag.ends_with('/') {
            // Everything up to the element's own closing tag goes.
            let close = format!("</{name}");
            i = lower[i..]
                .find(&close)
                .and_then(|c| lower[i + c..].find('>').map(|e| i + c + e + 1))
                .unwrap_or(bytes.len());
        }
        if BLOCKS.contains(&name.as_str()) {
            out.push('\n');
        } else {
            out.push(' ');
        }
        text_start = i;
    }
    if text_start < bytes.len() {
        out.push_str(&decode_entities(&html[text_start..]));
    }
    out.lines()
        .map(fold)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Blanks folded to one space, trimmed.
fn fold(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `&amp;`, `&lt;`, `&#39;`, `&#x2014;`… decoded; an unknown entity is kept
/// as written.
pub fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let end = rest[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '#'))
            .map(|e| e + 1);
        let decoded = match end {
            Some(e) if e > 1 && rest[e..].starts_with(';') => {
                entity(&rest[1..e]).map(|c| (c, e + 1))
            }
            _ => None,
        };
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn entity(name: &str) -> Option<char> {
    if let Some(num) = name.strip_prefix('#') {
        let n = match num.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => num.parse().ok()?,
        };
        // NUL and surrogates are not characters a page may name.
        return char::from_u32(n).filter(|c| *c != '\0');
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "mdash" => '—',
        "ndash" => '–',
        "hellip" => '…',
        "copy" => '©',
        "reg" => '®',
        "laquo" => '«',
        "raquo" => '»',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "eacute" => 'é',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_text_drops_scripts_styles_and_tags_and_decodes_entities() {
        let page =
            "<!doctype html><html><head><title>A &amp; B</title><style>p{color:red}</style></head>\
            <body><script>alert('x<y')</script><h1>Hello&nbsp;world</h1><!-- hidden -->\
            <p>Fish &amp; chips &lt;3 &#39;quoted&#39; &#x2014; done</p><div>two<br>lines</div>\
            <noscript>enable js</noscript>a &bogus; b < c</body></html>";
        let text = extract(page);
        assert_eq!(
            text,
            "Hello world\nFish & chips <3 'quoted' — done\ntwo\nlines\na &bogus; b < c"
        );
        assert_eq!(title(page).as_deref(), Some("A & B"));
        assert!(!text.contains("alert") && !text.contains("color") && !text.contains("hidden"));
        // Unclosed markup ends; it does not loop.
        assert_eq!(extract("<script>never closed"), "");
        assert_eq!(extract("x <!-- open"), "x");
        assert_eq!(decode_entities("&#0; &#xD800; &amp"), "&#0; &#xD800; &amp");
    }
}
