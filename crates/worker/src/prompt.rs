//! The worker role's system prompt: what the agent is, the slice it owns, the
//! MT-3000 as numbers (from the board's [`ChipSpec`], never from literals),
//! its tools, and the rules of evidence. Real models read it; the builtin
//! policy ignores it.

use mtswarm_core::Tool;
use mtswarm_hw::{ChipSpec, Slice};
use std::sync::Arc;

/// How a kernel directory is built and judged, and the invitation to
/// change the kernel's code when its parameters are exhausted: the largest
/// gains come from a better kernel, not from a better -D value.
const KERNEL_STRUCTURE: &str = "\n## The kernel\n\
    - The kernel directory holds kernel.c (the device code you tune: a `__global__` entry \
    run by every core of the group, `get_thread_id()` / `get_group_size()` splitting the work, \
    DMA between DDR and AM through `vector_load_async` / `vector_store_async` and their waits, \
    vector intrinsics on 16-double registers), host.c (the harness: inputs, the reference \
    check, the timing) and tune.toml (the parameters, their values and constraints; each \
    parameter is a `-D` define with an `#ifndef` default in kernel.c).\n\
    - host.c, tune.toml and the reference are the harness: the file tools refuse to change \
    them and every build uses a pristine copy, so only kernel.c (and files it includes) is yours.\n\
    - When the parameters are exhausted (every sensible combination measured, or the roofline \
    says none can gain), write a new variant of kernel.c with write_file or apply_patch: \
    unroll, keep more vectors in flight, overlap DMA with compute (double or triple \
    buffering), fuse loads, block for AM and GSM, reorder loops for the DMA startup cost. \
    Keep the entry point's name and signature. An edited kernel is a candidate like any \
    other: compile (which reports its kernel_hash and that the sources are edited), validate, \
    then benchmark it; its record carries that hash and the diff against the pristine kernel, \
    and the fastest valid benchmark of any variant is the job's best.\n";

/// What the system prompt says of the tools: their names and what the
/// schema does not say (which hold the slice, which may wait for an
/// approval) and the usual order. Their descriptions and arguments reach
/// the model with the tools themselves (natively, or in the system message
/// in text mode), so they are not repeated here: a small model's context
/// is 8k tokens.
fn tools_section(tools: &[Arc<dyn Tool>]) -> String {
    let names = |keep: &dyn Fn(&mtswarm_core::ToolSpec) -> bool| -> String {
        let kept: Vec<&str> = tools
            .iter()
            .map(|t| t.spec())
            .filter(|spec| keep(spec))
            .map(|spec| spec.name.as_ref())
            .collect();
        if kept.is_empty() {
            "none".to_string()
        } else {
            kept.join(", ")
        }
    };
    format!(
        "## Tools\n\
         - Yours: {all}.\n\
         - They hold the slice (one at a time): {hardware}. They may wait for a human's approval: {approval}.\n\
         - The usual task: compile the task's candidate (its defines; kernel_dir defaults to the task's \
         kernel directory) to get an artifact id, validate it, benchmark it, repeat for each candidate, \
         then answer.\n",
        all = names(&|_| true),
        hardware = names(&|spec| spec.needs_hardware),
        approval = names(&|spec| spec.risk >= mtswarm_core::Risk::Medium),
    )
}

