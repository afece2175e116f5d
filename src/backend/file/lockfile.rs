//! One open lock file: its identity (device and inode, to notice a replaced file), and
//! reading and writing its [`Record`] at offset 0. Part of [`super`].

use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::record::{Record, MAX_LEN};
use crate::backend::BackendError;

/// An open lock file, checked by [`super::dir::LockDir::open_lock`]. Closing it (drop)
/// lets go of every lock taken through it.
pub struct LockFile {
    file: File,
    id: (u64, u64),
    created: bool,
    /// `DIR/NAME`, for messages.
    shown: String,
    /// The length last read or written: a record is never written shorter.
    len: Cell<usize>,
}

impl LockFile {
    /// Wraps an opened lock file: its device and inode, whether this open created it.
    pub fn new(file: File, id: (u64, u64), created: bool, shown: String) -> LockFile {
        LockFile {
            file,
            id,
            created,
            shown,
            len: Cell::new(0),
        }
    }

    /// The file, for locking.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Device and inode.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// True if this open created the file (its directory entry is new).
    pub fn created(&self) -> bool {
        self.created
    }

    /// `DIR/NAME`, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Reads and parses the record. A file that is not lockrun's is refused (never
    /// overwritten, so no counter is ever reset).
    pub fn read(&self) -> Result<Record, BackendError> {
        // Most records take one block: start small, grow up to one byte past the limit.
        let mut buf = vec![0u8; 4096];
        let mut len = 0;
        loop {
            if len == buf.len() {
                if len > MAX_LEN {
                    break;
                }
                buf.resize((len * 4).min(MAX_LEN + 1), 0);
            }
            match self.file.read_at(&mut buf[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(&e)),
            }
        }
        self.len.set(len);
        Record::parse(&buf[..len]).map_err(|why| {
            BackendError::Refused(format!(
                "{} is not a lockrun lock file ({why}): lockrun keeps the lock's fencing \
                 counter in it and will not overwrite it; repair it (restore it from a \
                 backup, or write a record whose fencing_token is at least the last token \
                 handed out) or use another directory for lockrun's locks",
                self.shown
            ))
        })
    }

    /// Another descriptor of the same open file: a lock taken through it is this
    /// file's (it is let go of when the last descriptor closes), so it can take the
    /// record's guard for a holder whose own descriptor stays in the backend's table.
    pub fn dup(&self) -> Result<LockFile, BackendError> {
        Ok(LockFile {
            file: self.file.try_clone().map_err(|e| self.io(&e))?,
            id: self.id,
            created: false,
            shown: self.shown.clone(),
            len: Cell::new(self.len.get()),
        })
    }

    /// Writes `record` over the one read, padded to at least the file's length (see
    /// [`super::record`]: never truncated); not yet durable, see [`Self::sync`].
    pub fn write(&self, record: &Record) -> Result<(), BackendError> {
        let bytes = record.to_bytes(self.len.get());
        self.file.write_all_at(&bytes, 0).map_err(|e| self.io(&e))?;
        self.len.set(bytes.len());
        Ok(())
    }

    /// Makes what was written durable (`fdatasync`).
    pub fn sync(&self) -> Result<(), BackendError> {
        self.file.sync_data().map_err(|e| self.io(&e))
    }

    /// An I/O error on this file: may pass.
    pub fn io(&self, e: &std::io::Error) -> BackendError {
        BackendError::Unavailable(format!("cannot use the lock file {}: {e}", self.shown))
    }
}

/// Opens (creating it if missing) `path` as a lock file, for the unit tests of the
/// modules that take one: no directory checks, the file's real identity.
#[cfg(test)]
pub(super) fn open_for_test(path: &std::path::Path) -> LockFile {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    let m = file.metadata().unwrap();
    LockFile::new(file, (m.dev(), m.ino()), false, path.display().to_string())
}
