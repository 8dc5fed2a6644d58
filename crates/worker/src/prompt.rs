//! The worker role's system prompt: what the agent is, the slice it owns, the
//! MT-3000 as numbers (from the board's [`ChipSpec`], never from literals),
//! its tools, and the rules of evidence. Real models read it; the builtin
//! policy ignores it.

use mtswarm_core::Tool;
use mtswarm_hw::{ChipSpec, Slice};
use std::sync::Arc;

/// The system prompt of a worker session.
pub fn worker_system_prompt(
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
    prompt.push_str("## Tools\n");
    for tool in tools {
        prompt.push_str(&format!(
            "- {} ({:?} risk{}): {}\n",
            tool.name(),
            tool.risk(),
            if tool.needs_hardware() {
                ", holds the slice"
            } else {
                ""
            },
            tool.description()
        ));
    }
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
