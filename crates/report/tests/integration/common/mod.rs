//! Reading the HTML report back in tests: its elements as a well-formed XML
//! parser sees them, and the part of it inside one element.

use std::collections::HashMap;

use quick_xml::events::{BytesStart, Event};

/// Elements of an XML document, with their attributes, in document order;
/// fails when the document is not well-formed (unbalanced tags, bad escapes).
pub(crate) fn parse_xml(text: &str) -> Vec<(String, HashMap<String, String>)> {
    let mut reader = quick_xml::Reader::from_str(text);
    let mut elements = Vec::new();
    let attributes = |e: &BytesStart<'_>| -> HashMap<String, String> {
        e.attributes()
            .map(|a| {
                let a = a.expect("attribute");
                (
                    String::from_utf8(a.key.as_ref().to_vec()).expect("utf8 key"),
                    a.unescape_value().expect("attribute value").into_owned(),
                )
            })
            .collect()
    };
    let mut depth = 0i64;
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) => {
                depth += 1;
                let name = String::from_utf8(e.name().as_ref().to_vec()).expect("utf8");
                elements.push((name, attributes(&e)));
            }
            Event::Empty(e) => {
                let name = String::from_utf8(e.name().as_ref().to_vec()).expect("utf8");
                elements.push((name, attributes(&e)));
            }
            Event::End(_) => depth -= 1,
            Event::Text(t) => {
                t.decode().expect("text decodes");
            }
            // Only XML's predefined entities and character references: an
            // HTML-only entity such as `&nbsp;` would break XML parsers.
            Event::GeneralRef(r) => {
                let name = r.decode().expect("entity name").into_owned();
                let known = matches!(name.as_str(), "amp" | "lt" | "gt" | "quot" | "apos")
                    || r.resolve_char_ref().expect("character reference").is_some();
                assert!(known, "unknown entity &{name};");
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "every element is closed");
    elements
}

pub(crate) fn class_of(element: &(String, HashMap<String, String>)) -> Vec<&str> {
    element
        .1
        .get("class")
        .map(|c| c.split_whitespace().collect())
        .unwrap_or_default()
}

/// Elements between the start of the element with `id` and its end.
pub(crate) fn inside<'a>(html: &'a str, tag: &str, id: &str) -> &'a str {
    let attribute = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("{tag}#{id} present"));
    let start = html[..attribute]
        .rfind(&format!("<{tag}"))
        .expect("tag start");
    let end = html[start..]
        .find(&format!("</{tag}>"))
        .unwrap_or_else(|| panic!("{tag}#{id} closed"));
    &html[start..start + end + tag.len() + 3]
}

/// Fails unless `text` contains `part`, showing `text` when it does not.
#[track_caller]
pub(crate) fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{part:?} not in {text}");
}
