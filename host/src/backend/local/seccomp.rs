//! The seccomp filters a confined local command runs under, compiled to
//! classic BPF for bubblewrap's `--add-seccomp-fd`.
//!
//! The rules are the ones Docker's default profile refuses to an
//! unprivileged container, written as a deny list (everything else is
//! allowed, as the namespaces and the missing capabilities already stop
//! most of it): the clock, kernel modules, mounts and namespaces, keyrings,
//! BPF, perf, `ptrace`-like memory access to other processes, swap,
//! reboot, kexec, `io_uring` (whose operations bypass these rules), and the
//! terminal-injection ioctls. `clone3` answers `ENOSYS` rather than `EPERM`
//! (its flags cannot be inspected, and libc then falls back to `clone`,
//! whose namespace flags are refused), and so does any call through the
//! x32 ABI, which a deny list keyed on x86-64 numbers would otherwise let
//! through. The filters are built with `seccompiler` (Firecracker's
//! compiler); the x32 guard is three instructions written out below.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule,
};

/// Calls refused with `EPERM`.
const REFUSED: &[i64] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_settimeofday,
    libc::SYS_adjtimex,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_init_module,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_kcmp,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    libc::SYS_lookup_dcookie,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    libc::SYS_uselib,
    libc::SYS_userfaultfd,
    libc::SYS_ustat,
    libc::SYS_vhangup,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// `clone` flags that make a new namespace.
const NAMESPACE_FLAGS: &[i32] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

/// Terminal ioctls that push input into, or control, the terminal a
/// command shares with whoever reads it.
// `Ioctl` is `c_ulong` on glibc and `c_int` on musl.
#[allow(clippy::unnecessary_cast)]
const REFUSED_IOCTLS: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

/// Why a filter could not be built (a rule this architecture cannot
/// express).
#[derive(Debug, thiserror::Error)]
#[error("building the seccomp filter: {0}")]
pub(super) struct FilterError(String);

fn err(e: impl std::fmt::Display) -> FilterError {
    FilterError(e.to_string())
}

fn target_arch() -> Result<seccompiler::TargetArch, FilterError> {
    std::env::consts::ARCH.try_into().map_err(err)
}

/// The filters, each as the bytes of a `struct sock_filter` array (what
/// `--add-seccomp-fd` reads), in the order they are to be added.
pub(super) fn programs() -> Result<Vec<Vec<u8>>, FilterError> {
    let arch = target_arch()?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|&nr| (nr, Vec::new())).collect();
    let flag_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    refused.insert(libc::SYS_clone, flag_rules);
    let ioctl_rules = REFUSED_IOCTLS
        .iter()
        .map(|&request| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    refused.insert(libc::SYS_ioctl, ioctl_rules);
    let deny = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let missing = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    let mut out = Vec::new();
    for filter in [deny, missing] {
        let program: BpfProgram = filter.try_into().map_err(err)?;
        out.push(bytes(&program));
    }
    if std::env::consts::ARCH == "x86_64" {
        out.push(x32_guard());
    }
    Ok(out)
}

/// A program as the kernel's `struct sock_filter` array.
fn bytes(program: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for insn in program {
        out.extend_from_slice(&insn.code.to_ne_bytes());
        out.push(insn.jt);
        out.push(insn.jf);
        out.extend_from_slice(&insn.k.to_ne_bytes());
    }
    out
}

/// `ENOSYS` for every call numbered with the x32 bit (`0x40000000`),
/// allow the rest: load the number, compare, return.
fn x32_guard() -> Vec<u8> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const X32_BIT: u32 = 0x4000_0000;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    bytes(&vec![
        insn(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        insn(JGE_K, 0, 1, X32_BIT),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filters_compile_for_this_architecture() {
        let programs = super::programs().unwrap();
        assert!(programs.len() >= 2);
        for p in programs {
            assert!(!p.is_empty() && p.len() % 8 == 0);
        }
    }
}
