//! Where everything lives in a launch's device memory.
//!
//! Device code runs as WebAssembly against one linear memory, so every
//! memory level of the chip is a range of it, fixed before the kernel runs.
//! The instrumentation pass bakes the fixed ranges into the checks it puts
//! on every access and the runtime places buffers by the same numbers, so
//! the two agree by construction:
//!
//! ```text
//! 0 .. 1024              unmapped for device code (null pointers)
//! static_lo .. static_hi the kernel image: .rodata (read-only), .data,
//!                        .bss (DDR), `__gsm__` arrays (the cluster's GSM)
//! per core i             [guard][stack][SM][AM]  (the core's window:
//!                        stack, SM and AM; the guard catches a stack
//!                        overflow before it reaches the previous core)
//! ddr_lo ..              the launch's DDR buffers: read-only ones first
//! ```
//!
//! Device stacks live in SM on the board; here each core's stack is a range
//! as large as SM right below it, inside the core's window.

use crate::error::HwError;
use crate::spec::ChipSpec;

/// WebAssembly page size.
pub(crate) const PAGE: u64 = 64 * 1024;
/// Addresses below this are never device memory (wasm-ld's global base).
pub(crate) const NULL_END: u32 = 1024;
/// Bytes of unmapped guard below each core's stack.
const GUARD: u64 = PAGE;
/// The largest linear memory a 32-bit module can address, pages.
pub(crate) const MAX_PAGES: u64 = 65536;
/// Alignment of every buffer (one 1024-bit vector).
pub(crate) const BUFFER_ALIGN: u64 = 128;

/// A half-open address range `[lo, lo + len)` of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Span {
    pub(crate) lo: u32,
    pub(crate) len: u32,
}

impl Span {
    pub(crate) fn new(lo: u32, len: u32) -> Self {
        Self { lo, len }
    }
    pub(crate) fn hi(self) -> u64 {
        u64::from(self.lo) + u64::from(self.len)
    }
    /// Whether `[addr, addr + size)` lies inside.
    pub(crate) fn holds(self, addr: u64, size: u64) -> bool {
        addr >= u64::from(self.lo) && addr + size <= self.hi()
    }
}

/// What the kernel image occupies: its data segments and where the linker
/// ended static data (`__data_end`, which covers `.bss`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StaticImage {
    /// All static data, `.bss` included.
    pub(crate) all: Span,
    /// The `__gsm__` arrays (section `mtswarm_gsm`), if any.
    pub(crate) gsm: Span,
    /// Read-only data (`.rodata*` segments), if any.
    pub(crate) rodata: Span,
}

/// The memory map of a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) image: StaticImage,
    /// First byte of core 0's region (its guard).
    core_base: u64,
    /// Bytes from one core's region to the next.
    core_stride: u64,
    pub(crate) stack_bytes: u32,
    pub(crate) sm_bytes: u32,
    pub(crate) am_bytes: u32,
    /// Cores a cluster has (one region each).
    pub(crate) cores: u32,
    /// First byte of the DDR buffers.
    pub(crate) ddr_lo: u32,
}

fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

fn to_u32(x: u64, what: &str) -> Result<u32, HwError> {
    u32::try_from(x).map_err(|_| {
        HwError::Capacity(format!(
            "{what} ends at byte {x}, beyond the 4 GiB the emulator's device memory can address"
        ))
    })
}

impl Layout {
    /// The map for a kernel image on a chip. Fails when the scratchpads of
    /// a cluster do not fit a 32-bit address space.
    pub(crate) fn new(image: StaticImage, spec: &ChipSpec) -> Result<Self, HwError> {
        let sm = to_u32(spec.sm_bytes, "SM")?;
        let am = to_u32(spec.am_bytes, "AM")?;
        let stack = sm;
        let core_base = align_up(image.all.hi().max(u64::from(NULL_END)), PAGE);
        let core_stride = align_up(
            GUARD + u64::from(stack) + u64::from(sm) + u64::from(am),
            PAGE,
        );
        let ddr_lo = core_base + core_stride * u64::from(spec.cores_per_cluster);
        let ddr_lo = to_u32(ddr_lo, "the cores' scratchpads")?;
        Ok(Self {
            image,
            core_base,
            core_stride,
            stack_bytes: stack,
            sm_bytes: sm,
            am_bytes: am,
            cores: spec.cores_per_cluster,
            ddr_lo,
        })
    }