/// The system prompt of a worker session.
pub(crate) fn worker_system_prompt(
    role: &str,
    instructions: &str,
    slice: &Slice,
    spec: &ChipSpec,
    tools: &[Arc<dyn Tool>],
) -> String {
    let role = if role.trim().is_empty() {
        "tuner"
    } else {
        role.trim()
    };
    let peak_core = spec.flops_per_cycle_per_core() * spec.clock_hz / 1e9;
    let peak_slice = spec.peak_flops(slice.cores) / 1e9;
    let mut prompt = format!(
        "You are a worker agent ({role}) of mtswarm, tuning compute kernels for the {name} \
         on one slice of hardware.\n\n\
         ## Your slice\n\
         {slice_id}: {cores} DSP cores, backend {backend}.\n\n\
         ## The {name}\n\
         - {clusters} DSP clusters x {cpc} cores, {clock:.2} GHz; {host} ARMv8 host cores.\n\
         - Each core: {lanes} FP64 vector lanes x {fma} FMA units = {fpc} flops/cycle \
         ({peak_core:.1} GFLOPS); {vregs} vector registers; {sslots} scalar + {vslots} vector issue slots.\n\
         - Peak of this slice: {peak_slice:.1} GFLOPS.\n\
         - Memories per core: AM (vector) {am} KiB in at most {am_buf} buffers, SM (scalar) {sm} KiB \
         in at most {sm_buf} buffers; GSM {gsm} KiB per cluster; DDR {ddr} GiB per cluster.\n\
         - DDR bandwidth {bw:.1} GB/s for the chip ({cbw:.1} GB/s per cluster, shared by its cores); \
         each DMA transfer costs {dma} cycles to start.\n\
         - Latencies (cycles): vector load {vld}, vector store {vst}, vector FMA {vfma}, scalar load {sld}, broadcast {bc}.\n\n",
        name = spec.name,
        slice_id = slice.id(),
        cores = slice.cores,
        backend = slice.backend,
        clusters = spec.clusters,
        cpc = spec.cores_per_cluster,
        clock = spec.clock_hz / 1e9,
        host = spec.host_cores,
        lanes = spec.vector_lanes,
        fma = spec.fma_per_lane,
        fpc = spec.flops_per_cycle_per_core(),
        vregs = spec.vector_registers,
        sslots = spec.scalar_issue_slots,
        vslots = spec.vector_issue_slots,
        am = spec.am_bytes / 1024,
        am_buf = spec.am_max_buffers,
        sm = spec.sm_bytes / 1024,
        sm_buf = spec.sm_max_buffers,
        gsm = spec.gsm_bytes / 1024,
        ddr = spec.ddr_bytes_per_cluster / (1024 * 1024 * 1024),
        bw = spec.ddr_bandwidth / 1e9,
        cbw = spec.cluster_bandwidth() / 1e9,
        dma = spec.dma_startup_cycles,
        vld = spec.latency.vlddw,
        vst = spec.latency.vstdw,
        vfma = spec.latency.vfmulad,
        sld = spec.latency.sldw,
        bc = spec.latency.svbcast,
    );
    prompt.push_str(&tools_section(tools));
    prompt.push_str(KERNEL_STRUCTURE);
    prompt.push_str(
        "\n## Rules\n\
         - Work only inside your workspace; the kernel directory of the task is copied into it.\n\
         - Medium- and high-risk calls may need a human's approval; a denial is final for that call.\n\
         - Compile, validate, then benchmark: a result counts only with a passing validation and \
         benchmark of the current code, taken after your latest edit.\n\
         - Finish with a short summary and a ```json block holding the best configuration \
         (its -D defines, artifact, median seconds, GFLOPS).\n",
    );
    if !instructions.trim().is_empty() {
        prompt.push_str("\n## Standing instructions\n");
        prompt.push_str(instructions.trim());
        prompt.push('\n');
    }
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_explains_the_kernel_and_invites_source_edits() {
        let spec = ChipSpec::default();
        let slice = Slice {
            board: "board0".into(),
            cluster: Some(0),
            cores: 8,
            backend: mtswarm_hw::BackendKind::Emulator,
        };
        let prompt = worker_system_prompt("tuner", "", &slice, &spec, &[]);
        for wanted in [
            "## The kernel",
            "kernel.c",
            "host.c, tune.toml and the reference are the harness",
            "When the parameters are exhausted",
            "write a new variant of kernel.c",
            "Keep the entry point's name and signature",
            "kernel_hash",
        ] {
            assert!(prompt.contains(wanted), "missing {wanted:?} in:\n{prompt}");
        }
        let kernel = prompt.find("## The kernel").unwrap_or_default();
        let rules = prompt.find("## Rules").unwrap_or_default();
        assert!(kernel < rules, "the kernel section comes before the rules");
    }
}
