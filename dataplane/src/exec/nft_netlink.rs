//! nf_tables read over netlink, for the two listings nft makes cost the whole table: nft
//! 1.0.6 fetches every element of a table before it lists any object of it (one chain
//! of one rule beside 125k elements: 3.3 s and 283 MB). Here each is a dump the kernel
//! answers without elements: the rules of one chain (the canary) and the outline of
//! kpx's table (its comment, chains — which of them are empty —, sets and maps; what a
//! full sync starts from). Rules are few (the elements are in maps), so listing them
//! all is cheap.

use std::collections::BTreeSet;

use super::netlink::{attributes, find, read_string, Message, NetlinkError, Socket};
use super::nft::{Outline, TABLE};
use super::ExecError;

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFPROTO_INET`: kpx's table is of family `inet`.
const NFPROTO_INET: u8 = 1;
const NFNETLINK_V0: u8 = 0;

mod msg {
    pub const GET_TABLE: u8 = 1;
    pub const GET_CHAIN: u8 = 4;
    pub const GET_RULE: u8 = 7;
    pub const GET_SET: u8 = 10;
}
mod table {
    pub const NAME: u16 = 1;
    pub const USERDATA: u16 = 6;
}
mod chain {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 3;
}
mod rule {
    pub const TABLE: u16 = 1;
    pub const CHAIN: u16 = 2;
}
mod set {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 2;
    pub const FLAGS: u16 = 3;
    pub const ANONYMOUS: u32 = 0x1;
    pub const MAP: u32 = 0x8;
}
/// The type of a table's comment in its user data (nft's TLVs: type, length, value).
const UDATA_TABLE_COMMENT: u8 = 0;

/// Named in errors (a kernel interface, not a program the image must hold).
const FACILITY: &str = "nf_tables netlink";

fn failed(what: &str, e: NetlinkError) -> ExecError {
    let message = match e {
        NetlinkError::Socket(e) => format!("{what}: socket: {e}"),
        NetlinkError::Kernel(e) => format!("{what}: {e}"),
        NetlinkError::Malformed => format!("{what}: malformed reply from the kernel"),
    };
    ExecError::refused(FACILITY, message)
}

fn request(command: u8) -> Message {
    Message::new(NFNL_SUBSYS_NFTABLES << 8 | u16::from(command), [NFPROTO_INET, NFNETLINK_V0, 0, 0])
}

fn dump(what: &str, m: Message) -> Result<Vec<Vec<u8>>, ExecError> {
    let mut socket = Socket::open(NETLINK_NETFILTER).map_err(|e| failed(what, e))?;
    socket.request(m, true).map_err(|e| failed(what, e))
}

/// How many rules chain `name` of kpx's table holds (0 when it or the table is gone).
pub fn rules_in_chain(name: &str) -> Result<usize, ExecError> {
    let mut m = request(msg::GET_RULE);
    m.string(rule::TABLE, TABLE).string(rule::CHAIN, name);
    Ok(rule_chains(dump("list the rules of a chain", m)?).filter(|chain| chain == name).count())
}

/// The chain of each rule of kpx's table among `replies` (the kernel filters a dump by
/// the table and chain asked for; a rule counts only where it says so).
fn rule_chains(replies: Vec<Vec<u8>>) -> impl Iterator<Item = String> {
    replies.into_iter().filter_map(|body| {
        let a = attributes(&body);
        (read_string(find(&a, rule::TABLE)).as_deref() == Some(TABLE))
            .then(|| read_string(find(&a, rule::CHAIN)))
            .flatten()
    })
}

/// The outline of kpx's table; `None` when there is no such table.
pub fn outline() -> Result<Option<Outline>, ExecError> {
    let mut m = request(msg::GET_TABLE);
    m.string(table::NAME, TABLE);
    let mut socket = Socket::open(NETLINK_NETFILTER).map_err(|e| failed("list kpx's table", e))?;
    let tables = match socket.request(m, false) {
        Ok(replies) => replies,
        Err(NetlinkError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(failed("list kpx's table", e)),
    };
    let mut outline = Outline {
        comment: tables.iter().find_map(|body| comment(find(&attributes(body), table::USERDATA)?)),
        ..Outline::default()
    };
    outline.chains =
        names(dump("list chains", request(msg::GET_CHAIN))?, chain::TABLE, chain::NAME, |_| true);
    let mut rules = request(msg::GET_RULE);
    rules.string(rule::TABLE, TABLE);
    let with_rules: BTreeSet<String> = rule_chains(dump("list rules", rules)?).collect();
    outline.empty_chains = outline.chains.difference(&with_rules).cloned().collect();
    let sets = dump("list sets", request(msg::GET_SET))?;
    let flags = |a: &[(u16, &[u8])]| {
        find(a, set::FLAGS)
            .and_then(|v| v.get(..4))
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    outline.sets =
        names(sets.clone(), set::TABLE, set::NAME, |a| flags(a) & (set::MAP | set::ANONYMOUS) == 0);
    outline.maps = names(sets, set::TABLE, set::NAME, |a| flags(a) & (set::MAP | set::ANONYMOUS) == set::MAP);
    Ok(Some(outline))
}

/// The names of the objects of kpx's table among `replies` that `keep`.
fn names(
    replies: Vec<Vec<u8>>,
    table_attr: u16,
    name_attr: u16,
    keep: impl Fn(&[(u16, &[u8])]) -> bool,
) -> BTreeSet<String> {
    replies
        .iter()
        .filter_map(|body| {
            let a = attributes(body);
            (read_string(find(&a, table_attr)).as_deref() == Some(TABLE) && keep(&a))
                .then(|| read_string(find(&a, name_attr)))
                .flatten()
        })
        .collect()
}

/// The comment among a table's user data (type, length, value; the value NUL-terminated).
fn comment(mut data: &[u8]) -> Option<String> {
    while let [kind, len, rest @ ..] = data {
        let len = usize::from(*len);
        let value = rest.get(..len)?;
        if *kind == UDATA_TABLE_COMMENT {
            return read_string(Some(value));
        }
        data = &rest[len..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::netlink::{HEADERS, NLM_F_DUMP};

    #[test]
    fn a_rule_dump_is_asked_for_one_chain_of_kpxs_inet_table() {
        let mut m = request(msg::GET_RULE);
        m.string(rule::TABLE, TABLE).string(rule::CHAIN, "canary");
        let bytes = m.finish(NLM_F_DUMP, 1);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 10 << 8 | 7, "nftables' GETRULE");
        assert_eq!(bytes[16], NFPROTO_INET);
        let a = attributes(&bytes[HEADERS..]);
        assert_eq!(read_string(find(&a, rule::TABLE)).as_deref(), Some("kpx"));
        assert_eq!(find(&a, rule::CHAIN), Some(&b"canary\0"[..]));
    }

    #[test]
    fn a_tables_comment_is_read_from_its_user_data() {
        let mut data = vec![7, 2, 0xaa, 0xbb];
        data.extend_from_slice(&[UDATA_TABLE_COMMENT, 4]);
        data.extend_from_slice(b"kpx\0");
        assert_eq!(comment(&data).as_deref(), Some("kpx"));
        assert_eq!(comment(&[UDATA_TABLE_COMMENT, 9, b'x']), None, "a length beyond the data");
        assert_eq!(comment(&[]), None);
    }
}
