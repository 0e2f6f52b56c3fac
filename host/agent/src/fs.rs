//! `berth-agent fs ROOT OP …`: file operations confined to the workspace
//! ROOT. Every path is resolved by the kernel beneath ROOT (`openat2` with
//! `RESOLVE_BENEATH`): `..`, an absolute path elsewhere, or a symlink that
//! leads out (planted by the sandboxed code, say) is refused, whatever the
//! filesystem holds. Where openat2 is missing (gVisor, kernels before
//! 5.6), the path is walked one component at a time, no symlink followed. The last component of a name is never followed when
//! it is removed, replaced or described.
//!
//! Exit codes: 0 done; 1 failed (the reason on stderr); 3 not found;
//! 4 refused (outside the workspace, or a kind of file not handled).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::json;

pub(crate) const NOT_FOUND: i32 = 3;
const REFUSED: i32 = 4;

/// Why an operation failed, with its exit code.
pub(crate) struct Failure(pub(crate) i32, pub(crate) String);

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        let code = match e.raw_os_error() {
            Some(libc::ENOENT) => NOT_FOUND,
            Some(libc::EXDEV) | Some(libc::ELOOP) => REFUSED,
            _ => 1,
        };
        let text = match e.raw_os_error() {
            Some(libc::EXDEV) => {
                "it leads outside the workspace (through a symlink or '..')".into()
            }
            _ => e.to_string(),
        };
        Failure(code, text)
    }
}

fn refused(why: impl Into<String>) -> Failure {
    Failure(REFUSED, why.into())
}

/// Runs one operation; prints the failure and returns the exit code.
pub(crate) fn main(args: &[String]) -> i32 {
    let (Some(root), Some(op)) = (args.first(), args.get(1)) else {
        eprintln!("berth-agent fs: usage: fs ROOT OP ARGS (see --help)");
        return 2;
    };
    let rest = &args[2..];
    if op == "walk" {
        return crate::freeze::main(root, rest);
    }
    let path = rest.first().map(String::as_str).unwrap_or("");
    match run(root, op, rest) {
        Ok(()) => 0,
        Err(Failure(code, why)) => {
            eprintln!("berth-agent fs: {op} {path}: {why}");
            code
        }
    }
}

fn run(root: &str, op: &str, args: &[String]) -> Result<(), Failure> {
    let path = args
        .first()
        .ok_or_else(|| Failure(2, "a path is needed".into()))?;
    let rel = relative(root, path)?;
    let root_fd = open_plain(root, libc::O_PATH | libc::O_DIRECTORY)?;
    let mut stdout = io::stdout().lock();
    match op {
        "read" => {
            let fd = beneath(&root_fd, &rel, libc::O_RDONLY)?;
            let file = File::from(fd);
            if file.metadata()?.is_dir() {
                return Err(Failure(1, "it is a directory".into()));
            }
            copy(file, &mut stdout, u64::MAX)?;
        }
        "write" => {
            let size: u64 = arg(args, 1, "SIZE")?
                .parse()
                .map_err(|_| Failure(2, "SIZE must be a number".into()))?;
            let mode = match arg(args, 2, "MODE")? {
                "-" => None,
                m => Some(
                    u32::from_str_radix(m, 8)
                        .map_err(|_| Failure(2, "MODE must be octal or -".into()))?,
                ),
            };
            write_atomically(&root_fd, &rel, size, mode)?;
        }
        "stat" => {
            let line = describe(&root_fd, &rel)?;
            writeln!(stdout, "{line}")?;
        }
        "ls" => {
            let fd = beneath(&root_fd, &rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
            let mut names: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))?
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.sort();
            for name in names {
                let child = rel.join(&name);
                match describe(&root_fd, &child) {
                    Ok(line) => writeln!(stdout, "{line}")?,
                    // Removed while we listed.
                    Err(Failure(NOT_FOUND, _)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        "rm" => {
            let recursive = args.get(1).map(String::as_str) == Some("-r");
            let (dir, name) = parent(&root_fd, &rel)?;
            let st = lstat_at(dir.as_raw_fd(), &name)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                if recursive {
                    remove_tree(dir.as_raw_fd(), &name)?;
                } else {
                    unlink_at(dir.as_raw_fd(), &name, libc::AT_REMOVEDIR)?;
                }
            } else {
                unlink_at(dir.as_raw_fd(), &name, 0)?;
            }
        }
        "mkdir" => {
            if args.get(1).map(String::as_str) == Some("-p") {
                mkdir_all(&root_fd, &rel)?;
            } else {
                let (dir, name) = parent(&root_fd, &rel)?;
                mkdir_at(dir.as_raw_fd(), &name)?;
            }
        }
        "tar" => {
            // A directory's contents (entries under "."), or one file under
            // its own name; symlinks archived as symlinks, never followed.
            let fd = beneath(&root_fd, &rel, libc::O_PATH)?;
            let base = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            let mut builder = tar::Builder::new(&mut stdout);
            builder.follow_symlinks(false);
            if std::fs::metadata(&base)?.is_dir() {
                builder.append_dir_all(".", &base)?;
            } else {
                let name = rel.file_name().map(PathBuf::from).unwrap_or_default();
                let mut file = File::from(beneath(&root_fd, &rel, libc::O_RDONLY)?);
                builder.append_file(&name, &mut file)?;
            }
            builder.finish()?;
        }
        "untar" => {
            let cap: u64 = arg(args, 1, "CAP")?
                .parse()
                .map_err(|_| Failure(2, "CAP must be a number".into()))?;
            untar(&root_fd, &rel, cap)?;
        }
        other => return Err(Failure(2, format!("unknown operation {other:?}"))),
    }
    stdout.flush()?;
    Ok(())
}

fn arg<'a>(args: &'a [String], i: usize, what: &str) -> Result<&'a str, Failure> {
    args.get(i)
        .map(String::as_str)
        .ok_or_else(|| Failure(2, format!("{what} is needed")))
}

