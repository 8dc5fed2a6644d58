//! A core's scratchpad allocator (`vector_malloc` in AM, `scalar_malloc` in
//! SM): first fit, 128-byte granules, with the chip's capacity and buffer
//! count limits. Allocations end with the kernel, as with a fresh image on
//! the board.

use super::EmuError;
use crate::emu::layout::{BUFFER_ALIGN, Span};

#[derive(Debug, Clone)]
pub(crate) struct Scratchpad {
    span: Span,
    level: &'static str,
    alloc_fn: &'static str,
    free_fn: &'static str,
    max_buffers: u32,
    /// (offset, bytes) sorted by offset.
    buffers: Vec<(u32, u32)>,
    in_use: u64,
}

impl Scratchpad {
    pub(crate) fn new(
        span: Span,
        level: &'static str,
        alloc_fn: &'static str,
        free_fn: &'static str,
        max_buffers: u32,
    ) -> Self {
        Self {
            span,
            level,
            alloc_fn,
            free_fn,
            max_buffers,
            buffers: Vec::new(),
            in_use: 0,
        }
    }

    /// Allocate `bytes` for core `core`; returns the device address.
    pub(crate) fn alloc(&mut self, bytes: u32, core: u32) -> Result<u32, EmuError> {
        let (f, level) = (self.alloc_fn, self.level);
        if bytes == 0 {
            return Err(EmuError::Usage(format!(
                "{f}(0) on core {core}: zero-byte buffer"
            )));
        }
        if self.buffers.len() as u32 >= self.max_buffers {
            return Err(EmuError::Capacity(format!(
                "{f}({bytes}) on core {core}: {level} buffer limit exceeded ({} {f} buffers per core)",
                self.max_buffers
            )));
        }
        let rounded = u64::from(bytes).div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
        let capacity = u64::from(self.span.len);
        if rounded > capacity - self.in_use {
            return Err(EmuError::Capacity(format!(
                "{f}({bytes}) on core {core}: {level} capacity exceeded ({capacity} bytes per core, {} in use)",
                self.in_use
            )));
        }
        let mut prev_end = 0u64;
        let mut slot = None;
        for (i, &(offset, len)) in self.buffers.iter().enumerate() {
            if u64::from(offset) - prev_end >= rounded {
                slot = Some(i);
                break;
            }
            prev_end = u64::from(offset) + u64::from(len);
        }
        let slot = match slot {
            Some(i) => i,
            None if capacity - prev_end >= rounded => self.buffers.len(),
            None => {
                return Err(EmuError::Capacity(format!(
                    "{f}({bytes}) on core {core}: {level} capacity exceeded ({capacity} bytes per core, {} in use, no contiguous free range)",
                    self.in_use
                )));
            }
        };
        // In range: prev_end + rounded <= capacity, a u32.
        self.buffers.insert(slot, (prev_end as u32, rounded as u32));
        self.in_use += rounded;
        Ok(self.span.lo + prev_end as u32)
    }

    /// Free the buffer at `addr` (0 is a no-op).
    pub(crate) fn free(&mut self, addr: u32, core: u32) -> Result<(), EmuError> {
        if addr == 0 {
            return Ok(());
        }
        let offset = addr.wrapping_sub(self.span.lo);
        match self.buffers.iter().position(|&(o, _)| o == offset) {
            Some(i) if addr >= self.span.lo => {
                self.in_use -= u64::from(self.buffers[i].1);
                self.buffers.remove(i);
                Ok(())
            }
            _ => Err(EmuError::Usage(format!(
                "{}({addr:#x}) on core {core}: not a live buffer of this core",
                self.free_fn
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn am() -> Scratchpad {
        Scratchpad::new(
            Span::new(4096, 1024),
            "AM",
            "vector_malloc",
            "vector_free",
            4,
        )
    }

    #[test]
    fn first_fit_reuses_freed_space_and_limits_hold() {
        let mut s = am();
        let a = s.alloc(100, 0).expect("fits");
        let b = s.alloc(256, 0).expect("fits");
        assert_eq!((a, b), (4096, 4096 + 128));
        s.free(a, 0).expect("live");
        assert_eq!(s.alloc(128, 0).expect("fits"), 4096);
        let err = s.alloc(1024, 0).unwrap_err();
        assert!(
            matches!(&err, EmuError::Capacity(m) if m.contains("AM capacity exceeded")),
            "{err}"
        );
        assert!(matches!(s.free(4100, 0), Err(EmuError::Usage(_))));
        assert!(matches!(s.alloc(0, 0), Err(EmuError::Usage(_))));
    }

    #[test]
    fn the_buffer_count_is_limited() {
        let mut s = am();
        for _ in 0..4 {
            s.alloc(8, 2).expect("fits");
        }
        let err = s.alloc(8, 2).unwrap_err();
        assert!(
            matches!(&err, EmuError::Capacity(m) if m.contains("buffer limit")),
            "{err}"
        );
    }
}
