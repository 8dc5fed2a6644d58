//! One-line summaries of multi-line texts (errors, tool output, failure
//! reasons) for task results, result records and quarantine records, which
//! all cut them the same way.

/// The first non-blank line of `text`, trimmed, at most 300 characters.
pub(crate) fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::first_line;

    #[test]
    fn skips_blank_lines_trims_and_caps_the_length() {
        assert_eq!(first_line("\n  \n  first  \nsecond"), "first");
        assert_eq!(first_line(""), "");
        assert_eq!(first_line(&"x".repeat(400)).len(), 300);
    }
}
