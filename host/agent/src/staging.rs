//! `berth-agent fs ROOT settle STAGING`: a restore extracted under the
//! staging directory `ROOT/STAGING` (the archive's root time on STAGING
//! itself) put in place. Each entry of STAGING replaces the entry of the
//! same name in ROOT (renamed, so nothing is copied), STAGING is removed,
//! and ROOT takes the times STAGING had before anything moved — the
//! workspace root's own time, which a shell's `mv` loop would lose (moving
//! entries out of STAGING changes its time, and into ROOT, ROOT's), so an
//! unchanged workspace restored and stopped again keeps its seal.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::fs::{cstring, lstat_at, open_plain, remove_tree, unlink_at, Failure};

/// Runs the operation; prints the failure and returns the exit code.
pub(crate) fn main(root: &str, args: &[String]) -> i32 {
    let [staging] = args else {
        eprintln!("berth-agent fs: usage: fs ROOT settle STAGING");
        return 2;
    };
    match settle(root, staging) {
        Ok(()) => 0,
        Err(Failure(code, why)) => {
            eprintln!("berth-agent fs: settle {staging}: {why}");
            code
        }
    }
}

fn settle(root: &str, staging: &str) -> Result<(), Failure> {
    if staging.is_empty() || staging.contains('/') || staging == "." || staging == ".." {
        return Err(Failure(2, "STAGING must name an entry of ROOT".into()));
    }
    let root_fd = open_plain(root, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let name = cstring(std::ffi::OsStr::new(staging))?;
    let st = lstat_at(root_fd.as_raw_fd(), &name)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Failure(2, "it is not a directory".into()));
    }
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    // SAFETY: openat reads a name we own.
    let fd = unsafe {
        libc::openat(
            root_fd.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let staged = unsafe { OwnedFd::from_raw_fd(fd) };
    let entries: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", staged.as_raw_fd()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    for entry in entries {
        let child = cstring(&entry)?;
        if child == name {
            continue;
        }
        match lstat_at(root_fd.as_raw_fd(), &child) {
            Ok(old) if old.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                remove_tree(root_fd.as_raw_fd(), &child)?
            }
            Ok(_) => unlink_at(root_fd.as_raw_fd(), &child, 0)?,
            Err(Failure(crate::fs::NOT_FOUND, _)) => {}
            Err(e) => return Err(e),
        }
        // SAFETY: renameat reads two names we own, relative to two
        // descriptors we hold.
        let moved = unsafe {
            libc::renameat(
                staged.as_raw_fd(),
                child.as_ptr(),
                root_fd.as_raw_fd(),
                child.as_ptr(),
            )
        };
        if moved != 0 {
            return Err(io::Error::last_os_error().into());
        }
    }
    drop(staged);
    unlink_at(root_fd.as_raw_fd(), &name, libc::AT_REMOVEDIR)?;
    // The epoch is the staging entry's placeholder: the archive named no
    // root time (a whole archive from Docker's archive API has no root
    // entry), and the root keeps the time the moves gave it.
    if st.st_mtime == 0 && st.st_mtime_nsec == 0 {
        return Ok(());
    }
    // SAFETY: futimens on a descriptor we own, with two timespecs.
    if unsafe { libc::futimens(root_fd.as_raw_fd(), times.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}
