//! analyze_kernel: a static look at a kernel's device code, so the model (or
//! the builtin policy) can reason about it before spending board time:
//! loop nests, vector intrinsics, DMA and barrier calls, and the on-chip
//! memory it allocates per level (AM via `vector_malloc`, SM via
//! `scalar_malloc`, GSM via `__gsm__` arrays), evaluated from the `-D`
//! values and the file's own `#define`s where the sizes are constant
//! expressions, and compared with the chip spec's capacities.
//!
//! This is a lexical analysis (comments and strings stripped, braces
//! tracked), not a C parser: an allocation inside `for (i = 0; i < N; i++)`
//! loops counts once per iteration when `N` is evaluable, and sizes or
//! counts that depend on run-time values are reported as unknown.

mod expr;
mod scan;

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_hw::ChipSpec;
use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;
use expr::{Evaluator, sizeof_type};
use scan::{find_loops, line_of, strip_comments, trip_count};

/// Arguments of analyze_kernel.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnalyzeArgs {
    /// Device source relative to the workspace (default `kernel.c`).
    #[serde(default)]
    pub path: Option<String>,
    /// `-D` values to evaluate sizes with (override the file's defaults).
    #[serde(default)]
    pub defines: Option<BTreeMap<String, String>>,
}

const ANALYZE_SHAPE: Shape = Shape {
    maps: &["defines"],
    aliases: &[("file", "path"), ("kernel", "path"), ("params", "defines")],
    ..Shape::NONE
};

/// One loop found in the source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopInfo {
    /// 1-based line of the loop keyword in the source.
    pub line: usize,
    /// `for`, `while` or `do`.
    pub kind: String,
    /// 1 = outermost.
    pub depth: u32,
    /// `for (i = 0; i < N; i++)` with an evaluable `N`.
    pub trip_count: Option<u64>,
    /// The `for`/`while` header between the parentheses.
    #[serde(skip)]
    header: String,
    /// Byte range of the loop body in the stripped source.
    #[serde(skip)]
    body: (usize, usize),
}

/// One on-chip allocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allocation {
    /// 1-based line of the allocation in the source.
    pub line: usize,
    /// Memory level: `AM` (`vector_malloc`), `SM` (`scalar_malloc`) or `GSM` (a `__gsm__` array).
    pub level: String,
    /// The size expression (the malloc argument, or the GSM declaration).
    pub expr: String,
    /// Size of one allocation.
    pub bytes: Option<u64>,
    /// How many times it runs: the product of the trip counts of the loops
    /// around it (`None` when one of them is not a counted loop).
    pub count: Option<u64>,
    /// `bytes * count`, when both are known.
    pub total_bytes: Option<u64>,
}

/// Footprint of one memory level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelFootprint {
    /// `AM`, `SM` or `GSM`.
    pub level: String,
    /// Allocations, counting those in counted loops once per iteration.
    pub buffers: u64,
    /// Sum of the known `total_bytes` of the level's allocations.
    pub known_bytes: u64,
    /// Allocations whose total size could not be evaluated (not in `known_bytes`).
    pub unknown_sizes: usize,
    /// Capacity of the level on one core (AM, SM) or the cluster (GSM), from the hardware spec.
    pub capacity_bytes: u64,
    /// Buffer limit of the level; `None` for GSM, which has none.
    pub max_buffers: Option<u32>,
    /// `known_bytes` exceeds `capacity_bytes`.
    pub over_capacity: bool,
    /// `buffers` exceeds `max_buffers`.
    pub too_many_buffers: bool,
}

