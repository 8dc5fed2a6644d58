//! Which memory an address is, as a core sees it: its own stack, SM and AM,
//! the cluster's GSM, the launch's DDR buffers and the kernel image, and
//! everything else, which it may not touch.
//!
//! The instrumented code makes the same decision inline for every access
//! (see `instrument::slow`); this module makes it for what the host does on
//! a core's behalf (DMA, `memcpy`) and names the nearest buffer when an
//! access faults.

use crate::emu::layout::{Layout, Span};

/// One of the launch's DDR buffers, as device code sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DdrBuffer {
    pub(crate) span: Span,
    pub(crate) read_only: bool,
    /// How an error names it, e.g. `DDR buffer 2 (kernel argument 3,
    /// HT_MEM_RO, 4096 bytes)`.
    pub(crate) name: String,
}

/// The DDR buffers of one group execution: read-only ones first, all
/// packed from the layout's `ddr_lo`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DdrMap {
    pub(crate) len: u32,
    pub(crate) read_only_len: u32,
    pub(crate) buffers: Vec<DdrBuffer>,
}

/// Where an access lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Stack,
    Sm,
    Am,
    Gsm,
    /// A DDR buffer or the kernel image's static data (also DDR).
    Ddr,
}

/// A range of memory a core may use, as [`places`] lists them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) span: Span,
    pub(crate) place: Place,
    pub(crate) read_only: bool,
}

