//! A hint to the processor to bring memory into its cache before it is
//! read: walks over many boxed records (the scheduler's jobs, ctld's job
//! table) fetch a few places ahead of where they read.

/// Asks for every 64-byte line of `size_of::<T>()` bytes at `at` to be
/// brought into the cache. Reads nothing and cannot fault, whatever the
/// address; where the processor has no such hint it does nothing.
#[inline]
pub fn prefetch<T>(at: *const T) {
    prefetch_bytes(at.cast::<u8>(), std::mem::size_of::<T>());
}

/// [`prefetch`] of `len` bytes at `at`.
#[inline]
pub fn prefetch_bytes(at: *const u8, len: usize) {
    // Every line the bytes touch: a 152-byte record that starts late in
    // a line spans four.
    #[cfg(target_arch = "x86_64")]
    for line in (0..(at as usize % 64) + len).step_by(64) {
        let p = at.cast::<i8>().wrapping_add(line);
        // SAFETY: a prefetch reads nothing architecturally and cannot
        // fault, whatever the address; SSE is part of every x86_64.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}
