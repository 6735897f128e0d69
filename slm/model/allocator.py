"""The process's C allocator, set for a prompt's work (the `slm run` and `slm serve` commands do
it; a program that embeds slm may, docs/api.md).

A prompt's products and activations are arrays of megabytes, allocated and freed a few times
per layer. glibc's malloc serves such blocks with mmap and gives them back to the kernel when
they are freed (or trims the heap's top), so new ones are page-faulted in and zeroed again,
kernel work a prompt pays a few times per layer. Keeping freed blocks in the heap for reuse
spares it without raising the peak (a freed block is reused, not added to); the heap keeps
what it held at its peak until the process ends.
Changes nothing but glibc's two settings, and nothing on a C library without mallopt."""

from __future__ import annotations

# Blocks up to this size come from the heap (glibc's dynamic threshold stops at 32 MiB and
# moves with every free; a prompt's largest activations are a few MiB)...
MMAP_THRESHOLD = 256 << 20
# ...and the heap's free top is given back to the kernel only past this.
TRIM_THRESHOLD = 512 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Ask the C library to keep freed blocks of up to MMAP_THRESHOLD bytes for reuse; True if it
    took both settings (glibc), False where it has no mallopt or refused."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def release_freed_memory() -> bool:
    """Give the C library's free memory back to the kernel now (glibc's malloc_trim: every
    arena's free pages). After keep_freed_memory the heap keeps what it held at its peak, which
    suits a prompt's arrays, reused by the next prompt; but tokenizing a long text peaks at
    hundreds of megabytes (the tokenizer's per-byte alignments) that nothing reuses soon. True
    if memory was released; False where there is no malloc_trim."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim(0) == 1
