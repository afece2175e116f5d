//! Giving back the program's pages once a command has run a while. Part of [`super`];
//! depends on `nix`'s `libc` only.
//!
//! Each process maps the pages of the program it runs as it first touches them, and
//! the kernel maps the pages around each one too (fault-around: 64 KiB by default), so
//! that by the time the command runs, lockrun has most of its code mapped, and so has
//! its guard: about 4 MiB of the binary, counted in every process's memory (PSS), for
//! code that start-up ran once. A lockrun that holds a lock for long (the point of a
//! lease) needs little of it: the renewal, the timers and the end of the run.
//!
//! So once the command has run for [`TRIM_AFTER`], lockrun and its guard each drop their
//! mappings of the program's segments that are never writable (its code and read-only
//! data) with `MADV_DONTNEED`. The pages stay in the page cache; what is touched again
//! is mapped again from there on its next use (a minor fault, no read). Never the
//! writable segments (data, and the relocated data made read-only after start-up,
//! which `MADV_DONTNEED` would reset to the file's contents), never a shared library's,
//! and never a page that a writable segment shares: the range is cut to whole pages
//! within the segment. A short run ends before it and pays nothing.

use std::time::Duration;

use nix::libc;

/// How long the command runs before its lockrun and guard give back the program's
/// pages: longer than a short job (which then pays nothing for it), short enough that a
/// job held for long holds little. What it costs is paid at the run's end, on the way
/// from the job's end to the release, where lockrun maps again the code it needs: about
/// 0.5 ms here (measured when this was 250 ms: the release went out 585 µs
/// after the job's end instead of 27 µs, and a busy lock's next holder waited as much
/// longer), at most 0.05% of a run this long, and nothing for a run shorter.
pub const TRIM_AFTER: Duration = Duration::from_secs(1);

/// Drops this process's mappings of the program's never-writable segments (see the
/// module documentation). Errors are ignored: nothing depends on it but memory.
#[allow(unsafe_code)]
pub fn give_back_program_pages() {
    // SAFETY: `dl_iterate_phdr` calls `each` with the loaded objects' headers, which
    // are valid for the call; `each` only reads them and makes `madvise` calls.
    unsafe {
        libc::dl_iterate_phdr(Some(each), std::ptr::null_mut());
    }
}

/// `dl_iterate_phdr`'s callback: the first object is the program itself; its segments
/// without `PF_W` are given back, and the walk stops there.
#[allow(unsafe_code)]
unsafe extern "C" fn each(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    _data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the pointer is valid for this call (`dl_iterate_phdr`'s contract).
    let info = unsafe { &*info };
    // SAFETY: sysconf only reads a value.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return 1,
    };
    for i in 0..usize::from(info.dlpi_phnum) {
        // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_W != 0 {
            continue;
        }
        let base = info.dlpi_addr as usize + ph.p_vaddr as usize;
        let start = base.next_multiple_of(page);
        let end = (base + ph.p_memsz as usize) / page * page;
        if end > start {
            // SAFETY: the range is whole pages of a segment of this program that is
            // never written: dropping its mappings only makes the next use fault them
            // in again from the page cache, unchanged.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
    1
}
