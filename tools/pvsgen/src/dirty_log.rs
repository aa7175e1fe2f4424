//! The dirty log a VMM shares while it migrates a VM (SET_LOG_BASE), as the generator plays
//! one: a memfd bitmap, one bit per 4 KiB guest page, that it reads and clears from time to
//! time (QEMU's dirty sync) while the switch marks what it writes.

use std::fs::File;
use std::os::fd::FromRawFd;

/// A dirty log as a VMM gives it while it migrates a VM: a memfd of one bit per 4 KiB page of
/// guest memory.
pub struct DirtyLog {
    pub file: File,
    pub len: u64,
}

impl DirtyLog {
    pub fn new(mem_size: u64) -> DirtyLog {
        let len = mem_size.div_ceil(4096).div_ceil(8).next_multiple_of(8);
        // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
        let fd = unsafe { libc::memfd_create(c"pvs-log".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a new fd we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len).expect("sizing the dirty log");
        DirtyLog { file, len }
    }

    /// Reads and clears the bitmap, as a VMM's dirty sync does; returns the pages marked.
    pub fn sync(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut b, 0).expect("reading the dirty log");
        self.file.write_all_at(&vec![0u8; self.len as usize], 0).expect("clearing the dirty log");
        b.iter().map(|x| x.count_ones() as u64).sum()
    }
}
