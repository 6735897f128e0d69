"""The fs layer's copy of a file range into a new file through O_DIRECT (for
slm.store.fs.NewFile, on the descriptor it owns; nothing else calls this).

Why: an import copies a whole base from the user's file into the store. Through the page cache,
the kernel copies every page into a new page-cache page and writeback then walks them page by
page: most of an import's CPU, and CPU is what a small loaded machine lacks. Through O_DIRECT
the bytes go from one aligned buffer to the disk: one read into the buffer, no new pages, no
writeback. Durability is the caller's, as for
every new file: it is fsynced before it is named.

Only whole aligned blocks go this way. The tail (under ALIGN bytes), a range under MIN_BYTES, a
file system that refuses O_DIRECT, and a write it refuses with EINVAL are left to the caller's
own copy, which goes on from the returned count.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

ALIGN = 4096  # a multiple of every logical block size (512 B or 4 KiB)
BUFFER = 4 << 20  # per copying thread
MIN_BYTES = 1 << 20  # below this the page cache's copy costs little, and the blob stays cached
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_local = threading.local()


def copy_aligned(src_fd: int, offset: int, length: int, dst_fd: int, dst_size: int) -> int:
    """Append the largest whole-ALIGN head of `length` bytes at `offset` of `src_fd` to `dst_fd`
    (written up to `dst_size` so far, its position there) with O_DIRECT; the bytes copied (0:
    not tried, or refused at once). An I/O error other than a refused alignment is raised."""
    if not _O_DIRECT or length < MIN_BYTES or dst_size % ALIGN:
        return 0
    flags = fcntl.fcntl(dst_fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(dst_fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError:
        return 0  # the file system does not do O_DIRECT
    done = 0
    try:
        view = _buffer()
        while length - done >= ALIGN:
            got = os.preadv(src_fd, [view[:min(BUFFER, (length - done) // ALIGN * ALIGN)]], offset + done)
            got -= got % ALIGN
            if got == 0:
                break  # a short source: the caller's copy reads the rest (and says if it ended)
            written = _write_all(dst_fd, view[:got])
            done += written
            if written != got:
                break
    finally:
        fcntl.fcntl(dst_fd, fcntl.F_SETFL, flags)
    return done


def _write_all(fd: int, data: memoryview) -> int:
    """Write `data` whole; fewer bytes only where the file system refused an O_DIRECT write
    (EINVAL: not aligned for this device), leaving the rest to the page cache."""
    written = 0
    while written < len(data):
        try:
            n = os.write(fd, data[written:])
        except OSError as err:
            if err.errno == errno.EINVAL:
                return written
            raise
        if n == 0 or n % ALIGN:
            return written + n  # a partial write off the alignment: the rest goes the other way
        written += n
    return written


def _buffer() -> memoryview:
    """This thread's aligned buffer (an anonymous map is page-aligned), made on first use."""
    view = getattr(_local, "view", None)
    if view is None:
        view = _local.view = memoryview(mmap.mmap(-1, BUFFER))
    return view
