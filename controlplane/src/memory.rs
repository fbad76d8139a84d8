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
