//! Host access to a launch's device memory.
//!
//! The memory is a WebAssembly shared memory: every core's instance works on
//! it from its own thread while the host copies DMA transfers and buffers in
//! and out. Device code may race with itself; the host never holds a Rust
//! reference into the memory, only copies through raw pointers after a
//! bounds check, which is what the WebAssembly threads model allows.

use wasmtime::SharedMemory;

use super::EmuError;

/// Bounds-checked copies in, out and within a shared memory.
#[derive(Clone)]
pub(crate) struct DeviceMemory {
    memory: SharedMemory,
}

impl DeviceMemory {
    /// Wraps `memory`, whose whole reservation (`reserved` bytes from its
    /// base) is kept out of forked children.
    pub(crate) fn new(memory: SharedMemory, reserved: u64) -> Self {
        keep_out_of_children(&memory, reserved);
        Self { memory }
    }

    /// The wasmtime handle, for instances to import.
    pub(crate) fn shared(&self) -> &SharedMemory {
        &self.memory
    }

    /// Bytes currently addressable.
    pub(crate) fn len(&self) -> u64 {
        self.memory.data_size() as u64
    }

    /// Grow to at least `pages` pages.
    pub(crate) fn ensure_pages(&self, pages: u64) -> Result<(), EmuError> {
        let have = self.memory.size();
        if pages > have {
            self.memory.grow(pages - have).map_err(|e| {
                EmuError::Capacity(format!(
                    "cannot grow device memory to {pages} pages of 64 KiB: {e}"
                ))
            })?;
        }
        Ok(())
    }

    fn check(&self, addr: u64, len: u64) -> Result<*mut u8, EmuError> {
        if addr.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(EmuError::Usage(format!(
                "device memory access of {len} bytes at {addr:#x} is beyond its {} bytes",
                self.len()
            )));
        }
        let base = self.memory.data().as_ptr() as *mut u8;
        // SAFETY: `addr + len` is within the memory's current size, which
        // never shrinks, so the pointer stays inside the allocation.
        Ok(unsafe { base.add(addr as usize) })
    }

    /// Copy `bytes` into device memory at `addr`.
    pub(crate) fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), EmuError> {
        let dst = self.check(addr, bytes.len() as u64)?;
        // SAFETY: in bounds (checked); the source is a host slice that cannot
        // overlap device memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Copy `len` bytes at `addr` out of device memory.
    pub(crate) fn read(&self, addr: u64, len: u64) -> Result<Vec<u8>, EmuError> {
        let src = self.check(addr, len)?;
        let mut out = vec![0u8; len as usize];
        // SAFETY: in bounds (checked); `out` is a fresh host buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(out)
    }

    /// Copy `len` bytes from `src` to `dst` within device memory (ranges
    /// may overlap, as with memmove).
    pub(crate) fn copy_within(&self, src: u64, dst: u64, len: u64) -> Result<(), EmuError> {
        let s = self.check(src, len)?;
        let d = self.check(dst, len)?;
        // SAFETY: both ranges are in bounds (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, len as usize) };
        Ok(())
    }

    /// Set `len` bytes at `addr` to `byte`.
    pub(crate) fn fill(&self, addr: u64, len: u64, byte: u8) -> Result<(), EmuError> {
        let d = self.check(addr, len)?;
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(d, byte, len as usize) };
        Ok(())
    }

    /// A NUL-terminated string at `addr`, at most `max` bytes.
    pub(crate) fn c_string(&self, addr: u64, max: u64) -> Result<String, EmuError> {
        let avail = self.len().saturating_sub(addr).min(max);
        let bytes = self.read(addr, avail)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }
}

/// Marks the memory's reservation `MADV_DONTFORK`. The daemon forks for
/// every build step and native launch (the confinement is set up between
/// fork and exec); a fork copies the page tables of every populated private
/// mapping and the child's exec tears them down again, so each live
/// launch's device memory (hundreds of MB populated, 4 GiB reserved) made
/// every fork of a busy worker cost tens of milliseconds of system time.
/// No child ever touches device memory: it execs at once. The flag holds
/// across later `mprotect` splits as the memory grows. Failure only loses
/// the saving, so it is logged, not returned.
fn keep_out_of_children(memory: &SharedMemory, reserved: u64) {
    let base = memory.data().as_ptr() as *mut libc::c_void;
    let Ok(len) = usize::try_from(reserved) else {
        return;
    };
    // SAFETY: madvise(MADV_DONTFORK) changes only what fork copies of this
    // range, which wasmtime mapped for this memory and keeps mapped while
    // `memory` lives; it does not change its contents or protection.
    let rc = unsafe { libc::madvise(base, len, libc::MADV_DONTFORK) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "device memory stays in forked children (madvise MADV_DONTFORK failed)"
        );
    }
}