/// The result of the analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelAnalysis {
    /// Names of the `__global__` functions.
    pub kernels: Vec<String>,
    /// Every loop, in source order.
    pub loops: Vec<LoopInfo>,
    /// Deepest loop nesting (0 = no loops).
    pub max_loop_depth: u32,
    /// Calls per vector intrinsic (`vec_*`).
    pub intrinsics: BTreeMap<String, usize>,
    /// Calls per DMA or load/store function (`dma_*`, `vector_load`, `scalar_store_async`, ...).
    pub dma_calls: BTreeMap<String, usize>,
    /// Calls per barrier function.
    pub barriers: BTreeMap<String, usize>,
    /// Every on-chip allocation, in source order.
    pub allocations: Vec<Allocation>,
    /// Per-level totals (AM, SM, GSM) against capacity.
    pub footprint: Vec<LevelFootprint>,
    /// The code uses vector types (`lvector`) or vector intrinsics.
    pub uses_vectors: bool,
    /// Some DMA is asynchronous (an `_async`, p2p, broadcast or scatter-gather
    /// call) and is waited on (`dma_wait`).
    pub async_dma: bool,
}

/// Patterns compiled once per process (compiling them costs far more than
/// scanning a kernel). `None` only if a pattern were invalid.
type LazyRegex = LazyLock<Option<Regex>>;

fn lazy(pattern: &'static str) -> Option<Regex> {
    Regex::new(pattern).ok()
}

static DEFINE_RE: LazyRegex =
    LazyLock::new(|| lazy(r"(?m)^\s*#\s*define\s+([A-Za-z_]\w*)[ \t]+(.+?)\s*$"));
static KERNEL_RE: LazyRegex = LazyLock::new(|| lazy(r"__global__\s+[\w\s\*]*?\b(\w+)\s*\("));
static INTRINSIC_RE: LazyRegex = LazyLock::new(|| lazy(r"\b(vec_\w+)\s*\("));
static DMA_RE: LazyRegex = LazyLock::new(|| {
    lazy(
        r"\b(dma_\w+|vector_load(?:_async)?|vector_store(?:_async)?|scalar_load(?:_async)?|scalar_store(?:_async)?)\s*\(",
    )
});
static BARRIER_RE: LazyRegex =
    LazyLock::new(|| lazy(r"\b(group_barrier|core_barrier|hthread_barrier_\w+|barrier\w*)\s*\("));
static MALLOC_RE: LazyRegex = LazyLock::new(|| lazy(r"\b(vector_malloc|scalar_malloc)\s*\("));
static GSM_RE: LazyRegex = LazyLock::new(|| {
    lazy(r"__gsm__\s+([A-Za-z_][\w\s]*?)\s+\**\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)+)")
});

fn pattern(re: &'static LazyRegex) -> Option<&'static Regex> {
    re.as_ref()
}

/// `#define NAME VALUE` lines of the file (object-like macros only).
fn file_defines(code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(re) = pattern(&DEFINE_RE) {
        for cap in re.captures_iter(code) {
            out.entry(cap[1].to_string())
                .or_insert_with(|| cap[2].to_string());
        }
    }
    out
}

/// The argument text of a call starting at byte `open` (a `(`).
fn call_argument(code: &str, open: usize) -> String {
    let rest = &code[open..];
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return rest[1..i].trim().to_owned();
                }
            }
            _ => {}
        }
    }
    rest.trim_start_matches('(').trim().to_owned()
}

fn count_calls(code: &str, re: &Regex) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for cap in re.captures_iter(code) {
        *out.entry(cap[1].to_string()).or_insert(0) += 1;
    }
    out
}