/// `path` relative to `root`: a relative path as it is, an absolute one
/// only when it lies under `root`; `..` is refused either way.
fn relative(root: &str, path: &str) -> Result<PathBuf, Failure> {
    let p = Path::new(path);
    let rel = if p.is_absolute() {
        p.strip_prefix(root).map_err(|_| {
            refused(format!(
                "{path} is outside the workspace {root}: give a path relative to it"
            ))
        })?
    } else {
        p
    };
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(refused("'..' is not allowed in a workspace path")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused("an absolute path outside the workspace"))
            }
        }
    }
    Ok(out)
}

pub(crate) fn cstring(bytes: &OsStr) -> Result<CString, Failure> {
    CString::new(bytes.as_bytes()).map_err(|_| Failure(2, "a path with a NUL byte".into()))
}

pub(crate) fn open_plain(path: &str, flags: i32) -> Result<OwnedFd, Failure> {
    let c = cstring(OsStr::new(path))?;
    // SAFETY: open reads a NUL-terminated string we own.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `rel` beneath `root`, the kernel refusing any way out.
fn beneath(root: &OwnedFd, rel: &Path, flags: i32) -> Result<OwnedFd, Failure> {
    beneath_mode(root, rel, flags, 0)
}

fn beneath_mode(root: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> Result<OwnedFd, Failure> {
    let name = if rel.as_os_str().is_empty() {
        cstring(OsStr::new("."))?
    } else {
        cstring(rel.as_os_str())?
    };
    // SAFETY: open_how is plain integers; all zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        mode as u64
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and the open_how we own, with its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            // gVisor (and kernels before 5.6) lack openat2.
            return beneath_by_walk(root, rel, flags, mode);
        }
        return Err(e.into());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `beneath_mode` without openat2: one component at a time from `root`,
/// none of them followed if it is a symlink, and `..` refused. Stricter
/// than `RESOLVE_BENEATH` (a symlink that stays inside is refused too),
/// never looser.
fn beneath_by_walk(root: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> Result<OwnedFd, Failure> {
    let mut names = Vec::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => names.push(cstring(name)?),
            Component::CurDir => {}
            _ => {
                return Err(refused(
                    "a path with `..` or a root leads out of the workspace",
                ))
            }
        }
    }
    let open_at = |dir: RawFd, name: &CString, flags: i32| -> Result<OwnedFd, Failure> {
        // SAFETY: openat reads a name we own.
        let fd = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // O_PATH with O_NOFOLLOW opens a symlink itself: refuse it.
        // SAFETY: a zeroed stat is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes the stat we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Failure(
                REFUSED,
                "a symbolic link in the path is not followed".into(),
            ));
        }
        Ok(fd)
    };
    let Some((last, dirs)) = names.split_last() else {
        return open_at(root.as_raw_fd(), &cstring(OsStr::new("."))?, flags);
    };
    let mut dir: Option<OwnedFd> = None;
    for name in dirs {
        let at = dir.as_ref().map_or(root.as_raw_fd(), AsRawFd::as_raw_fd);
        dir = Some(open_at(at, name, libc::O_PATH | libc::O_DIRECTORY)?);
    }
    let at = dir.as_ref().map_or(root.as_raw_fd(), AsRawFd::as_raw_fd);
    open_at(at, last, flags)
}

