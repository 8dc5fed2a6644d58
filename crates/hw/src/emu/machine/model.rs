//! The cycle model of one DSP core: its clock, its DMA engine and what it
//! has moved, advanced only by what the core itself does, so the figures
//! are deterministic whatever the host scheduler does.
//!
//! - Compute: the counters the instrumented code keeps since the last
//!   synchronisation point are folded into the clock as the maximum over
//!   the VLIW issue classes (scalar slots, FMA units, vector load/store
//!   units, the broadcast unit): they issue in parallel.
//! - Direct accesses to GSM and DDR stall the in-order core for their
//!   latency each, and their bytes go through the core's port at its
//!   bandwidth share after any DMA already queued there.
//! - DMA: a core's transfers run one after another; one starts when the
//!   engine is free and completes `dma_startup_cycles + bytes / share`
//!   later; `dma_wait` stalls only for what is left.
//! - Barriers release every participant at the slowest arrival plus
//!   `model.barrier_cycles`.

use crate::spec::ChipSpec;

/// DMA transfers a core remembers the completion time of; older channels
/// are complete (the engine completes in issue order).
pub(crate) const CHANNEL_RING: usize = 256;

/// The counters one sequence of device code accumulated (the globals of
/// [`crate::emu::instrument::globals::Counter`], in that order).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Issued {
    pub(crate) scalar_millicycles: u64,
    pub(crate) flops: u64,
    pub(crate) fma_units: u64,
    pub(crate) broadcast_units: u64,
    pub(crate) am_bulk_bytes: u64,
    pub(crate) sm_bulk_bytes: u64,
    pub(crate) gsm_requests: u64,
    pub(crate) gsm_bytes: u64,
    pub(crate) ddr_requests: u64,
    pub(crate) ddr_bytes: u64,
}

impl Issued {
    /// From the counters' values in `Counter::ALL` order.
    pub(crate) fn from_values(v: [u64; 10]) -> Self {
        Self {
            scalar_millicycles: v[0],
            flops: v[1],
            fma_units: v[2],
            broadcast_units: v[3],
            am_bulk_bytes: v[4],
            sm_bulk_bytes: v[5],
            gsm_requests: v[6],
            gsm_bytes: v[7],
            ddr_requests: v[8],
            ddr_bytes: v[9],
        }
    }
}

/// Where a DMA transfer's ends are, for its bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Ddr,
    Gsm,
    /// The core's own AM, SM or stack.
    Local,
}

/// One core's modeled state.
#[derive(Debug, Clone)]
pub(crate) struct CoreClock {
    pub(crate) clk: f64,
    dma_free: f64,
    chan_done: Vec<f64>,
    next_chan: u32,
    pub(crate) flops: f64,
    pub(crate) dma_bytes: f64,
    pub(crate) ddr_bytes: f64,
    pub(crate) stall: f64,
    /// Cores of the group: they share the cluster's bandwidth.
    group: u32,
}

impl CoreClock {
    pub(crate) fn new(group: u32) -> Self {
        Self {
            clk: 0.0,
            dma_free: 0.0,
            chan_done: vec![0.0; CHANNEL_RING],
            next_chan: 0,
            flops: 0.0,
            dma_bytes: 0.0,
            ddr_bytes: 0.0,
            stall: 0.0,
            group: group.max(1),
        }
    }

    fn ddr_per_cycle(&self, spec: &ChipSpec) -> f64 {
        spec.ddr_bandwidth / f64::from(spec.clusters) / spec.clock_hz / f64::from(self.group)
    }

    fn gsm_per_cycle(&self, spec: &ChipSpec) -> f64 {
        spec.model.gsm_bandwidth / spec.clock_hz / f64::from(self.group)
    }

    /// Bring the clock up to date with the work issued since the last
    /// synchronisation point.
    pub(crate) fn fold(&mut self, c: &Issued, spec: &ChipSpec) {
        let m = &spec.model;
        let units_per_issue = f64::from(spec.vector_lanes.max(2) / 2);
        let vector_bytes = f64::from(spec.vector_lanes) * 8.0;
        let mem_slots = f64::from(m.vector_mem_slots.max(1));
        let broadcast_slots =
            (f64::from(spec.vector_issue_slots) - f64::from(spec.fma_per_lane) - mem_slots)
                .max(1.0);
        let scalar =
            c.scalar_millicycles as f64 / 1000.0 + c.sm_bulk_bytes as f64 / 8.0 / mem_slots;
        let fma = c.fma_units as f64 / units_per_issue / f64::from(spec.fma_per_lane.max(1));
        let mem = c.am_bulk_bytes as f64 / vector_bytes / mem_slots;
        let broadcast = c.broadcast_units as f64 / units_per_issue / broadcast_slots;
        let busy = scalar.max(fma).max(mem).max(broadcast);
        let latency = c.ddr_requests as f64 * m.ddr_latency_cycles
            + c.gsm_requests as f64 * m.gsm_latency_cycles;
        let mut clk = self.clk + busy + latency;
        if c.ddr_bytes > 0 || c.gsm_bytes > 0 {
            let transfer = c.ddr_bytes as f64 / self.ddr_per_cycle(spec)
                + c.gsm_bytes as f64 / self.gsm_per_cycle(spec);
            let start = self.clk.max(self.dma_free);
            self.dma_free = start + transfer;
            clk = clk.max(self.dma_free);
        }
        self.stall += clk - (self.clk + busy);
        self.clk = clk;
        self.ddr_bytes += c.ddr_bytes as f64;
        self.flops += c.flops as f64;
    }