/// Analyze device source `source` with `defines` overriding its `#define`s.
pub fn analyze_source(
    source: &str,
    defines: &BTreeMap<String, String>,
    spec: &ChipSpec,
) -> KernelAnalysis {
    let code = strip_comments(source);
    let mut macros = file_defines(&code);
    for (k, v) in defines {
        macros.insert(k.clone(), v.clone());
    }
    let mut loops = find_loops(&code);
    {
        let mut evaluator = Evaluator::new(&macros);
        for l in &mut loops {
            if l.kind == "for" {
                l.trip_count = trip_count(&l.header, &mut evaluator);
            }
        }
    }
    let max_loop_depth = loops.iter().map(|l| l.depth).max().unwrap_or(0);

    let kernels = pattern(&KERNEL_RE)
        .map(|r| r.captures_iter(&code).map(|c| c[1].to_string()).collect())
        .unwrap_or_default();
    let intrinsics = pattern(&INTRINSIC_RE)
        .map(|r| count_calls(&code, r))
        .unwrap_or_default();
    let dma_calls = pattern(&DMA_RE)
        .map(|r| count_calls(&code, r))
        .unwrap_or_default();
    let barriers = pattern(&BARRIER_RE)
        .map(|r| count_calls(&code, r))
        .unwrap_or_default();
    let uses_vectors = code.contains("lvector") || !intrinsics.is_empty();
    let async_dma = dma_calls
        .keys()
        .any(|k| k.ends_with("_async") || k == "dma_p2p" || k == "dma_broadcast" || k == "dma_sg")
        && dma_calls.contains_key("dma_wait");

    let mut evaluator = Evaluator::new(&macros);
    let mut allocations = Vec::new();
    if let Some(r) = pattern(&MALLOC_RE) {
        for m in r.captures_iter(&code) {
            let whole = m.get(0).map(|g| (g.start(), g.end())).unwrap_or_default();
            let expr = call_argument(&code, whole.1 - 1);
            let level = if &m[1] == "vector_malloc" { "AM" } else { "SM" };
            let count = loops
                .iter()
                .filter(|l| l.body.0 <= whole.0 && whole.0 < l.body.1)
                .try_fold(1u64, |acc, l| l.trip_count.and_then(|t| acc.checked_mul(t)));
            let bytes = evaluator.eval(&expr);
            allocations.push(Allocation {
                line: line_of(&code, whole.0),
                level: level.into(),
                total_bytes: bytes.zip(count).and_then(|(b, c)| b.checked_mul(c)),
                bytes,
                count,
                expr,
            });
        }
    }
    if let Some(r) = pattern(&GSM_RE) {
        for m in r.captures_iter(&code) {
            let start = m.get(0).map(|g| g.start()).unwrap_or_default();
            let elem = sizeof_type(m[1].trim());
            let dims: Vec<String> = m[3]
                .split(']')
                .filter_map(|d| d.trim().strip_prefix('[').map(|s| s.trim().to_owned()))
                .collect();
            let mut bytes = elem;
            for d in &dims {
                bytes = match (bytes, evaluator.eval(d)) {
                    (Some(b), Some(n)) => b.checked_mul(n),
                    _ => None,
                };
            }
            allocations.push(Allocation {
                line: line_of(&code, start),
                level: "GSM".into(),
                expr: format!("{} {}[{}]", m[1].trim(), &m[2], dims.join("]["),),
                bytes,
                count: Some(1),
                total_bytes: bytes,
            });
        }
    }

    let footprint = [
        ("AM", spec.am_bytes, Some(spec.am_max_buffers)),
        ("SM", spec.sm_bytes, Some(spec.sm_max_buffers)),
        ("GSM", spec.gsm_bytes, None),
    ]
    .iter()
    .map(|(level, capacity, max_buffers)| {
        let mine: Vec<&Allocation> = allocations.iter().filter(|a| a.level == *level).collect();
        let known: u64 = mine.iter().filter_map(|a| a.total_bytes).sum();
        let buffers: u64 = mine.iter().map(|a| a.count.unwrap_or(1)).sum();
        LevelFootprint {
            level: (*level).into(),
            buffers,
            known_bytes: known,
            unknown_sizes: mine.iter().filter(|a| a.total_bytes.is_none()).count(),
            capacity_bytes: *capacity,
            max_buffers: *max_buffers,
            over_capacity: known > *capacity,
            too_many_buffers: max_buffers.is_some_and(|m| buffers > u64::from(m)),
        }
    })
    .collect();

    KernelAnalysis {
        kernels,
        loops,
        max_loop_depth,
        intrinsics,
        dma_calls,
        barriers,
        allocations,
        footprint,
        uses_vectors,
        async_dma,
    }
}

