//! The control plane's allocator: jemalloc, set up in `main` (the binary's global
//! allocator and its options), and how the library gives freed memory back.
//!
//! Why not glibc's: with thousands of streams, each connection's buffers (h2's 16 KiB
//! write and 8 KiB read buffer, the stream's task) came from heap memory the first syncs
//! had already written, so all of it was resident; jemalloc gives freed pages back within
//! the decay of its options ([`JEMALLOC_OPTIONS`]), and later buffers
//! come from pages not yet touched. At 1,000 nodes it took the control plane from about 37
//! to 30 KiB per stream (`bench_scale`'s fan-out, measured against a baseline taken before
//! loading's freed pages went back; against today's settled baseline jemalloc's figure is
//! about 37 KiB, and glibc was not measured that way again).

/// The control plane's jemalloc options (its `malloc_conf`, which `main` exports; also
/// those of the fan-out benchmark's transport floor, which must allocate as the control
/// plane does): freed pages go back to the system after about a second, from a
/// background thread, so an idle control plane shrinks too. (A byte array, not a slice:
/// jemalloc reads the symbol as a `const char *`.)
pub const JEMALLOC_OPTIONS: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Gives every jemalloc arena's free pages back to the system now (after a wave of first
/// syncs). Does nothing where jemalloc is not the allocator in use (the library's tests).
pub fn release_freed() {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena.
    if !write(c"arena.4096.purge", None) {
        tracing::debug!("jemalloc purge refused");
    }
}

/// Whether jemalloc runs its background thread (that is, took its options).
pub fn background_thread() -> bool {
    read::<bool>(c"background_thread") == Some(true)
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
        if !write(c"epoch", Some(1)) {
            return None;
        }
        let stat = |name| read::<usize>(name).map(|bytes| bytes as u64);
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

/// The C types of the jemalloc controls read here (`bool`, `size_t`).
trait Control: Copy + Default {}
impl Control for bool {}
impl Control for usize {}

/// Reads jemalloc's control `name`, a value of C type `T`; `None` when jemalloc refuses
/// (no such control, another type, or jemalloc not the allocator in use).
fn read<T: Control>(name: &std::ffi::CStr) -> Option<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: `value` and `len` describe a `T`; jemalloc writes at most `len` bytes and
    // refuses a control of another size (the value is then not read).
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&mut value as *mut T).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(value)
}

/// Runs jemalloc's control `name`, writing `value` (a `uint64_t`) to it when there is
/// one; whether jemalloc took it.
fn write(name: &std::ffi::CStr, value: Option<u64>) -> bool {
    let mut value = value;
    let (new, len) = match value.as_mut() {
        Some(v) => ((v as *mut u64).cast(), std::mem::size_of::<u64>()),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: nothing is read back; `new` is null or a `uint64_t` of `len` bytes that
    // outlives the call.
    unsafe {
        tikv_jemalloc_sys::mallctl(name.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), new, len) == 0
    }
}
