//! The control plane's allocator: jemalloc, set up in `main` (the binary's global
//! allocator and its options), and how the library gives freed memory back.
//!
//! Why not glibc's: with thousands of streams, each connection's buffers (h2's 16 KiB
//! write and 8 KiB read buffer, the stream's task) came from heap memory the first syncs
//! had already written, so all of it was resident; jemalloc gives freed pages back
//! within [`OPTIONS`]' decay, and later buffers come from pages not yet touched. At 1,000
//! nodes it took the control plane from about 37 to 30 KiB per stream (`bench_scale`'s
//! fan-out; see the README).

/// jemalloc's options (its `malloc_conf`): freed pages go back to the system after about
/// a second, from a background thread, so an idle control plane shrinks too.
/// (A byte array, not a slice: jemalloc reads the symbol as a `const char *`.)
pub const OPTIONS: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Gives every jemalloc arena's free pages back to the system now (after a wave of first
/// syncs). Does nothing where jemalloc is not the allocator in use (the library's tests).
pub fn release_freed() {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena.
    const PURGE_ALL: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: a void mallctl (no value read or written) on a NUL-terminated name.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "jemalloc purge refused");
    }
}

/// Whether jemalloc runs its background thread (that is, took [`OPTIONS`]).
pub fn background_thread() -> bool {
    let mut on = false;
    let mut len = std::mem::size_of::<bool>();
    // SAFETY: "background_thread" is a bool; `on` and `len` describe a bool's storage.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"background_thread".as_ptr(),
            (&mut on as *mut bool).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0 && on
}

/// jemalloc's own account of the heap, in bytes (its `stats.*`): what the program holds
/// (`allocated`), the pages those allocations occupy (`active`), what of jemalloc's
/// mappings is in RAM (`resident`, its own `metadata` included) and what it keeps mapped
/// but gave back (`retained`). `stats.resident` counts every active page, touched or
/// not, so it can exceed the process's RSS. Where jemalloc is not the global allocator
/// (the library's tests) the figures are only of what went through jemalloc: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    pub allocated: u64,
    pub active: u64,
    pub resident: u64,
    pub metadata: u64,
    pub retained: u64,
}

impl HeapStats {
    /// Reads the figures as of now (jemalloc caches them until its `epoch` moves on).
    pub fn read() -> Option<HeapStats> {
        let mut epoch: u64 = 1;
        let mut len = std::mem::size_of::<u64>();
        // SAFETY: "epoch" is a uint64_t, read and written through `epoch`, sized by `len`.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"epoch".as_ptr(),
                (&mut epoch as *mut u64).cast(),
                &mut len,
                (&mut epoch as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if rc != 0 {
            return None;
        }
        Some(HeapStats {
            allocated: stat(c"stats.allocated")?,
            active: stat(c"stats.active")?,
            resident: stat(c"stats.resident")?,
            metadata: stat(c"stats.metadata")?,
            retained: stat(c"stats.retained")?,
        })
    }

    /// The figures by name, as the metrics show them.
    pub fn by_kind(&self) -> [(&'static str, u64); 5] {
        [
            ("allocated", self.allocated),
            ("active", self.active),
            ("resident", self.resident),
            ("metadata", self.metadata),
            ("retained", self.retained),
        ]
    }
}

/// One of jemalloc's `size_t` statistics.
fn stat(name: &std::ffi::CStr) -> Option<u64> {
    let mut value: usize = 0;
    let mut len = std::mem::size_of::<usize>();
    // SAFETY: every `stats.*` read here is a size_t; `value` and `len` describe one.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&mut value as *mut usize).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(value as u64)
}
