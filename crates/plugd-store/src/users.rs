//! Local users by uid: the name records carry as who did something
//! (`approved_by`, `created_by`) when a socket peer or the CLI acts.

/// The user name of `uid` from `/etc/passwd`, else `uid N`.
pub fn user_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id = f.nth(1)?;
                (id.parse::<u32>().ok()? == uid).then(|| name.to_owned())
            })
        })
        .unwrap_or_else(|| format!("uid {uid}"))
}
