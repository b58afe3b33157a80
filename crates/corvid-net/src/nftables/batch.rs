//! Building a batch: every change of one transaction (tables, chains, sets, elements,
//! rules with their comments), as nf_tables messages.

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, Expressions, Hook, HookNumber, InetHookNumber,
    ListAttribute, NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute,
    SetElementList, SetElementMessage, SetFlags, SetMessage, TableAttribute, TableFlags,
    TableMessage,
};
use netlink_packet_netfilter::NetfilterProtoFamily;

use super::*;

/// nftables' comment TLV in user data (the type `nft` reads back as `comment`).
pub(super) fn comment_udata(comment: &str) -> Vec<u8> {
    let text = &comment.as_bytes()[..comment.len().min(254)];
    let mut out = vec![0, text.len() as u8 + 1];
    out.extend_from_slice(text);
    out.push(0);
    out
}

pub(super) fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if kind == 0 {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &rest[2 + len..];
    }
    None
}

/// Changes, committed together by [`Nftables::commit`]; each goes to the table chosen
/// last with [`Batch::in_table`], corvid's own unless another was chosen.
#[derive(Debug)]
pub struct Batch {
    pub(super) messages: Vec<(NfTablesMessage, u16, String, NetfilterProtoFamily)>,
    table: TableRef,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            messages: Vec::new(),
            table: TableRef::CORVID,
        }
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Sends what follows to `table`.
    pub fn in_table(&mut self, table: TableRef) {
        self.table = table;
    }

    /// True when nothing was asked.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn push(&mut self, message: NfTablesMessage, flags: u16, what: String) {
        self.messages
            .push((message, flags, what, self.table.family));
    }

    /// Creates corvid's table unless it exists.
    pub fn add_table(&mut self) {
        self.push(
            NfTablesMessage::NewTable(TableMessage {
                attributes: vec![
                    TableAttribute::Name(self.table.name.into()),
                    TableAttribute::Flags(TableFlags::empty()),
                ],
            }),
            NLM_F_CREATE,
            format!("create table {}", self.table.name),
        );
    }

    /// Creates a chain unless it exists; a base chain's policy is accept.
    pub fn add_chain(&mut self, name: &str, base: Option<BaseChain>) {
        let mut attributes = vec![
            ChainAttribute::Table(self.table.name.into()),
            ChainAttribute::Name(name.into()),
        ];
        if let Some(base) = base {
            let hook = match base.hook {
                HookPoint::Prerouting => InetHookNumber::PreRouting,
                HookPoint::Input => InetHookNumber::LocalIn,
                HookPoint::Forward => InetHookNumber::Forward,
                HookPoint::Output => InetHookNumber::LocalOut,
                HookPoint::Postrouting => InetHookNumber::PostRouting,
            };
            attributes.extend([
                ChainAttribute::Hook(vec![
                    Hook::Number(HookNumber::Inet(hook)),
                    Hook::Priority(base.priority as u32),
                ]),
                ChainAttribute::Policy(1),
                ChainAttribute::Type(
                    match base.kind {
                        ChainType::Filter => "filter",
                        ChainType::Nat => "nat",
                    }
                    .into(),
                ),
            ]);
        }
        self.push(
            NfTablesMessage::NewChain(ChainMessage { attributes }),
            NLM_F_CREATE,
            format!("create chain {name}"),
        );
    }

    /// Removes every rule of a chain (which must exist).
    pub fn flush_chain(&mut self, name: &str) {
        self.push(
            NfTablesMessage::DeleteRule(RuleMessage {
                attributes: vec![
                    RuleAttribute::Table(self.table.name.into()),
                    RuleAttribute::Chain(name.into()),
                ],
            }),
            0,
            format!("flush chain {name}"),
        );
    }

    /// Appends a rule to a chain.
    pub fn add_rule(&mut self, chain: &str, expressions: Vec<Expressions>, comment: Option<&str>) {
        let what = format!("add a rule to chain {chain}");
        self.rule(
            chain,
            expressions,
            comment,
            NLM_F_CREATE | NLM_F_APPEND,
            what,
        );
    }

    /// Puts a rule at the head of a chain.
    pub fn insert_rule(
        &mut self,
        chain: &str,
        expressions: Vec<Expressions>,
        comment: Option<&str>,
    ) {
        let what = format!("insert a rule in chain {chain}");
        self.rule(chain, expressions, comment, NLM_F_CREATE, what);
    }

    fn rule(
        &mut self,
        chain: &str,
        expressions: Vec<Expressions>,
        comment: Option<&str>,
        flags: u16,
        what: String,
    ) {
        let mut attributes = vec![
            RuleAttribute::Table(self.table.name.into()),
            RuleAttribute::Chain(chain.into()),
            RuleAttribute::Expressions(expressions.into_iter().map(Into::into).collect()),
        ];
        if let Some(c) = comment {
            attributes.push(RuleAttribute::UserData(comment_udata(c)));
        }
        self.push(
            NfTablesMessage::NewRule(RuleMessage { attributes }),
            flags,
            what,
        );
    }

    /// Removes one rule, by the handle the kernel gave it.
    pub fn delete_rule(&mut self, chain: &str, handle: u64) {
        self.push(
            NfTablesMessage::DeleteRule(RuleMessage {
                attributes: vec![
                    RuleAttribute::Table(self.table.name.into()),
                    RuleAttribute::Chain(chain.into()),
                    RuleAttribute::Handle(handle),
                ],
            }),
            0,
            format!("delete rule {handle} of chain {chain}"),
        );
    }

    /// Creates a set or map unless it exists.
    pub fn add_set(&mut self, set: &SetSpec) {
        let mut flags = SetFlags::empty();
        if set.interval {
            flags |= SetFlags::Interval;
        }
        let mut attributes = vec![
            SetAttribute::Table(self.table.name.into()),
            SetAttribute::Name(set.name.into()),
            SetAttribute::KeyType(set.key.id),
            SetAttribute::KeyLen(set.key.len),
            SetAttribute::Id(1),
        ];
        if let Some(data) = set.data {
            flags |= SetFlags::Map;
            attributes.push(SetAttribute::DataType(data.id));
            attributes.push(SetAttribute::DataLen(data.len));
        }
        if set.key == DataType::IFNAME {
            // nft reads a plain key as big-endian unless told, and prints a name
            // read that way as "" (NFTNL_UDATA_SET_KEYBYTEORDER: BYTEORDER_HOST_ENDIAN).
            let mut udata = vec![0, 4];
            udata.extend(1u32.to_ne_bytes());
            attributes.push(SetAttribute::UserData(udata));
        }
        if let Some(timeout) = set.timeout {
            flags |= SetFlags::Timeout | SetFlags::Eval;
            attributes.push(SetAttribute::Timeout(timeout.as_millis() as u64));
        }
        attributes.push(SetAttribute::Flags(flags));
        self.push(
            NfTablesMessage::NewSet(SetMessage { attributes }),
            NLM_F_CREATE,
            format!("create set {}", set.name),
        );
    }

    /// Adds an element (a key, and a value for a map) with a comment; an identical
    /// element already there is no error.
    pub fn add_element(&mut self, set: &str, key: &[u8], value: Option<Vec<u8>>, comment: &str) {
        let mut element = vec![
            SetElementAttribute::Key(DataAttribute::Value(key.to_vec())),
            SetElementAttribute::UserData(comment_udata(comment)),
        ];
        if let Some(value) = value {
            element.push(SetElementAttribute::Data(DataAttribute::Value(value)));
        }
        self.push(
            NfTablesMessage::NewSetElement(element_message(self.table.name, set, element)),
            NLM_F_CREATE,
            format!("add an element to {set}"),
        );
    }

    /// Adds an element of a verdict map that jumps to `chain`.
    pub fn add_jump_element(&mut self, set: &str, key: &[u8], chain: &str) {
        let element = vec![
            SetElementAttribute::Key(DataAttribute::Value(key.to_vec())),
            SetElementAttribute::Data(DataAttribute::Verdict(
                expr::Verdict::Jump(chain).attributes(),
            )),
        ];
        self.push(
            NfTablesMessage::NewSetElement(element_message(self.table.name, set, element)),
            NLM_F_CREATE,
            format!("add an element to {set}"),
        );
    }

    /// Removes every element of a set (which must exist).
    pub fn flush_set(&mut self, set: &str) {
        self.push(
            NfTablesMessage::DeleteSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(self.table.name.into()),
                    SetElementList::Set(set.into()),
                ],
            }),
            0,
            format!("flush set {set}"),
        );
    }

    /// Deletes a set (which must exist, and which no rule may use).
    pub fn delete_set(&mut self, set: &str) {
        self.push(
            NfTablesMessage::DeleteSet(SetMessage {
                attributes: vec![
                    SetAttribute::Table(self.table.name.into()),
                    SetAttribute::Name(set.into()),
                ],
            }),
            0,
            format!("delete set {set}"),
        );
    }

    /// Deletes a chain (which must exist, be empty, and be jumped to by nothing).
    pub fn delete_chain(&mut self, name: &str) {
        self.push(
            NfTablesMessage::DeleteChain(ChainMessage {
                attributes: vec![
                    ChainAttribute::Table(self.table.name.into()),
                    ChainAttribute::Name(name.into()),
                ],
            }),
            0,
            format!("delete chain {name}"),
        );
    }

    /// Deletes the table the batch is in (with whatever it still holds).
    pub fn delete_table(&mut self) {
        self.push(
            NfTablesMessage::DeleteTable(TableMessage {
                attributes: vec![TableAttribute::Name(self.table.name.into())],
            }),
            0,
            format!("delete table {}", self.table.name),
        );
    }

    /// Removes an element (which must exist).
    pub fn delete_element(&mut self, set: &str, key: &[u8]) {
        self.push(
            NfTablesMessage::DeleteSetElement(element_message(
                self.table.name,
                set,
                vec![SetElementAttribute::Key(DataAttribute::Value(key.to_vec()))],
            )),
            0,
            format!("remove an element from {set}"),
        );
    }
}

pub(super) fn element_message(
    table: &str,
    set: &str,
    element: Vec<SetElementAttribute>,
) -> SetElementMessage {
    SetElementMessage {
        attributes: vec![
            SetElementList::Table(table.into()),
            SetElementList::Set(set.into()),
            SetElementList::Elements(vec![ListAttribute::Element(element)]),
        ],
    }
}
