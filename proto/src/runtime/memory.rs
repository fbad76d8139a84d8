//! Giving freed memory back to the system after large work: glibc's allocator keeps what
//! was freed in its arenas, so a process that once needed hundreds of MB (an agent's full
//! sync) would otherwise stay at its peak RSS for good. (The node agent's allocator; the
//! control plane runs jemalloc, which gives pages back by itself: its own `memory`.)

/// Returns the allocator's free memory to the system.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Large buffers (a netlink batch, a response being encoded) from their own mappings,
/// always: glibc otherwise raises its mmap threshold to the size of each such buffer
/// freed, up to 32 MB, and later ones come from the heap, where the small allocations
/// that fill their holes keep the heap from shrinking.
pub fn keep_large_buffers_apart() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}
