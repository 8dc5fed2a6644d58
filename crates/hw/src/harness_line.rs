//! The lines a kernel's harness process prints on stdout (the protocol of
//! `examples/kernels/README.md`): a tag, a space and a JSON payload, one
//! line each. Every backend reads the harness's `MTSWARM_RESULT` line the
//! same way, so it is parsed here; the other tags belong to one backend
//! each, which parses their payloads: `MTSWARM_EMU` and `MTSWARM_ERROR` come
//! from the emulator's runtime (`emu::protocol`), `MTSWARM_TIME` is how a
//! real board's harness times an execution ([`crate::sdk`]).

use serde::Deserialize;

use crate::process::tail;

/// A protocol line, by tag, with its JSON payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HarnessLine<'a> {
    /// `MTSWARM_RESULT`: one kernel execution as the harness judged it.
    Result(&'a str),
    /// `MTSWARM_EMU`: the emulator runtime's figures of one group wait.
    Emu(&'a str),
    /// `MTSWARM_ERROR`: the emulator runtime stopped the program.
    Error(&'a str),
    /// `MTSWARM_TIME`: the harness's wall clock of one execution.
    Time(&'a str),
}

impl<'a> HarnessLine<'a> {
    /// The protocol line `line` is, or `None` for any other output (the
    /// kernel's and the harness's own prints). A tag without a payload is
    /// still that tag's line: its empty payload does not parse.
    pub(crate) fn of(line: &'a str) -> Option<Self> {
        let line = line.trim();
        let (tag, payload) = line.split_once(' ').unwrap_or((line, ""));
        let payload = payload.trim();
        match tag {
            "MTSWARM_RESULT" => Some(Self::Result(payload)),
            "MTSWARM_EMU" => Some(Self::Emu(payload)),
            "MTSWARM_ERROR" => Some(Self::Error(payload)),
            "MTSWARM_TIME" => Some(Self::Time(payload)),
            _ => None,
        }
    }
}

/// The payload of a `MTSWARM_RESULT` line: one kernel execution as the
/// harness judged it.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
pub(crate) struct ResultLine {
    /// Whether the execution's output matched the reference.
    pub(crate) valid: bool,
    /// The largest difference from the reference (`null` when not finite).
    #[serde(default)]
    pub(crate) max_abs_err: Option<f64>,
    /// The useful work of one execution, as the harness counts it.
    #[serde(default)]
    pub(crate) flops: Option<f64>,
    /// Why the execution is invalid, in the harness's words.
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// The execution's time, when the harness measured it itself.
    #[serde(default)]
    pub(crate) seconds: Option<f64>,
    /// The seed the execution's inputs were drawn from.
    #[serde(default)]
    pub(crate) seed: Option<u64>,
}

impl ResultLine {
    /// The result of a `MTSWARM_RESULT` payload. A payload that does not
    /// parse still stands for an execution: an invalid one whose error
    /// quotes the end of the line.
    pub(crate) fn parse(payload: &str) -> Self {
        serde_json::from_str(payload).unwrap_or_else(|e| Self {
            valid: false,
            error: Some(format!(
                "unparseable MTSWARM_RESULT line ({e}): {}",
                tail(payload, 200)
            )),
            ..Self::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_told_apart_by_their_tag() {
        assert_eq!(
            HarnessLine::of("  MTSWARM_RESULT {\"valid\":true} "),
            Some(HarnessLine::Result("{\"valid\":true}"))
        );
        assert_eq!(
            HarnessLine::of("MTSWARM_TIME {\"seconds\":1}"),
            Some(HarnessLine::Time("{\"seconds\":1}"))
        );
        assert_eq!(
            HarnessLine::of("MTSWARM_ERROR"),
            Some(HarnessLine::Error(""))
        );
        assert_eq!(HarnessLine::of("device core 1: MTSWARM_RESULT {}"), None);
        assert_eq!(HarnessLine::of("MTSWARM_RESULTS {}"), None);
    }

    #[test]
    fn a_broken_result_line_is_an_invalid_execution() {
        let ok = ResultLine::parse("{\"valid\":true,\"flops\":100,\"seed\":7}");
        assert!(ok.valid && ok.error.is_none());
        assert_eq!((ok.flops, ok.seed), (Some(100.0), Some(7)));
        let broken = ResultLine::parse("{broken");
        assert!(!broken.valid);
        let error = broken.error.unwrap_or_default();
        assert!(
            error.starts_with("unparseable MTSWARM_RESULT line"),
            "{error}"
        );
        assert!(error.ends_with("{broken"), "{error}");
        assert!(!ResultLine::parse("{\"flops\":1}").valid);
    }
}
