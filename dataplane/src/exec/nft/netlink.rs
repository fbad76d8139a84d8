//! nf_tables over netlink: element updates written as one batch, and the two listings nft
//! makes cost the whole table.
//!
//! Writes: a change of elements only (most endpoint changes) is `DELSETELEM` and
//! `NEWSETELEM` messages in one nfnetlink batch, which the kernel commits as one
//! transaction: no text parsed, no cache of the ruleset fetched (libnftables' run of the
//! same change costs about 1 ms of fixed start-up and ~2.6 KB per element).
//!
//! Reads: nft
//! 1.0.6 fetches every element of a table before it lists any object of it (one chain
//! of one rule beside 125k elements: 3.3 s and 283 MB). Here each is a dump the kernel
//! answers without elements: the rules of one chain (the canary) and the outline of
//! kpx's table (its comment, chains — which of them are empty —, sets and maps; what a
//! full sync starts from). Rules are few (the elements are in maps), so listing them
//! all is cheap.

use std::collections::BTreeSet;

use super::elements::{
    self as encoding, Data, ElementUpdate, Emptied, EncodeError, EncodedData, Layout, Refill, SetElements,
    Values,
};
use super::table::TABLE;
use super::{Outline, RefillWith};
use crate::exec::netlink::{
    attributes, find, read_string, Batch, Message, NetlinkError, Socket, NLM_F_CREATE,
};
use crate::exec::ExecError;

