//! Giving freed memory back to the system after large programming work. A full sync or
//! a large part of an initial sync frees hundreds of MB at once (libnftables' parse of
//! the transaction, the rendered script, the diff); glibc's allocator keeps what was
//! freed in its arenas, so without this the agent's RSS stays at its peak for good.

/// Changes of at least this many Services count as large.
pub const LARGE_CHANGE_SERVICES: usize = 64;

/// Returns the allocator's free memory at the top of its heaps to the system.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
