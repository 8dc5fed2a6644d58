//! Instrumentation of device code: the compiler flags that hook every basic
//! block and memory access, the pass that charges each block's scalar work
//! in the kernel's assembly, and the check of device stack frames against
//! SM.

use std::path::Path;

use crate::HwError;
use crate::spec::ChipSpec;

/// Instrumentation of device code: a basic-block hook for the scalar part of
/// the cycle model, and gcc's thread-sanitizer hooks on every load and store
/// (defined by the emulator runtime, never libtsan) so each access is charged
/// by the memory it touches. Function entry/exit hooks are not needed.
pub(crate) const KERNEL_INSTRUMENTATION: &[&str] = &[
    "-fsanitize-coverage=trace-pc",
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
];

/// The scalar-cost pass of the emulator build (x86-64 assembly of an
/// instrumented kernel): every `call __sanitizer_cov_trace_pc` that
/// `-fsanitize-coverage=trace-pc` put at the start of a basic block becomes
/// inline `addq`s of the block's cost, in thousandths of a cycle, to the
/// core's scalar counter (the larger of `model.scalar_block_cycles` and the
/// block's scalar instructions over `scalar_issue_slots`) and of its scalar
/// floating-point operations to the core's flop counter (an FMA counts two).
/// Not counted: packed SSE/AVX instructions (the host's rendering of the
/// 1024-bit vector unit, charged per intrinsic instead) and the intrinsics'
/// own bookkeeping (lines tagged `#mtswarm`). The call clobbered the flags
/// and caller-saved registers, so an `addq` in its place is safe.
///
/// Calls of `memcpy`, `memmove` and `memset` are renamed to the runtime's
/// charged versions (`mtswarm_dev_*`), so their bytes are memory traffic.
pub fn charge_basic_blocks(asm: &str, spec: &ChipSpec) -> String {
    let lines: Vec<&str> = asm.lines().collect();
    let slots = f64::from(spec.scalar_issue_slots.max(1));
    let bookkeeping = access_hook_bookkeeping(&lines);
    let mut out = String::with_capacity(asm.len() + asm.len() / 8);
    for (i, line) in lines.iter().enumerate() {
        if !is_trace_pc_call(line) {
            out.push_str(&rename_mem_calls(line));
            out.push('\n');
            continue;
        }
        let mut instructions = 0u32;
        let mut flops = 0u32;
        for (j, next) in lines.iter().enumerate().skip(i + 1) {
            let text = next.trim();
            if is_trace_pc_call(next) || is_label(next) {
                break;
            }
            if bookkeeping[j] {
                continue;
            }
            if let Some(mnemonic) = scalar_instruction(text) {
                instructions += 1;
                flops += scalar_flops(mnemonic);
                if mnemonic.starts_with('j') || mnemonic.starts_with("ret") {
                    break;
                }
            }
        }
        let cycles = (f64::from(instructions) / slots).max(spec.model.scalar_block_cycles);
        let milli = (cycles * 1000.0).round().max(0.0) as u64;
        out.push_str(&format!(
            "\taddq\t${milli}, %fs:mtswarm_issue@tpoff #mtswarm block of {instructions} instructions\n"
        ));
        if flops > 0 {
            out.push_str(&format!(
                "\taddq\t${flops}, %fs:mtswarm_issue@tpoff+{SCALAR_FLOPS_OFFSET} #mtswarm scalar flops\n"
            ));
        }
    }
    out
}

