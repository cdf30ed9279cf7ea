//! The sandbox fallback when bubblewrap is missing and the operator allowed
//! it: Landlock filesystem (and TCP) rules plus a seccomp filter, applied in
//! the child between `fork` and `exec`.
//!
//! Everything is built before the fork ([`prepare`]: the Landlock ruleset fd
//! with its rules, the compiled BPF program); the child only makes syscalls
//! ([`Prepared::apply`]). Unlike bwrap there are no new namespaces: the
//! plugin keeps the host's user, PID and mount view, and sees only what the
//! Landlock rules allow (no private `/tmp`, no `/proc` outside its rules).

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::{Network, SYSTEM_RO_PATHS, SandboxPlan};

/// The Landlock ABI required: 4 is the first with TCP bind/connect rules
/// (Linux 6.7). An older kernel refuses the start rather than run the plugin
/// with less isolation than asked for.
const LANDLOCK_ABI: ABI = ABI::V4;

/// Device files a plugin may read and write.
const DEV_FILES: &[&str] = &["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// Syscalls refused in every fallback sandbox (`EPERM`): debugging other
/// processes, mounts and namespaces, kernel keyrings, BPF, modules, and
/// io_uring (whose operations would bypass the socket filter).
const DENIED_SYSCALLS: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// The fallback sandbox, ready to apply in the child.
#[derive(Debug)]
pub struct Prepared {
    ruleset: Option<RulesetCreated>,
    filter: BpfProgram,
}

/// Builds the Landlock ruleset and the seccomp filter for `plan`: read and
/// execute beneath the system paths and `ro`, everything beneath `rw`,
/// read/write on a few device files; with [`Network::Deny`], no TCP bind or
/// connect (Landlock) and no socket family but `AF_UNIX` (seccomp).
pub fn prepare(plan: &SandboxPlan, ro: &[PathBuf], rw: &[PathBuf]) -> Result<Prepared, String> {
    let abi = LANDLOCK_ABI;
    let ll = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    if plan.network == Network::Deny {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(ll)?;
    }
    // Where the kernel has it (Landlock ABI 6, Linux 6.12): no signals to
    // processes outside the sandbox (plugd itself, other plugins) and no
    // abstract UNIX sockets created outside it. The fallback has no PID
    // namespace, so this is what keeps a plugin from killing its host.
    ruleset = ruleset
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(ll)?;
    let read: Vec<PathBuf> = SYSTEM_RO_PATHS
        .iter()
        .map(PathBuf::from)
        .chain(ro.iter().cloned())
        .collect();
    let created = ruleset
        .create()
        .map_err(ll)?
        .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))
        .map_err(ll)?
        .add_rules(path_beneath_rules(
            DEV_FILES,
            AccessFs::from_file(abi) & !AccessFs::Execute,
        ))
        .map_err(ll)?
        .add_rules(path_beneath_rules(rw, AccessFs::from_all(abi)))
        .map_err(ll)?;
    Ok(Prepared {
        ruleset: Some(created),
        filter: seccomp_filter(plan.network).map_err(|e| format!("seccomp: {e}"))?,
    })
}

fn seccomp_filter(network: Network) -> Result<BpfProgram, seccompiler::Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED_SYSCALLS.iter().map(|&s| (s, Vec::new())).collect();
    if network == Network::Deny {
        let not_unix = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )?;
        rules.insert(libc::SYS_socket, vec![SeccompRule::new(vec![not_unix])?]);
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    filter.try_into().map_err(seccompiler::Error::Backend)
}

impl Prepared {
    /// Restricts the calling (child) process: Landlock first (its syscalls
    /// are not in the filter anyway), then seccomp. Async-signal-safe: no
    /// allocation on the success path.
    pub fn apply(&mut self) -> std::io::Result<()> {
        let Some(ruleset) = self.ruleset.take() else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        match ruleset.restrict_self() {
            // Filesystem and TCP rules are hard requirements (prepare fails
            // without them); only the scopes may be missing on older kernels.
            Ok(status) if status.ruleset != landlock::RulesetStatus::NotEnforced => {}
            _ => return Err(std::io::Error::from_raw_os_error(libc::EPERM)),
        }
        seccompiler::apply_filter(&self.filter)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
    }
}
