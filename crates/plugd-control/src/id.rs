//! Ids of records that several nodes may create at once: a prefix and a UUIDv7.
//!
//! A UUIDv7 is 48 bits of Unix milliseconds followed by 74 bits from the OS
//! random number generator (the `uuid` crate keeps ids of one process
//! ordered within a millisecond by seeding part of them as a counter), so
//! ids sort by creation time and two processes (on one machine or two, with
//! equal pids or not) do not mint the same id. The text form is
//! `PREFIX_` and 32 lower-case hex digits, e.g. `run_0193a4…`.

/// A fresh id `PREFIX_<32 hex digits>` (UUIDv7).
pub fn fresh(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 33);
    out.push_str(prefix);
    out.push('_');
    out.push_str(
        uuid::Uuid::now_v7()
            .simple()
            .encode_lower(&mut uuid::Uuid::encode_buffer()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_hex_time_ordered_and_distinct() {
        let ids: Vec<String> = (0..10_000).map(|_| fresh("run")).collect();
        for id in &ids {
            let hex = id.strip_prefix("run_").expect(id);
            assert_eq!(hex.len(), 32, "{id}");
            assert!(
                hex.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
            // Version 7 sits in the 13th hex digit.
            assert_eq!(&hex[12..13], "7", "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "ids of one process sort by creation");
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
    }

    /// Set in the children of the test below: where they write their ids.
    const CHILD_OUT: &str = "PLUGD_ID_TEST_OUT";

    /// Three processes, each pid 1 in a PID namespace of its own
    /// (`unshare --pid --fork`), mint a million ids each: none collide.
    #[test]
    fn a_million_ids_from_three_processes_with_equal_pids_never_collide() {
        const N: usize = 1_000_000;
        if let Some(out) = std::env::var_os(CHILD_OUT) {
            use std::io::Write as _;
            let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
            writeln!(w, "{}", std::process::id()).unwrap();
            for _ in 0..N {
                writeln!(w, "{}", fresh("inv")).unwrap();
            }
            w.flush().unwrap();
            return;
        }
        let dir = std::env::temp_dir().join(format!("plugd-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        let name = "id::tests::a_million_ids_from_three_processes_with_equal_pids_never_collide";
        let children: Vec<_> = (0..3)
            .map(|i| {
                let out = dir.join(format!("ids-{i}"));
                #[allow(clippy::disallowed_methods)] // a test's own children
                let child = std::process::Command::new("unshare")
                    .args(["--pid", "--fork", "--kill-child"])
                    .arg(&exe)
                    .args([name, "--exact", "--test-threads=1"])
                    .env(CHILD_OUT, &out)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect(
                        "unshare (util-linux) runs the children in PID namespaces of their own",
                    );
                (child, out)
            })
            .collect();
        let mut seen = std::collections::HashSet::with_capacity(3 * N);
        let mut pids = Vec::new();
        for (mut child, out) in children {
            let status = child.wait().unwrap();
            assert!(
                status.success(),
                "a child failed: {status} (is this run as root, as unshare --pid needs?)"
            );
            let text = std::fs::read_to_string(&out).unwrap();
            let mut lines = text.lines();
            pids.push(lines.next().unwrap().to_owned());
            let mut count = 0;
            for id in lines {
                let hex = id.strip_prefix("inv_").unwrap();
                let v = u128::from_str_radix(hex, 16).unwrap();
                assert!(seen.insert(v), "id {id} minted twice");
                count += 1;
            }
            assert_eq!(count, N);
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(pids.iter().all(|p| p == &pids[0]), "pids differ: {pids:?}");
        assert_eq!(seen.len(), 3 * N);
    }
}