/// The regions core `core` may use, in no particular order.
pub(crate) fn regions(layout: &Layout, ddr: &DdrMap, core: u32) -> Vec<Region> {
    let region = |span, place, read_only| Region {
        span,
        place,
        read_only,
    };
    let mut out = vec![
        region(layout.stack(core), Place::Stack, false),
        region(layout.sm(core), Place::Sm, false),
        region(layout.am(core), Place::Am, false),
    ];
    let image = &layout.image;
    if image.gsm.len > 0 {
        out.push(region(image.gsm, Place::Gsm, false));
    }
    // The rest of the image: before and after GSM, read-only data marked.
    let mut cuts = vec![image.all.lo as u64, image.all.hi()];
    for s in [image.gsm, image.rodata] {
        if s.len > 0 {
            cuts.extend([u64::from(s.lo), s.hi()]);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    for pair in cuts.windows(2) {
        let (lo, hi) = (pair[0], pair[1]);
        let span = Span::new(lo as u32, (hi - lo) as u32);
        let inside = |s: Span| s.len > 0 && lo >= u64::from(s.lo) && hi <= s.hi();
        if span.len == 0 || !inside(image.all) || inside(image.gsm) {
            continue;
        }
        out.push(region(span, Place::Ddr, inside(image.rodata)));
    }
    if ddr.read_only_len > 0 {
        out.push(region(
            Span::new(layout.ddr_lo, ddr.read_only_len),
            Place::Ddr,
            true,
        ));
    }
    if ddr.len > ddr.read_only_len {
        out.push(region(
            Span::new(
                layout.ddr_lo + ddr.read_only_len,
                ddr.len - ddr.read_only_len,
            ),
            Place::Ddr,
            false,
        ));
    }
    out
}

/// The region holding all of `[addr, addr + len)`, if one does.
pub(crate) fn region_of(regions: &[Region], addr: u64, len: u64) -> Option<Region> {
    regions
        .iter()
        .copied()
        .find(|r| r.span.holds(addr, len.max(1)))
}

/// Human name of what is at or nearest to `addr`, for fault messages.
pub(crate) fn describe(layout: &Layout, ddr: &DdrMap, core: u32, addr: u64) -> String {
    let mut named: Vec<(Span, String)> = Vec::new();
    for c in 0..layout.cores {
        let whose = if c == core {
            "its own".to_owned()
        } else {
            format!("core {c}'s")
        };
        named.push((layout.stack(c), format!("{whose} stack")));
        named.push((layout.sm(c), format!("{whose} SM")));
        named.push((layout.am(c), format!("{whose} AM")));
    }
    if layout.image.gsm.len > 0 {
        named.push((layout.image.gsm, "the cluster's GSM arrays".to_owned()));
    }
    if layout.image.rodata.len > 0 {
        named.push((
            layout.image.rodata,
            "the kernel's read-only data".to_owned(),
        ));
    }
    if layout.image.all.len > 0 {
        named.push((layout.image.all, "the kernel's static data".to_owned()));
    }
    for b in &ddr.buffers {
        named.push((b.span, b.name.clone()));
    }
    if addr < u64::from(crate::emu::layout::NULL_END) {
        return "a null pointer (nothing lives below address 1024)".to_owned();
    }
    if let Some(c) = layout.core_of(addr)
        && addr < u64::from(layout.stack(c).lo)
    {
        return format!(
            "the guard below core {c}'s stack ({} bytes below it: a stack overflow? device \
             stacks hold {} bytes)",
            u64::from(layout.stack(c).lo) - addr,
            layout.stack_bytes
        );
    }
    // Containing spans first (the most specific: the shortest).
    if let Some((span, name)) = named
        .iter()
        .filter(|(s, _)| s.holds(addr, 1))
        .min_by_key(|(s, _)| s.len)
    {
        return format!("{name} ({:#x}..{:#x})", span.lo, span.hi());
    }
    let distance = |s: &Span| {
        if addr < u64::from(s.lo) {
            u64::from(s.lo) - addr
        } else {
            addr + 1 - s.hi()
        }
    };
    match named.iter().min_by_key(|(s, _)| distance(s)) {
        Some((span, name)) => {
            let d = distance(span);
            let side = if addr < u64::from(span.lo) {
                "below"
            } else {
                "past the end of"
            };
            format!(
                "nothing; nearest: {d} bytes {side} {name} ({:#x}..{:#x})",
                span.lo,
                span.hi()
            )
        }
        None => "nothing".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::layout::StaticImage;
    use crate::spec::ChipSpec;

    fn layout() -> Layout {
        let image = StaticImage {
            all: Span::new(1024, 8192),
            gsm: Span::new(2048, 4096),
            rodata: Span::new(1024, 512),
        };
        Layout::new(image, &ChipSpec::default()).expect("fits")
    }

    fn ddr(l: &Layout) -> DdrMap {
        DdrMap {
            len: 512,
            read_only_len: 256,
            buffers: vec![
                DdrBuffer {
                    span: Span::new(l.ddr_lo, 256),
                    read_only: true,
                    name: "DDR buffer 0".into(),
                },
                DdrBuffer {
                    span: Span::new(l.ddr_lo + 256, 256),
                    read_only: false,
                    name: "DDR buffer 1".into(),
                },
            ],
        }
    }

    #[test]
    fn a_core_may_use_its_own_scratchpads_gsm_ddr_and_the_image() {
        let l = layout();
        let d = ddr(&l);
        let r = regions(&l, &d, 1);
        let at = |addr: u32, len| region_of(&r, u64::from(addr), len);
        assert_eq!(at(l.am(1).lo, 128).map(|r| r.place), Some(Place::Am));
        assert_eq!(at(l.sm(1).lo + 8, 8).map(|r| r.place), Some(Place::Sm));
        assert_eq!(at(2048, 16).map(|r| r.place), Some(Place::Gsm));
        assert!(at(1024, 8).is_some_and(|r| r.read_only && r.place == Place::Ddr));
        assert!(at(l.ddr_lo, 8).is_some_and(|r| r.read_only));
        assert!(at(l.ddr_lo + 300, 8).is_some_and(|r| !r.read_only));
        assert!(at(l.am(0).lo, 8).is_none(), "another core's AM");
        assert!(at(l.ddr_lo + 500, 64).is_none(), "past the last buffer");
        // A range that runs from SM into AM is in neither.
        assert!(at(l.am(1).lo - 8, 16).is_none());
    }

    #[test]
    fn faults_name_what_is_there_or_the_nearest_buffer() {
        let l = layout();
        let d = ddr(&l);
        assert!(describe(&l, &d, 1, u64::from(l.am(0).lo) + 4).contains("core 0's AM"));
        let past = describe(&l, &d, 1, u64::from(l.ddr_lo) + 520);
        assert!(past.contains("past the end of DDR buffer 1"), "{past}");
        assert!(describe(&l, &d, 1, 8).contains("null pointer"));
    }
}