/// The directory holding `rel` (opened beneath root) and its last name.
fn parent(root: &OwnedFd, rel: &Path) -> Result<(OwnedFd, CString), Failure> {
    let name = rel
        .file_name()
        .ok_or_else(|| refused("the workspace root itself cannot be replaced or removed"))?;
    let dir = beneath(
        root,
        rel.parent().unwrap_or(Path::new("")),
        libc::O_PATH | libc::O_DIRECTORY,
    )?;
    Ok((dir, cstring(name)?))
}

pub(crate) fn lstat_at(dir: RawFd, name: &CString) -> Result<libc::stat, Failure> {
    // SAFETY: a zeroed stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat reads the name and writes the stat we own.
    if unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(st)
}

pub(crate) fn unlink_at(dir: RawFd, name: &CString, flags: i32) -> Result<(), Failure> {
    // SAFETY: unlinkat reads a name we own.
    if unsafe { libc::unlinkat(dir, name.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn mkdir_at(dir: RawFd, name: &CString) -> io::Result<()> {
    // SAFETY: mkdirat reads a name we own.
    if unsafe { libc::mkdirat(dir, name.as_ptr(), 0o755) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `rel` and its missing parents, each beneath root.
fn mkdir_all(root: &OwnedFd, rel: &Path) -> Result<(), Failure> {
    let mut done = PathBuf::new();
    for part in rel.components() {
        let dir = beneath(root, &done, libc::O_PATH | libc::O_DIRECTORY)?;
        let name = cstring(part.as_os_str())?;
        match mkdir_at(dir.as_raw_fd(), &name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        done.push(part);
    }
    // What is there now must be a directory reached beneath root.
    beneath(root, rel, libc::O_PATH | libc::O_DIRECTORY)?;
    Ok(())
}

/// Removes a directory tree without following any symlink in it.
pub(crate) fn remove_tree(dir: RawFd, name: &CString) -> Result<(), Failure> {
    // SAFETY: openat reads a name we own.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let entries: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    for entry in entries {
        let child = cstring(&entry)?;
        let st = lstat_at(fd.as_raw_fd(), &child)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            remove_tree(fd.as_raw_fd(), &child)?;
        } else {
            unlink_at(fd.as_raw_fd(), &child, 0)?;
        }
    }
    unlink_at(dir, name, libc::AT_REMOVEDIR)
}

/// One JSON line describing `rel` (not following a last symlink).
fn describe(root: &OwnedFd, rel: &Path) -> Result<String, Failure> {
    let (st, target, name) = if rel.as_os_str().is_empty() {
        let fd = beneath(root, rel, libc::O_PATH)?;
        // SAFETY: as in lstat_at.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes the stat we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        (st, None, String::new())
    } else {
        let (dir, name) = parent(root, rel)?;
        let st = lstat_at(dir.as_raw_fd(), &name)?;
        let target = (st.st_mode & libc::S_IFMT == libc::S_IFLNK)
            .then(|| read_link_at(dir.as_raw_fd(), &name))
            .flatten();
        (st, target, rel.to_string_lossy().into_owned())
    };
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        _ => "other",
    };
    let mut fields = vec![
        ("path", json::string(&name)),
        ("type", json::string(kind)),
        ("size", st.st_size.to_string()),
        ("mode", (st.st_mode & 0o7777).to_string()),
        ("mtime", st.st_mtime.to_string()),
    ];
    if let Some(t) = target {
        fields.push(("target", json::string(&t)));
    }
    Ok(json::object(&fields))
}

fn read_link_at(dir: RawFd, name: &CString) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: readlinkat writes at most buf.len() bytes into buf.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// Copies at most `cap` bytes; fails past it.
fn copy(mut from: impl Read, to: &mut impl Write, cap: u64) -> Result<u64, Failure> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        total += n as u64;
        if total > cap {
            return Err(Failure(1, format!("more than the {cap} bytes allowed")));
        }
        to.write_all(&buf[..n])?;
    }
}

/// Writes exactly `size` bytes of stdin to a new file beside the target,
/// then renames it over the target: a reader sees the old file or the new
/// one, and an interrupted write leaves the old one.
///
/// The new file is an unnamed inode (`O_TMPFILE`) that gets a name only
/// once all of it is written, so a writer killed mid-way (SIGKILL, its
/// container's agent gone with the host) leaves nothing behind. Where the
/// filesystem has no `O_TMPFILE`, a named temporary file is used and
/// removed on every failure this process lives to see.
// Kept as one function: temp file, copy, fsync, rename, fsync the directory:
// each step's failure must remove the temp file, which is clearest in one
// body.
fn write_atomically(
    root: &OwnedFd,
    rel: &Path,
    size: u64,
    mode: Option<u32>,
) -> Result<(), Failure> {
    let (dir, name) = parent(root, rel)?;
    let old_mode = match lstat_at(dir.as_raw_fd(), &name) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => Some(st.st_mode & 0o7777),
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
            return Err(Failure(1, "it is a directory".into()))
        }
        // A symlink is replaced, never written through.
        Ok(_) => None,
        Err(Failure(NOT_FOUND, _)) => None,
        Err(e) => return Err(e),
    };
    let mode = mode.or(old_mode).unwrap_or(0o644);
    let tmp = cstring(OsStr::new(&format!(
        ".{}.berth-write-{}",
        String::from_utf8_lossy(name.as_bytes()),
        std::process::id()
    )))?;
    let dot = cstring(OsStr::new("."))?;
    // SAFETY: openat reads a name we own.
    let unnamed = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            dot.as_ptr(),
            libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
            0o600,
        )
    };
    let (fd, named) = if unnamed >= 0 {
        (unnamed, false)
    } else {
        // SAFETY: openat reads a name we own.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        (fd, true)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut linked = named;
    let written = (|| -> Result<(), Failure> {
        let got = copy(io::stdin().lock().take(size + 1), &mut file, size)?;
        if got != size {
            return Err(Failure(
                1,
                format!("stdin ended after {got} of {size} bytes; the file was left as it was"),
            ));
        }
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        file.sync_all()?;
        if !named {
            // The unnamed inode gets the temporary name (linkat through
            // /proc needs no capability, unlike AT_EMPTY_PATH), then the
            // rename below replaces the target in one step.
            let proc_path = cstring(OsStr::new(&format!("/proc/self/fd/{}", file.as_raw_fd())))?;
            // SAFETY: linkat reads two names we own.
            if unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    dir.as_raw_fd(),
                    tmp.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            } != 0
            {
                return Err(io::Error::last_os_error().into());
            }
            linked = true;
        }
        // SAFETY: renameat reads two names we own.
        if unsafe {
            libc::renameat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error().into());
        }
        Ok(())
    })();
    if written.is_err() && linked {
        let _ = unlink_at(dir.as_raw_fd(), &tmp, 0);
    }
    written
}