pub(super) const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFPROTO_INET`: kpx's table is of family `inet`.
const NFPROTO_INET: u8 = 1;
const NFNETLINK_V0: u8 = 0;

pub(super) mod msg {
    pub const GET_TABLE: u8 = 1;
    pub const GET_SET_ELEM: u8 = 13;
    pub const GET_GEN: u8 = 16;
    pub const GET_CHAIN: u8 = 4;
    pub const GET_RULE: u8 = 7;
    pub const GET_SET: u8 = 10;
    pub const NEW_SET_ELEM: u8 = 12;
    pub const DEL_SET_ELEM: u8 = 14;
}
/// nfnetlink's batch delimiters (their resource id names the subsystem).
pub(super) mod batch {
    pub const BEGIN: u16 = 16;
    pub const END: u16 = 17;
    /// `NFNL_BATCH_GENID`: the generation a batch was written against (be32); the kernel
    /// refuses the batch with `ERESTART` when nf_tables has moved past it.
    pub const GENID: u16 = 1;
}
/// `NFTA_GEN_ID`, the generation in a `NEWGEN` reply.
const GEN_ID: u16 = 1;
pub(super) mod elements {
    pub const TABLE: u16 = 1;
    pub const SET: u16 = 2;
    pub const LIST: u16 = 3;
    pub const LIST_ELEM: u16 = 1;
    pub const KEY: u16 = 1;
    pub const DATA: u16 = 2;
    pub const DATA_VALUE: u16 = 1;
    pub const DATA_VERDICT: u16 = 2;
    pub const VERDICT_CODE: u16 = 1;
    pub const VERDICT_CHAIN: u16 = 2;
    pub const KEY_ATTR: u16 = 1;
    pub const DATA_ATTR: u16 = 2;
    /// A message's elements stay below this many bytes (the list's length is 16 bits).
    pub const MESSAGE_BYTES: usize = 48 << 10;
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
pub(super) const FACILITY: &str = "nf_tables netlink";

pub(super) fn failed(what: &str, e: NetlinkError) -> ExecError {
    let message = match e {
        NetlinkError::Socket(e) => format!("{what}: socket: {e}"),
        NetlinkError::Kernel(e) => format!("{what}: {e}"),
        NetlinkError::Malformed => format!("{what}: malformed reply from the kernel"),
    };
    ExecError::refused(FACILITY, message)
}

pub(super) fn request(command: u8) -> Message {
    Message::new(NFNL_SUBSYS_NFTABLES << 8 | u16::from(command), [NFPROTO_INET, NFNETLINK_V0, 0, 0])
}

/// kpx's nf_tables netlink client: one socket, opened when first needed and kept (closing
/// a netfilter socket right after a commit waits for the kernel to free the transaction,
/// an RCU grace period: about 10 ms per change), opened again after it failed.
#[derive(Default)]
pub struct NftNetlink {
    socket: Option<Socket>,
}

impl NftNetlink {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the socket; a socket that failed is closed, to be opened again next time.
    fn with_socket<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Socket) -> Result<T, NetlinkError>,
    ) -> Result<T, ExecError> {
        let socket = match &mut self.socket {
            Some(socket) => socket,
            empty => empty.insert(Socket::open(NETLINK_NETFILTER).map_err(|e| failed(what, e))?),
        };
        let result = f(socket);
        if matches!(result, Err(NetlinkError::Socket(_) | NetlinkError::Malformed)) {
            self.socket = None;
        }
        result.map_err(|e| failed(what, e))
    }

    fn dump(&mut self, what: &str, m: Message) -> Result<Vec<Vec<u8>>, ExecError> {
        self.with_socket(what, |s| s.request(m, true))
    }

    /// Empties, then deletes, then adds, the elements of `update` in one transaction.
    pub fn update_elements(&mut self, update: &ElementUpdate) -> Result<(), ExecError> {
        let messages = update_messages(update)?;
        self.with_socket("update elements", |s| {
            s.batch(delimiter(batch::BEGIN), messages, delimiter(batch::END))
        })
    }

    /// [`Self::update_elements`] written against `generation` (see [`Self::batch_at`]):
    /// `Ok(false)`, nothing applied, when nf_tables has moved past it.
    pub fn update_elements_at(&mut self, generation: u32, update: &ElementUpdate) -> Result<bool, ExecError> {
        let messages = update_messages(update)?;
        self.batch_at(generation, messages)
    }

    /// What [`super::Nft::refill`] does, the rules' script run by `run`: `fill`
    /// writes each element into a batch as it comes; the script runs; the batch (empty
    /// `flush`, add the elements) is sent as one transaction.
    pub fn refill(
        &mut self,
        flush: Vec<Emptied>,
        fill: &mut RefillWith<'_>,
        run: impl FnOnce(&str) -> Result<(), ExecError>,
    ) -> Result<bool, ExecError> {
        const WHAT: &str = "refill the sets";
        let socket = match &mut self.socket {
            Some(socket) => socket,
            empty => empty.insert(Socket::open(NETLINK_NETFILTER).map_err(|e| failed(WHAT, e))?),
        };
        let mut writing = socket.begin_batch(delimiter(batch::BEGIN));
        for e in &flush {
            writing.push(self::flush(e), 0);
        }
        let mut refill = BatchRefill { batch: writing, sets: Vec::new() };
        let script = fill(&mut refill).map_err(|e| ExecError::refused(FACILITY, e.to_string()))?;
        let Some(script) = script else { return Ok(false) };
        run(&script)?;
        let result = refill.finish().commit(delimiter(batch::END));
        if matches!(result, Err(NetlinkError::Socket(_) | NetlinkError::Malformed)) {
            self.socket = None;
        }
        result.map_err(|e| failed(WHAT, e)).map(|()| true)
    }

    /// nf_tables' generation now: every committed transaction moves it on by one.
    pub fn generation(&mut self) -> Result<u32, ExecError> {
        const WHAT: &str = "read nf_tables' generation";
        let replies = self.with_socket(WHAT, |s| s.request(request(msg::GET_GEN), false))?;
        replies
            .iter()
            .find_map(|body| find(&attributes(body), GEN_ID)?.get(..4).map(|b| [b[0], b[1], b[2], b[3]]))
            .map(u32::from_be_bytes)
            .ok_or_else(|| failed(WHAT, NetlinkError::Malformed))
    }

    /// Gives every element of set or map `set` of kpx's table to `each` (key, and a map's
    /// data), as the kernel's dump reads them, none kept.
    pub fn each_element(
        &mut self,
        set: &str,
        mut each: impl FnMut(&[u8], HeldData<'_>),
    ) -> Result<(), ExecError> {
        let m = elements_request(set);
        self.with_socket("list a set's elements", |s| {
            s.each_reply(m, true, |body| read_elements(body, &mut each))
        })
    }

    /// The keys of set `set`'s elements; none when it (or kpx's table) does not exist.
    pub fn set_keys(&mut self, set: &str) -> Result<Vec<Vec<u8>>, ExecError> {
        let m = elements_request(set);
        let mut keys = Vec::new();
        self.with_socket("list a set's keys", |s| {
            let read =
                s.each_reply(m, true, |body| read_elements(body, &mut |key, _| keys.push(key.to_vec())));
            match read {
                Err(NetlinkError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                other => other,
            }
        })?;
        Ok(keys)
    }

    /// Sends `messages` as one batch written against `generation`: `Ok(false)`, none
    /// applied, when nf_tables has moved past it (someone else wrote in between).
    pub(super) fn batch_at(
        &mut self,
        generation: u32,
        messages: Vec<(Message, u16)>,
    ) -> Result<bool, ExecError> {
        let mut begin = delimiter(batch::BEGIN);
        begin.put(batch::GENID, &generation.to_be_bytes());
        let sent = self.with_socket("write the elements that differ", |s| {
            match s.batch(begin, messages, delimiter(batch::END)) {
                Err(NetlinkError::Kernel(e)) if e.raw_os_error() == Some(libc::ERESTART) => Ok(false),
                other => other.map(|()| true),
            }
        })?;
        Ok(sent)
    }

    /// How many rules chain `name` of kpx's table holds (0 when it or the table is gone).
    pub fn rules_in_chain(&mut self, name: &str) -> Result<usize, ExecError> {
        const WHAT: &str = "list the rules of a chain";
        let mut m = request(msg::GET_RULE);
        m.string(rule::TABLE, TABLE).string(rule::CHAIN, name);
        let replies = self.dump(WHAT, m)?;
        Ok(of_kpx(&replies, rule::TABLE, rule::CHAIN).filter(|(chain, _)| chain == name).count())
    }

    /// The outline of kpx's table; `None` when there is no such table.
    pub fn outline(&mut self) -> Result<Option<Outline>, ExecError> {
        const WHAT: &str = "list kpx's table";
        let mut m = request(msg::GET_TABLE);
        m.string(table::NAME, TABLE);
        let tables = match self.with_socket(WHAT, |s| match s.request(m, false) {
            Err(NetlinkError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            other => other.map(Some),
        })? {
            Some(replies) => replies,
            None => return Ok(None),
        };
        let mut outline = Outline {
            comment: tables.iter().find_map(|body| comment(find(&attributes(body), table::USERDATA)?)),
            ..Outline::default()
        };
        let chains = self.dump("list chains", request(msg::GET_CHAIN))?;
        outline.chains = of_kpx(&chains, chain::TABLE, chain::NAME).map(|(name, _)| name).collect();
        let mut rules = request(msg::GET_RULE);
        rules.string(rule::TABLE, TABLE);
        let rules = self.dump("list rules", rules)?;
        let with_rules: BTreeSet<String> =
            of_kpx(&rules, rule::TABLE, rule::CHAIN).map(|(chain, _)| chain).collect();
        outline.empty_chains = outline.chains.difference(&with_rules).cloned().collect();
        let sets = self.dump("list sets", request(msg::GET_SET))?;
        for (name, a) in of_kpx(&sets, set::TABLE, set::NAME) {
            let flags = find(&a, set::FLAGS)
                .and_then(|v| v.get(..4))
                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            match flags & (set::MAP | set::ANONYMOUS) {
                0 => outline.sets.insert(name),
                set::MAP => outline.maps.insert(name),
                _ => false,
            };
        }
        Ok(Some(outline))
    }
}

/// The messages of `update`: the sets emptied, the deletions, the additions.
fn update_messages(update: &ElementUpdate) -> Result<Vec<(Message, u16)>, ExecError> {
    let mut messages: Vec<(Message, u16)> = update.flush.iter().map(|e| (flush(e), 0)).collect();
    for s in &update.delete {
        element_messages(&mut messages, msg::DEL_SET_ELEM, 0, s)?;
    }
    for s in &update.add {
        element_messages(&mut messages, msg::NEW_SET_ELEM, NLM_F_CREATE, s)?;
    }
    Ok(messages)
}

/// The dump request of set `set`'s elements.
fn elements_request(set: &str) -> Message {
    let mut m = request(msg::GET_SET_ELEM);
    m.string(elements::TABLE, TABLE).string(elements::SET, set);
    m
}

/// Gives each element of one reply of an element dump to `each`.
fn read_elements(body: &[u8], each: &mut impl FnMut(&[u8], HeldData<'_>)) -> Result<(), NetlinkError> {
    let list = find(&attributes(body), elements::LIST).ok_or(NetlinkError::Malformed)?;
    for (kind, element) in attributes(list) {
        if kind != elements::LIST_ELEM {
            continue;
        }
        let a = attributes(element);
        let key = find(&a, elements::KEY_ATTR)
            .and_then(|k| find(&attributes(k), elements::DATA_VALUE))
            .ok_or(NetlinkError::Malformed)?;
        each(key, HeldData::read(find(&a, elements::DATA_ATTR))?);
    }
    Ok(())
}

/// The message that empties a set or map (DELSETELEM without a list of elements).
fn flush(e: &Emptied) -> Message {
    let mut m = request(msg::DEL_SET_ELEM);
    m.string(elements::TABLE, TABLE).string(elements::SET, &e.set);
    m
}

/// A batch's beginning or end.
pub(super) fn delimiter(kind: u16) -> Message {
    Message::new(kind, [0, NFNETLINK_V0, 0, NFNL_SUBSYS_NFTABLES as u8])
}

/// A message of `command` (NEWSETELEM, DELSETELEM) about elements of `set`, its list open.
pub(super) fn start_elements(command: u8, set: &str) -> Message {
    let mut m = request(command);
    m.string(elements::TABLE, TABLE).string(elements::SET, set).begin(elements::LIST);
    m
}

/// Writes one element into `m`'s open list: its key and, when it is added, its data.
fn write_element(
    m: &mut Message,
    command: u8,
    layout: &Layout,
    key: &Values,
    data: Option<&Data>,
) -> Result<(), String> {
    let key_bytes = encoding::key(layout, key)?;
    let data = if command == msg::NEW_SET_ELEM { encoding::data(layout, data)? } else { None };
    write_encoded(m, key_bytes.as_bytes(), data.as_ref());
    Ok(())
}

/// Writes one element, already encoded, into `m`'s open list.
pub(super) fn write_encoded(m: &mut Message, key: &[u8], data: Option<&EncodedData>) {
    m.begin(elements::LIST_ELEM);
    m.begin(elements::KEY).put(elements::DATA_VALUE, key).end();
    match data {
        None => {}
        Some(EncodedData::Value(v)) => {
            m.begin(elements::DATA).put(elements::DATA_VALUE, v.as_bytes()).end();
        }
        Some(EncodedData::Verdict { code, chain }) => {
            m.begin(elements::DATA).begin(elements::DATA_VERDICT);
            m.put(elements::VERDICT_CODE, &code.to_be_bytes());
            if let Some(chain) = chain {
                m.string(elements::VERDICT_CHAIN, chain);
            }
            m.end().end();
        }
    }
    m.end();
}

/// The messages that delete (`command` DELSETELEM) or add the elements of one set, as
/// many as their size needs.
fn element_messages(
    out: &mut Vec<(Message, u16)>,
    command: u8,
    flags: u16,
    s: &SetElements,
) -> Result<(), ExecError> {
    let mut m = start_elements(command, &s.set);
    let mut holds = 0;
    for (key, data) in &s.elements {
        if m.len() > elements::MESSAGE_BYTES {
            m.end();
            out.push((std::mem::replace(&mut m, start_elements(command, &s.set)), flags));
            holds = 0;
        }
        write_element(&mut m, command, &s.layout, key, *data).map_err(|reason| {
            ExecError::refused(FACILITY, EncodeError::of(&s.set, key, *data, reason).to_string())
        })?;
        holds += 1;
    }
    if holds > 0 {
        m.end();
        out.push((m, flags));
    }
    Ok(())
}

/// A refill written into a batch as it comes: per set, one message open, pushed into the
/// batch once full (and the rest at the end).
struct BatchRefill<'s> {
    batch: Batch<'s>,
    sets: Vec<(String, Layout, Option<Message>)>,
}

impl Refill for BatchRefill<'_> {
    fn set(&mut self, set: String, layout: Layout) -> usize {
        self.sets.push((set, layout, None));
        self.sets.len() - 1
    }

    fn add(&mut self, handle: usize, key: &Values, data: Option<&Data>) -> Result<(), EncodeError> {
        let Some((set, layout, open)) = self.sets.get_mut(handle) else {
            return Err(EncodeError::of(&format!("#{handle}"), key, data, "no such set".into()));
        };
        let m = open.get_or_insert_with(|| start_elements(msg::NEW_SET_ELEM, set));
        write_element(m, msg::NEW_SET_ELEM, layout, key, data)
            .map_err(|reason| EncodeError::of(set, key, data, reason))?;
        if m.len() > elements::MESSAGE_BYTES {
            if let Some(mut full) = open.take() {
                full.end();
                self.batch.push(full, NLM_F_CREATE);
            }
        }
        Ok(())
    }
}

impl<'s> BatchRefill<'s> {
    /// The batch with every set's last message in it.
    fn finish(mut self) -> Batch<'s> {
        for (_, _, open) in &mut self.sets {
            if let Some(mut m) = open.take() {
                m.end();
                self.batch.push(m, NLM_F_CREATE);
            }
        }
        self.batch
    }
}

/// A map element's data as the kernel holds it (a set's: none), borrowed from a dump or
/// from what kpx encoded: the same value either way, so that the two compare (and hash)
/// equal exactly when the bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldData<'a> {
    None,
    Value(&'a [u8]),
    Verdict { code: i32, chain: Option<&'a [u8]> },
}

impl<'a> HeldData<'a> {
    /// The data kpx encoded.
    pub fn of(data: Option<&'a EncodedData<'a>>) -> HeldData<'a> {
        match data {
            None => HeldData::None,
            Some(EncodedData::Value(v)) => HeldData::Value(v.as_bytes()),
            Some(EncodedData::Verdict { code, chain }) => {
                HeldData::Verdict { code: *code, chain: chain.map(str::as_bytes) }
            }
        }
    }

    /// An element's `NFTA_SET_ELEM_DATA` nest, as dumped.
    fn read(nest: Option<&'a [u8]>) -> Result<HeldData<'a>, NetlinkError> {
        let Some(nest) = nest else { return Ok(HeldData::None) };
        let a = attributes(nest);
        if let Some(v) = find(&a, elements::DATA_VALUE) {
            return Ok(HeldData::Value(v));
        }
        let verdict = attributes(find(&a, elements::DATA_VERDICT).ok_or(NetlinkError::Malformed)?);
        let code = find(&verdict, elements::VERDICT_CODE)
            .and_then(|b| b.get(..4))
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(NetlinkError::Malformed)?;
        let chain = find(&verdict, elements::VERDICT_CHAIN)
            .map(|c| &c[..c.iter().position(|b| *b == 0).unwrap_or(c.len())]);
        Ok(HeldData::Verdict { code, chain })
    }
}

/// The objects of kpx's table among a dump's `replies`, each with its name and attributes
/// (the kernel filters some dumps by table, not all; each reply says whose it is).
fn of_kpx(
    replies: &[Vec<u8>],
    table_attr: u16,
    name_attr: u16,
) -> impl Iterator<Item = (String, Vec<(u16, &[u8])>)> {
    replies.iter().filter_map(move |body| {
        let a = attributes(body);
        if read_string(find(&a, table_attr)).as_deref() != Some(TABLE) {
            return None;
        }
        Some((read_string(find(&a, name_attr))?, a))
    })
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