    /// The window of core `core`: its stack, SM and AM, contiguous.
    pub(crate) fn window(&self, core: u32) -> Span {
        let lo = self.core_base + self.core_stride * u64::from(core) + GUARD;
        // In range: `new` checked the last core's region ends below 4 GiB.
        Span::new(lo as u32, self.window_len())
    }

    /// Bytes of a core's window.
    pub(crate) fn window_len(&self) -> u32 {
        self.stack_bytes + self.sm_bytes + self.am_bytes
    }

    /// Offset of SM inside a window (the stack comes first).
    pub(crate) fn sm_offset(&self) -> u32 {
        self.stack_bytes
    }

    /// Offset of AM inside a window.
    pub(crate) fn am_offset(&self) -> u32 {
        self.stack_bytes + self.sm_bytes
    }

    /// The stack of core `core` (it grows down from the top).
    pub(crate) fn stack(&self, core: u32) -> Span {
        Span::new(self.window(core).lo, self.stack_bytes)
    }

    /// SM of core `core`.
    pub(crate) fn sm(&self, core: u32) -> Span {
        Span::new(self.window(core).lo + self.sm_offset(), self.sm_bytes)
    }

    /// AM of core `core`.
    pub(crate) fn am(&self, core: u32) -> Span {
        Span::new(self.window(core).lo + self.am_offset(), self.am_bytes)
    }

    /// The core whose region (guard included) holds `addr`, if any.
    pub(crate) fn core_of(&self, addr: u64) -> Option<u32> {
        if addr < self.core_base || addr >= u64::from(self.ddr_lo) {
            return None;
        }
        u32::try_from((addr - self.core_base) / self.core_stride).ok()
    }

    /// Pages the memory needs for `ddr_len` bytes of DDR buffers.
    pub(crate) fn pages_for(&self, ddr_len: u64) -> Result<u64, HwError> {
        let end = u64::from(self.ddr_lo) + ddr_len;
        let pages = end.div_ceil(PAGE);
        if pages > MAX_PAGES {
            return Err(HwError::Capacity(format!(
                "DDR buffers of {ddr_len} bytes end beyond the 4 GiB the emulator's device memory \
                 can address (the kernel image and {} cores' scratchpads take the first {} bytes)",
                self.cores, self.ddr_lo
            )));
        }
        Ok(pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_disjoint_guarded_and_below_ddr() {
        let image = StaticImage {
            all: Span::new(1024, 6 << 20),
            gsm: Span::new(1024, 6 << 20),
            rodata: Span::default(),
        };
        let spec = ChipSpec::default();
        let layout = Layout::new(image, &spec).expect("fits");
        let mut end = layout.image.all.hi();
        for core in 0..spec.cores_per_cluster {
            let w = layout.window(core);
            assert!(u64::from(w.lo) >= end + GUARD, "core {core} overlaps");
            assert_eq!(layout.core_of(u64::from(w.lo)), Some(core));
            assert_eq!(layout.core_of(w.hi() - 1), Some(core));
            assert_eq!(layout.am(core).hi(), w.hi());
            assert_eq!(layout.stack(core).lo, w.lo);
            end = w.hi();
        }
        assert!(u64::from(layout.ddr_lo) >= end);
        assert_eq!(layout.core_of(u64::from(layout.ddr_lo)), None);
    }

    #[test]
    fn ddr_beyond_4_gib_is_a_capacity_error_naming_the_limit() {
        let layout = Layout::new(StaticImage::default(), &ChipSpec::default()).expect("fits");
        let err = layout.pages_for(4 << 30).unwrap_err();
        assert!(
            matches!(&err, HwError::Capacity(m) if m.contains("4 GiB")),
            "{err}"
        );
        assert!(layout.pages_for(1 << 30).is_ok());
    }
}