/// Extracts a tar from stdin into the directory `rel` (made when missing):
/// directories, regular files and symlinks that stay inside, at most `cap`
/// bytes of contents; anything else is refused before it is written.
fn untar(root: &OwnedFd, rel: &Path, cap: u64) -> Result<(), Failure> {
    mkdir_all(root, rel)?;
    let mut archive = tar::Archive::new(io::stdin().lock());
    let mut total = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let inner = relative("/", &raw.to_string_lossy())
            .map_err(|Failure(c, why)| Failure(c, format!("entry {}: {why}", raw.display())))?;
        if inner.as_os_str().is_empty() {
            continue;
        }
        let full = rel.join(&inner);
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        match kind {
            tar::EntryType::Directory => mkdir_all(root, &full)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(p) = full.parent() {
                    mkdir_all(root, p)?;
                }
                let (dir, name) = parent(root, &full)?;
                if let Ok(st) = lstat_at(dir.as_raw_fd(), &name) {
                    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                        unlink_at(dir.as_raw_fd(), &name, 0)?;
                    }
                }
                // SAFETY: openat reads a name we own.
                let fd = unsafe {
                    libc::openat(
                        dir.as_raw_fd(),
                        name.as_ptr(),
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_TRUNC
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        mode,
                    )
                };
                if fd < 0 {
                    return Err(io::Error::last_os_error().into());
                }
                // SAFETY: a descriptor just opened, owned by nobody else.
                let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                total += copy(&mut entry, &mut file, cap.saturating_sub(total))?;
                // SAFETY: fchmod on a descriptor we own.
                unsafe { libc::fchmod(file.as_raw_fd(), mode) };
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| refused(format!("symlink {} without a target", raw.display())))?
                    .into_owned();
                if !stays_inside(&inner, &target) {
                    return Err(refused(format!(
                        "symlink {} -> {} leads outside the directory it is copied into",
                        raw.display(),
                        target.display()
                    )));
                }
                if let Some(p) = full.parent() {
                    mkdir_all(root, p)?;
                }
                let (dir, name) = parent(root, &full)?;
                let _ = unlink_at(dir.as_raw_fd(), &name, 0);
                let t = cstring(target.as_os_str())?;
                // SAFETY: symlinkat reads two names we own.
                if unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) } != 0 {
                    return Err(io::Error::last_os_error().into());
                }
            }
            other => {
                return Err(refused(format!(
                    "entry {} is a {other:?}, which is not copied (only directories, files and symlinks)",
                    raw.display()
                )))
            }
        }
    }
    Ok(())
}

