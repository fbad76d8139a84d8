//! libnftables in-process: the same `nft -f` text, without starting a process
//! per transaction (≈16 ms at any table size for `nft -f`; well under a
//! millisecond in-process for an element update). The library is opened with
//! `dlopen` at run time, so kpx builds without its headers and falls back to
//! the `nft` process where it is missing. A context lives in the network
//! namespace of the thread that created it.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use crate::exec::ExecError;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxBuffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxGetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

const TOOL: &str = "libnftables";

/// An open libnftables context.
pub struct NftLibrary {
    handle: *mut c_void,
    ctx: *mut c_void,
    free: CtxFree,
    output: CtxGetBuffer,
    error: CtxGetBuffer,
    run_cmd: RunCmd,
}

// SAFETY: the context is used by one thread at a time (the backend is behind `&mut`);
// libnftables contexts carry no thread affinity beyond that.
unsafe impl Send for NftLibrary {}

/// Why libnftables cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("libnftables.so.1 not found")]
    NotFound,
    #[error("libnftables has no {0}")]
    NoSymbol(&'static str),
    #[error("nft_ctx_new failed")]
    NoContext,
    #[error("cannot buffer libnftables output")]
    NoBuffers,
}

fn symbol<T: Copy>(handle: *mut c_void, name: &'static str) -> Result<T, OpenError> {
    let cname = CString::new(name).map_err(|_| OpenError::NoSymbol(name))?;
    // SAFETY: dlsym on a live handle; the caller names a function of the type it asks for.
    let ptr = unsafe { libc::dlsym(handle, cname.as_ptr()) };
    if ptr.is_null() {
        return Err(OpenError::NoSymbol(name));
    }
    // SAFETY: T is a function pointer type of the same size as a data pointer.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&ptr) })
}

impl NftLibrary {
    /// Opens `libnftables.so.1` and a context with buffered output and errors.
    pub fn open() -> Result<NftLibrary, OpenError> {
        let name = c"libnftables.so.1";
        // SAFETY: dlopen with a constant library name.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(OpenError::NotFound);
        }
        match Self::with_handle(handle) {
            Ok(lib) => Ok(lib),
            Err(e) => {
                // SAFETY: the handle was opened above and is not used after this.
                unsafe { libc::dlclose(handle) };
                Err(e)
            }
        }
    }

    /// Resolves the functions and creates the context; the handle is the caller's to close on error.
    fn with_handle(handle: *mut c_void) -> Result<NftLibrary, OpenError> {
        let new: CtxNew = symbol(handle, "nft_ctx_new")?;
        let buffer_output: CtxBuffer = symbol(handle, "nft_ctx_buffer_output")?;
        let buffer_error: CtxBuffer = symbol(handle, "nft_ctx_buffer_error")?;
        let free: CtxFree = symbol(handle, "nft_ctx_free")?;
        let output: CtxGetBuffer = symbol(handle, "nft_ctx_get_output_buffer")?;
        let error: CtxGetBuffer = symbol(handle, "nft_ctx_get_error_buffer")?;
        let run_cmd: RunCmd = symbol(handle, "nft_run_cmd_from_buffer")?;
        // SAFETY: functions resolved from the library; flags 0 is NFT_CTX_DEFAULT.
        let ctx = unsafe { new(0) };
        if ctx.is_null() {
            return Err(OpenError::NoContext);
        }
        // SAFETY: a valid context.
        if unsafe { buffer_output(ctx) != 0 || buffer_error(ctx) != 0 } {
            // SAFETY: the context was just created and is not used after this.
            unsafe { free(ctx) };
            return Err(OpenError::NoBuffers);
        }
        // Built once, complete: dropping it frees the context and closes the library.
        Ok(NftLibrary { handle, ctx, free, output, error, run_cmd })
    }

    /// Runs a script; returns (ok, output, error text).
    pub fn command(&mut self, script: &str) -> Result<(bool, String, String), ExecError> {
        let text =
            CString::new(script).map_err(|_| ExecError::refused(TOOL, "the script contains a NUL byte"))?;
        // SAFETY: a valid context and a NUL-terminated script; the buffers returned are owned
        // by the context and valid until the next command, and copied before that.
        unsafe {
            let rc = (self.run_cmd)(self.ctx, text.as_ptr());
            let read = |p: *const c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            Ok((rc == 0, read((self.output)(self.ctx)), read((self.error)(self.ctx))))
        }
    }
}

impl Drop for NftLibrary {
    fn drop(&mut self) {
        // SAFETY: the context and handle were created by `open` and are freed once.
        unsafe {
            if !self.ctx.is_null() {
                (self.free)(self.ctx);
            }
            libc::dlclose(self.handle);
        }
    }
}