/// Lines that exist only because of the memory-access hooks, so they are
/// not the kernel's scalar work: each `call __tsan_*`, the argument set-up
/// right before it (writes of `%rdi`/`%rsi`) with the stack spills the call
/// forces, and the reloads right after it. Without this the hooks'
/// calling convention would make instrumented code look scalar-bound.
fn access_hook_bookkeeping(lines: &[&str]) -> Vec<bool> {
    let mut marked = vec![false; lines.len()];
    let is_hook = |line: &str| {
        let mut parts = line.split_whitespace();
        parts.next() == Some("call") && parts.next().is_some_and(|t| t.starts_with("__tsan_"))
    };
    let operands = |line: &str| -> Option<(String, String)> {
        let text = line.trim();
        let (mnemonic, rest) = text.split_once(char::is_whitespace)?;
        let rest = rest.trim();
        let (src, dst) = rest.rsplit_once(',')?;
        Some((format!("{mnemonic} {}", src.trim()), dst.trim().to_owned()))
    };
    const ARG_REGS: &[&str] = &["%rdi", "%edi", "%rsi", "%esi"];
    for (i, line) in lines.iter().enumerate() {
        if !is_hook(line) {
            continue;
        }
        marked[i] = true;
        // Backwards: argument set-up and spills, up to the block's start.
        let mut j = i;
        while j > 0 {
            j -= 1;
            let prev = lines[j];
            let text = prev.trim();
            if is_trace_pc_call(prev) || is_label(prev) || is_hook(prev) || marked[j] {
                break;
            }
            if text.is_empty() || text.starts_with('.') || text.starts_with('#') {
                continue;
            }
            match operands(prev) {
                Some((_, dst)) if ARG_REGS.contains(&dst.as_str()) || dst.ends_with("(%rsp)") => {
                    marked[j] = true;
                }
                _ => break,
            }
        }
        // Forwards: reloads of what the call clobbered.
        let mut k = i + 1;
        while k < lines.len() {
            let text = lines[k].trim();
            if text.is_empty() || text.starts_with('.') || text.starts_with('#') {
                k += 1;
                continue;
            }
            match operands(lines[k]) {
                Some((src, dst))
                    if src.starts_with("mov")
                        && src.ends_with("(%rsp)")
                        && dst.starts_with('%') =>
                {
                    marked[k] = true;
                    k += 1;
                }
                _ => break,
            }
        }
    }
    marked
}

/// Offset of `scalar_flops` in `struct mtswarm_issue_counters` (m3000.h).
const SCALAR_FLOPS_OFFSET: u32 = 8;

/// Library functions device code may call whose bytes the runtime charges:
/// the name in the kernel's assembly and the runtime's charged version.
const CHARGED_MEM_FUNCTIONS: &[(&str, &str)] = &[
    ("memcpy", "mtswarm_dev_memcpy"),
    ("memmove", "mtswarm_dev_memmove"),
    ("memset", "mtswarm_dev_memset"),
];

/// `call memcpy@PLT` (or a tail `jmp`) -> `call mtswarm_dev_memcpy@PLT`.
fn rename_mem_calls(line: &str) -> std::borrow::Cow<'_, str> {
    let mut parts = line.split_whitespace();
    let (Some(op), Some(target)) = (parts.next(), parts.next()) else {
        return line.into();
    };
    if !(op == "call" || op == "jmp") || parts.next().is_some() {
        return line.into();
    }
    let (name, plt) = target
        .strip_suffix("@PLT")
        .map_or((target, ""), |n| (n, "@PLT"));
    match CHARGED_MEM_FUNCTIONS.iter().find(|(from, _)| *from == name) {
        Some((_, to)) => format!("\t{op}\t{to}{plt}").into(),
        None => line.into(),
    }
}

/// Floating-point operations of one scalar instruction (SSE/AVX scalar
/// arithmetic and x87).
fn scalar_flops(mnemonic: &str) -> u32 {
    let m = mnemonic.strip_prefix('v').unwrap_or(mnemonic);
    if m.starts_with("fmadd")
        || m.starts_with("fmsub")
        || m.starts_with("fnmadd")
        || m.starts_with("fnmsub")
    {
        return if m.ends_with("sd") || m.ends_with("ss") {
            2
        } else {
            0
        };
    }
    const SSE: &[&str] = &["add", "sub", "mul", "div", "sqrt", "min", "max"];
    if let Some(op) = m.strip_suffix("sd").or_else(|| m.strip_suffix("ss"))
        && SSE.contains(&op)
    {
        return 1;
    }
    const X87: &[&str] = &[
        "fadd", "faddp", "fsub", "fsubp", "fsubr", "fsubrp", "fmul", "fmulp", "fdiv", "fdivp",
        "fdivr", "fdivrp", "fsqrt",
    ];
    u32::from(X87.contains(&mnemonic))
}

