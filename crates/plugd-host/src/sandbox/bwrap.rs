//! The bubblewrap command line of seed 000 §2.2.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Network, SYSTEM_RO_PATHS, SandboxPlan};

/// What [`argv`] wraps.
#[derive(Debug)]
pub struct Wrapped<'a> {
    /// The plan.
    pub plan: &'a SandboxPlan,
    /// The environment the plugin gets (allowlist + host + manifest).
    pub env: &'a [(OsString, OsString)],
    /// Canonical read-only binds (plugin dir, program dir, read paths),
    /// already checked against the denylist.
    pub ro: &'a [PathBuf],
    /// Canonical read-write binds, already checked.
    pub rw: &'a [PathBuf],
    /// Working directory inside the sandbox.
    pub cwd: &'a Path,
    /// The program (a path visible inside the sandbox) and its arguments.
    pub program: &'a Path,
    /// Arguments.
    pub args: &'a [String],
    /// With [`Network::Proxy`]: the bridge binary and the proxy's socket,
    /// both outside the sandbox.
    pub egress: Option<Egress<'a>>,
}

/// The two host files a sandbox with egress through plugd's proxy binds.
#[derive(Debug, Clone, Copy)]
pub struct Egress<'a> {
    /// plugd's binary, which runs the bridge ([`super::egress::bridge`]).
    pub bridge: &'a Path,
    /// The proxy's Unix socket for this start.
    pub socket: &'a Path,
}