fn summarize(path: &str, a: &KernelAnalysis) -> String {
    let mut s = format!("{path}: kernels {:?}\n", a.kernels);
    s.push_str(&format!(
        "loops: {} (max nesting {})",
        a.loops.len(),
        a.max_loop_depth
    ));
    for l in &a.loops {
        s.push_str(&format!(
            "\n  line {}: {} depth {}",
            l.line, l.kind, l.depth
        ));
    }
    let list = |m: &BTreeMap<String, usize>| {
        if m.is_empty() {
            "none".to_owned()
        } else {
            m.iter()
                .map(|(k, v)| format!("{k} x{v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    s.push_str(&format!("\nvector intrinsics: {}", list(&a.intrinsics)));
    s.push_str(&format!(
        "\nDMA: {}{}",
        list(&a.dma_calls),
        if a.async_dma {
            " (asynchronous, waited)"
        } else {
            ""
        }
    ));
    s.push_str(&format!("\nbarriers: {}", list(&a.barriers)));
    for f in &a.footprint {
        if f.buffers == 0 {
            continue;
        }
        s.push_str(&format!(
            "\n{}: {} buffers, {} of {} bytes{}{}{}",
            f.level,
            f.buffers,
            f.known_bytes,
            f.capacity_bytes,
            if f.unknown_sizes > 0 {
                format!(" (+{} sizes not evaluable)", f.unknown_sizes)
            } else {
                String::new()
            },
            if f.over_capacity {
                " OVER CAPACITY"
            } else {
                ""
            },
            if f.too_many_buffers {
                " TOO MANY BUFFERS"
            } else {
                ""
            },
        ));
    }
    if !a.uses_vectors {
        s.push_str("\nno vector code: scalar only");
    }
    s
}

/// Static analysis of a kernel source file.
pub struct AnalyzeKernel(pub(crate) Arc<ToolEnv>);

/// What `analyze_kernel` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "analyze_kernel",
    "Static analysis of device code: loop nests, vector intrinsics, DMA and barrier calls, and AM/SM/GSM footprint (evaluated with the given -D values) against the chip's capacities.",
    schema_of::<AnalyzeArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for AnalyzeKernel {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &ANALYZE_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: AnalyzeArgs = parse_args(args)?;
        let (path, shown) = self
            .0
            .resolve_file(args.path.as_deref().unwrap_or("kernel.c"))?;
        let source = std::fs::read_to_string(&path).map_err(|e| {
            ToolError::InvalidArgs(format!(
                "cannot read `{shown}`: {e}; {}",
                self.0.kernel_dirs_hint()
            ))
        })?;
        let analysis = analyze_source(&source, &args.defines.unwrap_or_default(), &self.0.spec);
        let data = serde_json::to_value(&analysis).unwrap_or(Value::Null);
        Ok(ToolOutput::text(summarize(&shown, &analysis))
            .with_data(json!({"path": shown, "analysis": data})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_nest_with_and_without_braces() {
        let code = "void f() {\n for (i=0;i<n;i++) {\n  for (j=0;j<m;j++)\n   for (k=0;k<4;k++) x++;\n }\n while (a) { do { b(); } while (c); }\n}\n";
        let loops = find_loops(code);
        let depths: Vec<(usize, u32)> = loops.iter().map(|l| (l.line, l.depth)).collect();
        assert_eq!(depths, [(2, 1), (3, 2), (4, 3), (6, 1), (6, 2)]);
    }

    #[test]
    fn expressions_evaluate_with_macros_and_sizeof() {
        let macros = BTreeMap::from([
            ("N".to_string(), "(64*2)".to_string()),
            ("M".to_string(), "N/4".to_string()),
        ]);
        let mut e = Evaluator::new(&macros);
        assert_eq!(e.eval("N * M * sizeof(double)"), Some(128 * 32 * 8));
        assert_eq!(e.eval("(size_t)N*sizeof(lvector double)"), Some(128 * 128));
        assert_eq!(e.eval("n * 8"), None);
        let cyclic = BTreeMap::from([("A".to_string(), "A+1".to_string())]);
        assert_eq!(Evaluator::new(&cyclic).eval("A"), None);
    }
}