/// A device function's stack frame lives in the core's SM; one larger than
/// SM cannot run on the chip (`gcc -fstack-usage` output, one function per
/// line: `file:line:col:name<TAB>bytes<TAB>qualifiers`).
pub(crate) fn check_stack_frames(su_path: &Path, spec: &ChipSpec) -> Result<(), HwError> {
    let Ok(text) = std::fs::read_to_string(su_path) else {
        // No report (another compiler): nothing to check.
        return Ok(());
    };
    for line in text.lines() {
        let mut fields = line.split('\t');
        let (Some(location), Some(bytes)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(bytes) = bytes.trim().parse::<u64>() else {
            continue;
        };
        if bytes > spec.sm_bytes {
            let function = location.rsplit(':').next().unwrap_or(location);
            return Err(HwError::Capacity(format!(
                "kernel.c: {function} needs a {bytes}-byte stack frame; the stack lives in SM \
                 ({} bytes per core, SM capacity exceeded)",
                spec.sm_bytes
            )));
        }
    }
    Ok(())
}

fn is_trace_pc_call(line: &str) -> bool {
    let mut parts = line.split_whitespace();
    parts.next() == Some("call")
        && parts
            .next()
            .is_some_and(|t| t == "__sanitizer_cov_trace_pc" || t == "__sanitizer_cov_trace_pc@PLT")
}

fn is_label(line: &str) -> bool {
    let text = line.trim_end();
    !text.starts_with(char::is_whitespace) && text.ends_with(':')
}

/// The mnemonic of an instruction line that counts as scalar work, if any.
fn scalar_instruction(text: &str) -> Option<&str> {
    if text.is_empty() || text.starts_with('.') || text.starts_with('#') || text.ends_with(':') {
        return None;
    }
    if text.contains("#mtswarm") {
        return None;
    }
    let mnemonic = text.split_whitespace().next()?;
    let packed = mnemonic.ends_with("pd")
        || mnemonic.ends_with("ps")
        || mnemonic.contains("movdq")
        || mnemonic == "movddup"
        || mnemonic == "vmovddup"
        || ((mnemonic.starts_with('p')
            || mnemonic.starts_with("vp")
            || mnemonic.starts_with("vbroadcast"))
            && (text.contains("%xmm") || text.contains("%ymm") || text.contains("%zmm")));
    (!packed).then_some(mnemonic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_charged_by_their_scalar_instructions() {
        let spec = ChipSpec::default();
        let asm = "f:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tmovsd\t(%rax), %xmm0\n\tmulsd\t(%rdx), %xmm0\n\
                   \tmovupd\t(%rsi), %xmm1\n\tmulpd\t%xmm1, %xmm2\n\taddq $1, %fs:mtswarm_issue@tpoff+8 #mtswarm\n\
                   \taddq\t$8, %rax\n\tcmpq\t%rax, %rbx\n\tjne\t.L3\n\tmovq\t%rax, %rcx\n\
                   .L3:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tret\n";
        let out = charge_basic_blocks(asm, &spec);
        assert!(!out.contains("__sanitizer_cov_trace_pc"), "{out}");
        // movsd, mulsd, addq, cmpq, jne = 5 scalar instructions = 1 cycle at 5 slots.
        assert!(
            out.contains("$1000, %fs:mtswarm_issue@tpoff #mtswarm block of 5 "),
            "{out}"
        );
        // A lone `ret` still costs the minimum block cost.
        assert!(out.contains("block of 1 instructions"), "{out}");
    }

    #[test]
    fn access_hook_calls_are_not_scalar_work() {
        let spec = ChipSpec::default();
        let asm = "f:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tleaq\t8(%rbx), %rax\n\
                   \tmovq\t%rax, %rdi\n\tmovq\t%rax, 24(%rsp)\n\tcall\t__tsan_read8@PLT\n\
                   \tmovq\t24(%rsp), %rax\n\tmovsd\t(%rax), %xmm0\n\taddsd\t%xmm0, %xmm1\n\tret\n";
        let out = charge_basic_blocks(asm, &spec);
        // leaq, movsd, addsd, ret: the hook's call, set-up, spill and reload are not counted.
        assert!(out.contains("block of 4 instructions"), "{out}");
        assert!(
            out.contains("$1, %fs:mtswarm_issue@tpoff+8 #mtswarm scalar flops"),
            "{out}"
        );
    }
}