/// bwrap's arguments (everything after `bwrap`), in the seed's order:
/// process hardening, cleared environment plus the allowlist, capabilities,
/// user, network, the filesystem skeleton, system paths, the plugin's binds,
/// then `-- program args`.
pub fn argv(w: &Wrapped<'_>) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
    push(&[
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-ipc",
        "--new-session",
        "--clearenv",
    ]);
    for (k, v) in w.env {
        a.push("--setenv".into());
        a.push(k.clone());
        a.push(v.clone());
    }
    let egress = w.egress.filter(|_| w.plan.network == Network::Proxy);
    if egress.is_some() {
        for (k, v) in super::egress::proxy_env() {
            a.push("--setenv".into());
            a.push(k.into());
            a.push(v.into());
        }
    }
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
    push(&["--cap-drop", "ALL"]);
    if w.plan.drop_user {
        push(&["--unshare-user", "--uid", "65534", "--gid", "65534"]);
    }
    // Proxy without its two files is a sandbox without network.
    if w.plan.network != Network::Host {
        push(&["--unshare-net"]);
    }
    push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    for p in SYSTEM_RO_PATHS {
        push(&["--ro-bind-try", p, p]);
    }
    let mut bind = |flag: &str, p: &Path| {
        a.push(flag.into());
        a.push(p.into());
        a.push(p.into());
    };
    for p in w.ro {
        bind("--ro-bind", p);
    }
    for p in w.rw {
        bind("--bind", p);
    }
    if let Some(e) = egress {
        // plugd's own binary and socket, not paths of the plugin or the
        // operator: outside the denylist's concern, read-only and a socket.
        a.push("--ro-bind".into());
        a.push(e.bridge.into());
        a.push(super::egress::BRIDGE_IN_SANDBOX.into());
        a.push("--bind".into());
        a.push(e.socket.into());
        a.push(super::egress::SOCKET_IN_SANDBOX.into());
    }
    if w.plan.hide_cwd {
        // An empty directory to start in, not the host's.
        a.push("--dir".into());
        a.push(w.cwd.into());
    }
    a.push("--chdir".into());
    a.push(w.cwd.into());
    a.push("--".into());
    if egress.is_some() {
        a.push(super::egress::BRIDGE_IN_SANDBOX.into());
        a.push(super::egress::BRIDGE_SUBCOMMAND.into());
        a.push(super::egress::BRIDGE_PORT.to_string().into());
        a.push(super::egress::SOCKET_IN_SANDBOX.into());
        a.push("--".into());
    }
    a.push(w.program.into());
    a.extend(w.args.iter().map(OsString::from));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_follows_the_seed() {
        let plan = SandboxPlan {
            drop_user: true,
            ..SandboxPlan::default()
        };
        let env = vec![(OsString::from("PATH"), OsString::from("/usr/bin"))];
        let ro = vec![PathBuf::from("/ws/.plugins/p")];
        let rw = vec![PathBuf::from("/ws/.plugd/state/p")];
        let args = vec!["main.py".to_owned()];
        let got = argv(&Wrapped {
            plan: &plan,
            env: &env,
            ro: &ro,
            rw: &rw,
            cwd: Path::new("/ws/.plugins/p"),
            program: Path::new("/usr/bin/python3"),
            args: &args,
            egress: None,
        });
        let got: Vec<String> = got
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            got.join(" "),
            "--die-with-parent --unshare-pid --unshare-uts --unshare-ipc --new-session \
             --clearenv --setenv PATH /usr/bin --cap-drop ALL \
             --unshare-user --uid 65534 --gid 65534 --unshare-net \
             --proc /proc --dev /dev --tmpfs /tmp \
             --ro-bind-try /usr /usr --ro-bind-try /bin /bin --ro-bind-try /sbin /sbin \
             --ro-bind-try /lib /lib --ro-bind-try /lib64 /lib64 --ro-bind-try /etc/ssl /etc/ssl \
             --ro-bind /ws/.plugins/p /ws/.plugins/p --bind /ws/.plugd/state/p /ws/.plugd/state/p \
             --chdir /ws/.plugins/p -- /usr/bin/python3 main.py"
        );
    }

    #[test]
    fn egress_through_the_proxy_runs_the_bridge_first() {
        let plan = SandboxPlan {
            network: Network::Proxy,
            ..SandboxPlan::default()
        };
        let args = vec!["main.py".to_owned()];
        let got = argv(&Wrapped {
            plan: &plan,
            env: &[],
            ro: &[],
            rw: &[],
            cwd: Path::new("/p"),
            program: Path::new("/usr/bin/python3"),
            args: &args,
            egress: Some(Egress {
                bridge: Path::new("/opt/plugd"),
                socket: Path::new("/ws/.plugd/egress/p.sock"),
            }),
        });
        let got: Vec<String> = got
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let line = got.join(" ");
        assert!(
            line.contains("--setenv HTTPS_PROXY http://127.0.0.1:3128"),
            "{line}"
        );
        assert!(line.contains("--setenv NO_PROXY  "), "{line}");
        assert!(line.contains("--unshare-net"), "{line}");
        assert!(
            line.contains("--ro-bind /opt/plugd /run/plugd/egress-bridge --bind /ws/.plugd/egress/p.sock /run/plugd/egress.sock"),
            "{line}"
        );
        assert!(
            line.ends_with("-- /run/plugd/egress-bridge __egress-bridge 3128 /run/plugd/egress.sock -- /usr/bin/python3 main.py"),
            "{line}"
        );
        // Proxy without the bridge is no network at all.
        let got = argv(&Wrapped {
            egress: None,
            plan: &plan,
            env: &[],
            ro: &[],
            rw: &[],
            cwd: Path::new("/p"),
            program: Path::new("/usr/bin/python3"),
            args: &args,
        });
        assert!(got.iter().any(|a| a == "--unshare-net"));
        assert!(!got.iter().any(|a| a == "HTTPS_PROXY"));
    }

    #[test]
    fn a_hidden_cwd_is_an_empty_directory() {
        let plan = SandboxPlan {
            hide_cwd: true,
            ..SandboxPlan::default()
        };
        let got = argv(&Wrapped {
            plan: &plan,
            env: &[],
            ro: &[],
            rw: &[],
            cwd: Path::new("/ws"),
            program: Path::new("/usr/bin/node"),
            args: &[],
            egress: None,
        });
        let got: Vec<String> = got
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert!(
            got.join(" ")
                .ends_with("--dir /ws --chdir /ws -- /usr/bin/node")
        );
        assert!(!got.iter().any(|a| a == "--ro-bind"));
    }
}