/// Whether a symlink at `at` (relative) pointing to `target` stays within
/// the tree it is in.
fn stays_inside(at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth = at.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_refuse_every_way_out() {
        assert_eq!(relative("/w", "a/./b").ok(), Some(PathBuf::from("a/b")));
        assert_eq!(relative("/w", "/w/a").ok(), Some(PathBuf::from("a")));
        assert!(relative("/w", "/etc/passwd").is_err());
        assert!(relative("/w", "a/../../x").is_err());
        assert!(relative("/w", "/wx/a").is_err());
    }

    #[test]
    fn symlinks_that_climb_out_are_seen() {
        assert!(stays_inside(Path::new("a/l"), Path::new("../b")));
        assert!(!stays_inside(Path::new("l"), Path::new("../b")));
        assert!(!stays_inside(Path::new("a/l"), Path::new("/etc")));
        assert!(!stays_inside(Path::new("a/l"), Path::new("x/../../../y")));
    }

    /// The walk used without openat2 opens what is inside and refuses
    /// every symlink and `..` on the way, whatever the flags.
    #[test]
    fn the_walk_without_openat2_never_follows_a_link() {
        let dir = std::env::temp_dir().join(format!("berth-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("a/out")).unwrap();
        std::os::unix::fs::symlink("b", dir.join("a/in")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("a/b/file-link")).unwrap();
        let root = open_plain(dir.to_str().unwrap(), libc::O_PATH | libc::O_DIRECTORY)
            .ok()
            .unwrap();
        let walk = |rel: &str, flags: i32| beneath_by_walk(&root, Path::new(rel), flags, 0);
        assert!(walk("a/b/f", libc::O_RDONLY).is_ok());
        assert!(walk("", libc::O_PATH | libc::O_DIRECTORY).is_ok());
        for (rel, flags) in [
            ("a/out/passwd", libc::O_RDONLY),
            ("a/in/f", libc::O_RDONLY),
            ("a/b/file-link", libc::O_RDONLY),
            ("a/b/file-link", libc::O_PATH),
            ("a/../a/b/f", libc::O_RDONLY),
        ] {
            match walk(rel, flags) {
                Err(Failure(code, _)) => assert_ne!(code, 0, "{rel}"),
                Ok(_) => panic!("{rel} with flags {flags:#x} was opened"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
