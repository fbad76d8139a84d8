//! Giving freed memory back to the system after large work: glibc's allocator keeps what
//! was freed in its arenas, so a process that once needed hundreds of MB (an agent's full
//! sync, a control plane's first sync of thousands of nodes) would otherwise stay at its
//! peak RSS for good.

/// Returns the allocator's free memory to the system.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
