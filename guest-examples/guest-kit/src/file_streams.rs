//! Archive bytes moved by `wasi:filesystem` streams instead of guest copies.
//!
//! A plain copy reads each chunk into guest memory (`blocking-read`) and
//! writes it back out through a file write: two copies across the
//! host/guest boundary per chunk. Splicing a host stream into a file's
//! `write-via-stream` (or a file's `read-via-stream` into a host stream)
//! keeps the bytes in the host. std's `File` cannot hand out its
//! `wasi:filesystem` descriptor, so these helpers open their own through
//! the preopened directories.

use std::io;
use std::path::Path;

use crate::wasi::filesystem::preopens::get_directories;
use crate::wasi::filesystem::types::{
    Descriptor, DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};
use crate::wasi::io::streams::{InputStream, OutputStream, StreamError};
use crate::{stream_error, CopyError};

/// Bytes asked for per splice: the host moves at most what is available.
const SPLICE: u64 = 1 << 20;

/// Opens `path` (an absolute guest path under a preopened directory).
fn open_at(path: &Path, open: OpenFlags, flags: DescriptorFlags) -> io::Result<Descriptor> {
    let path = path
        .to_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path is not UTF-8"))?;
    let mut best: Option<(Descriptor, String)> = None;
    for (dir, base) in get_directories() {
        let base = base.trim_end_matches('/').to_string();
        let inside = path
            .strip_prefix(base.as_str())
            .is_some_and(|rest| rest.starts_with('/'));
        if inside && best.as_ref().is_none_or(|(_, b)| base.len() > b.len()) {
            best = Some((dir, base));
        }
    }
    let (dir, base) = best.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{path} is not under a preopened directory"),
        )
    })?;
    let relative = path[base.len()..].trim_start_matches('/');
    dir.open_at(PathFlags::empty(), relative, open, flags)
        .map_err(io_error)
}

fn io_error(code: ErrorCode) -> io::Error {
    let kind = match code {
        ErrorCode::NoEntry => io::ErrorKind::NotFound,
        ErrorCode::Access | ErrorCode::NotPermitted | ErrorCode::ReadOnly => {
            io::ErrorKind::PermissionDenied
        }
        ErrorCode::Exist => io::ErrorKind::AlreadyExists,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{code:?}"))
}

/// Splices `input` into the (existing) file at `path` until the host closes
/// `input`; returns the bytes moved. The caller syncs and commits the file.
pub(crate) fn splice_into_file(input: &InputStream, path: &Path) -> Result<u64, CopyError> {
    let file =
        open_at(path, OpenFlags::TRUNCATE, DescriptorFlags::WRITE).map_err(CopyError::Storage)?;
    let out = file
        .write_via_stream(0)
        .map_err(|c| CopyError::Storage(io_error(c)))?;
    let mut total = 0u64;
    loop {
        match out.blocking_splice(input, SPLICE) {
            Ok(n) => total += n,
            // `closed` is the archive's end, unless the file stream is the
            // side that closed (it only does so on a write error).
            Err(StreamError::Closed) => {
                out.check_write().map_err(stream_error)?;
                break;
            }
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(CopyError::Stream(e.to_debug_string()))
            }
        }
    }
    out.blocking_flush().map_err(stream_error)?;
    Ok(total)
}

/// A file opened for streaming out with [`FileSource::splice_to`].
pub struct FileSource {
    file: Descriptor,
}

/// Opens the file at `path` for [`FileSource::splice_to`]. Errors keep
/// their `io::ErrorKind` (`NotFound` for a missing file).
pub fn open_file_stream_source(path: &Path) -> io::Result<FileSource> {
    let file = open_at(path, OpenFlags::empty(), DescriptorFlags::READ)?;
    Ok(FileSource { file })
}

impl FileSource {
    /// Splices the whole file into `output`, then flushes; returns the
    /// bytes moved.
    pub fn splice_to(&self, output: &OutputStream) -> Result<u64, CopyError> {
        let src = self
            .file
            .read_via_stream(0)
            .map_err(|c| CopyError::Storage(io_error(c)))?;
        let mut total = 0u64;
        loop {
            match output.blocking_splice(&src, SPLICE) {
                Ok(n) => total += n,
                // The file ended, or the host closed the sink: the check
                // below tells them apart.
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(CopyError::Stream(e.to_debug_string()))
                }
            }
        }
        output.check_write().map_err(stream_error)?;
        output.blocking_flush().map_err(stream_error)?;
        Ok(total)
    }
}