    /// Wait until `t`.
    pub(crate) fn stall_until(&mut self, t: f64) {
        if t > self.clk {
            self.stall += t - self.clk;
            self.clk = t;
        }
    }

    /// Add `cycles` of work that issues nothing else (a library call,
    /// reading the cycle counter).
    pub(crate) fn spend(&mut self, cycles: f64) {
        self.clk += cycles;
    }

    /// Issue a DMA transfer of `bytes` between `src` and `dst`; returns its
    /// channel.
    pub(crate) fn dma(&mut self, bytes: u64, src: Level, dst: Level, spec: &ChipSpec) -> u32 {
        let ddr_ends = f64::from(u8::from(src == Level::Ddr) + u8::from(dst == Level::Ddr));
        let per_cycle = if ddr_ends > 0.0 {
            // A DDR-to-DDR copy moves its bytes over DDR twice.
            self.ddr_per_cycle(spec) / ddr_ends
        } else if src == Level::Gsm || dst == Level::Gsm {
            self.gsm_per_cycle(spec)
        } else {
            // Core-local AM <-> SM.
            spec.model.gsm_bandwidth / spec.clock_hz
        };
        let start = self.clk.max(self.dma_free);
        let done = start + spec.dma_startup_cycles as f64 + bytes as f64 / per_cycle;
        self.dma_free = done;
        let ch = self.next_chan;
        self.next_chan = self.next_chan.wrapping_add(1);
        self.chan_done[ch as usize % CHANNEL_RING] = done;
        self.dma_bytes += bytes as f64;
        self.ddr_bytes += bytes as f64 * ddr_ends;
        ch
    }

    /// Whether `channel` was ever issued.
    pub(crate) fn issued(&self, channel: u32) -> bool {
        channel < self.next_chan
    }

    /// When `channel` completes (transfers that left the ring are done).
    pub(crate) fn done_at(&self, channel: u32) -> f64 {
        if self.next_chan - channel > CHANNEL_RING as u32 {
            0.0
        } else {
            self.chan_done[channel as usize % CHANNEL_RING]
        }
    }

    /// The kernel returned: outstanding transfers finish first.
    pub(crate) fn finish(&mut self) {
        let free = self.dma_free;
        self.stall_until(free);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_classes_issue_in_parallel_and_the_busiest_sets_the_time() {
        let spec = ChipSpec::default();
        let mut c = CoreClock::new(1);
        // 48 vector FMAs (8 units each) on 3 FMA units: 16 cycles; 6
        // vector loads (768 bytes) on 2 units: 3 cycles.
        c.fold(
            &Issued {
                fma_units: 48 * 8,
                am_bulk_bytes: 6 * 128,
                flops: 48 * 32,
                ..Issued::default()
            },
            &spec,
        );
        assert!((c.clk - 16.0).abs() < 1e-9, "{}", c.clk);
        assert_eq!(c.flops, 1536.0);
        assert_eq!(c.stall, 0.0);
    }

    #[test]
    fn direct_ddr_accesses_stall_and_share_the_port() {
        let spec = ChipSpec::default();
        let mut c = CoreClock::new(1);
        c.fold(
            &Issued {
                ddr_requests: 2,
                ddr_bytes: 16,
                ..Issued::default()
            },
            &spec,
        );
        assert!((c.clk - 2.0 * spec.model.ddr_latency_cycles).abs() < 1e-9);
        assert_eq!(c.ddr_bytes, 16.0);
    }

    #[test]
    fn dma_runs_in_order_and_wait_stalls_for_what_is_left() {
        let spec = ChipSpec::default();
        let mut c = CoreClock::new(1);
        let a = c.dma(1 << 20, Level::Ddr, Level::Local, &spec);
        let b = c.dma(1 << 20, Level::Ddr, Level::Local, &spec);
        assert!(c.done_at(b) > c.done_at(a));
        let t = c.done_at(b);
        c.stall_until(t);
        assert_eq!(c.clk, t);
        assert_eq!(c.dma_bytes, 2.0 * f64::from(1u32 << 20));
        assert!(c.issued(b) && !c.issued(b + 1));
    }
}
