//! Delta ADS responses as bytes on the wire, assembled from shared pieces.
//!
//! Every resource is encoded once per snapshot, already in the shape it takes inside a
//! `DeltaDiscoveryResponse` (field 2, an Envoy `Resource` wrapping an `Any`): its
//! [`ResourceEntry`]. A response is a small head (the gRPC message prefix, `type_url`,
//! `nonce`, `removed_resources`) followed by the entries, gathered into pieces of about
//! [`PIECE_BYTES`] (a large entry goes as it is), each made only when HTTP/2 asks for
//! the next ([`Pieces`]). Nothing is encoded per stream, a response waiting to be written
//! holds pointers to the shared entries rather than a copy, and no stream keeps a buffer
//! sized by the largest response it ever sent: each piece is freed once HTTP/2 has
//! written it. (One piece per entry would queue hundreds of frames per
//! stream in h2, whose frame slab never shrinks.)

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

/// About how many bytes of a response go to HTTP/2 at once.
pub const PIECE_BYTES: usize = 64 << 10;

/// Field numbers of `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
mod response_field {
    pub const RESOURCES: u32 = 2;
    pub const TYPE_URL: u32 = 4;
    pub const NONCE: u32 = 5;
    pub const REMOVED_RESOURCES: u32 = 6;
}

/// Field numbers of `envoy.service.discovery.v3.Resource` and `google.protobuf.Any`.
mod resource_field {
    pub const VERSION: u32 = 1;
    pub const RESOURCE: u32 = 2;
    pub const NAME: u32 = 3;
    pub const ANY_TYPE_URL: u32 = 1;
    pub const ANY_VALUE: u32 = 2;
}

fn bytes_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_bytes_field(buf: &mut BytesMut, tag: u32, value: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value);
}

/// One resource encoded as a `DeltaDiscoveryResponse.resources` element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceEntry {
    bytes: Bytes,
    body_at: usize,
}

impl ResourceEntry {
    pub fn new(name: &str, version: &str, type_url: &str, body: &[u8]) -> Self {
        let any_len = bytes_field_len(resource_field::ANY_TYPE_URL, type_url.len())
            + bytes_field_len(resource_field::ANY_VALUE, body.len());
        let resource_len = bytes_field_len(resource_field::VERSION, version.len())
            + bytes_field_len(resource_field::NAME, name.len())
            + bytes_field_len(resource_field::RESOURCE, any_len);
        let mut buf = BytesMut::with_capacity(bytes_field_len(response_field::RESOURCES, resource_len));
        encode_key(response_field::RESOURCES, WireType::LengthDelimited, &mut buf);
        encode_varint(resource_len as u64, &mut buf);
        put_bytes_field(&mut buf, resource_field::VERSION, version.as_bytes());
        put_bytes_field(&mut buf, resource_field::NAME, name.as_bytes());
        encode_key(resource_field::RESOURCE, WireType::LengthDelimited, &mut buf);
        encode_varint(any_len as u64, &mut buf);
        put_bytes_field(&mut buf, resource_field::ANY_TYPE_URL, type_url.as_bytes());
        encode_key(resource_field::ANY_VALUE, WireType::LengthDelimited, &mut buf);
        encode_varint(body.len() as u64, &mut buf);
        let body_at = buf.len();
        buf.put_slice(body);
        ResourceEntry { bytes: buf.freeze(), body_at }
    }

    /// The resource's own encoding (the `Any`'s value).
    pub fn body(&self) -> &[u8] {
        &self.bytes[self.body_at..]
    }

    fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// Something that carries a [`ResourceEntry`] (a snapshot's resource).
pub trait HasEntry {
    fn name(&self) -> &str;
    fn entry(&self) -> &ResourceEntry;
}

/// One `DeltaDiscoveryResponse`, as the resources it carries (a list the stream that sent
/// it keeps too, until the node answers).
#[derive(Debug)]
pub struct Outgoing<R> {
    pub type_url: &'static str,
    pub resources: Arc<[Arc<R>]>,
    pub removed: Vec<String>,
    pub nonce: String,
}

impl<R: HasEntry> Outgoing<R> {
    /// The gRPC message (length prefix included) as pieces to send in order: a head, then
    /// each resource's shared entry, copied into a piece only when that piece is asked for.
    pub fn into_pieces(self) -> Pieces<R> {
        let mut head_len = bytes_field_len(response_field::TYPE_URL, self.type_url.len())
            + bytes_field_len(response_field::NONCE, self.nonce.len());
        head_len += self
            .removed
            .iter()
            .map(|name| bytes_field_len(response_field::REMOVED_RESOURCES, name.len()))
            .sum::<usize>();
        let entries_len: usize = self.resources.iter().map(|r| r.entry().bytes().len()).sum();
        let message_len = head_len + entries_len;
        let mut head =
            BytesMut::with_capacity((5 + head_len + entries_len).min(PIECE_BYTES.max(5 + head_len)));
        head.put_u8(0); // not compressed
        head.put_u32(u32::try_from(message_len).unwrap_or(u32::MAX));
        put_bytes_field(&mut head, response_field::TYPE_URL, self.type_url.as_bytes());
        put_bytes_field(&mut head, response_field::NONCE, self.nonce.as_bytes());
        for name in &self.removed {
            put_bytes_field(&mut head, response_field::REMOVED_RESOURCES, name.as_bytes());
        }
        Pieces { head: Some(head), resources: self.resources, next: 0, left: entries_len }
    }

    /// Every piece at once.
    #[cfg(test)]
    pub fn frames(&self) -> Vec<Bytes> {
        let copy = Outgoing {
            type_url: self.type_url,
            resources: Arc::clone(&self.resources),
            removed: self.removed.clone(),
            nonce: self.nonce.clone(),
        };
        copy.into_pieces().collect()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.resources.iter().map(|r| r.name())
    }
}

/// A response's pieces of about [`PIECE_BYTES`], made one at a time: a response waiting
/// for HTTP/2 holds pointers to its shared entries, not a copy of them.
pub struct Pieces<R> {
    head: Option<BytesMut>,
    resources: Arc<[Arc<R>]>,
    /// The first resource not yet in a piece.
    next: usize,
    /// Bytes of the entries not yet in a piece.
    left: usize,
}

impl<R> Pieces<R> {
    /// Whether every piece has been taken.
    pub fn is_done(&self) -> bool {
        self.head.is_none() && self.next == self.resources.len()
    }
}

impl<R: HasEntry> Iterator for Pieces<R> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let mut piece = self.head.take().unwrap_or_default();
        while let Some(r) = self.resources.get(self.next) {
            let entry = r.entry().bytes();
            if entry.len() >= PIECE_BYTES {
                // A large entry goes as it is, in a piece of its own.
                if !piece.is_empty() {
                    break;
                }
                self.next += 1;
                self.left -= entry.len();
                return Some(entry.clone());
            }
            if piece.len() + entry.len() > PIECE_BYTES {
                break;
            }
            if piece.capacity() == 0 {
                piece.reserve(PIECE_BYTES.min(self.left));
            }
            piece.put_slice(entry);
            self.left -= entry.len();
            self.next += 1;
        }
        (!piece.is_empty()).then(|| piece.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
    use envoy_types::pb::google::protobuf::Any;
    use prost::Message;

    struct Named(String, ResourceEntry);

    impl HasEntry for Named {
        fn name(&self) -> &str {
            &self.0
        }
        fn entry(&self) -> &ResourceEntry {
            &self.1
        }
    }

    fn named(name: &str, version: &str, body: &[u8]) -> Arc<Named> {
        Arc::new(Named(name.into(), ResourceEntry::new(name, version, "type.googleapis.com/kpx.v1.X", body)))
    }

    #[test]
    fn frames_decode_as_the_response_prost_would_send() {
        let big = vec![7u8; 300];
        let out = Outgoing {
            type_url: "type.googleapis.com/kpx.v1.X",
            resources: vec![
                named("c/ns/a", "v1", b"\x08\x01"),
                named("c/ns/b", "v2", &big),
                named("e", "", b""),
            ]
            .into(),
            removed: vec!["c/ns/gone".into(), "c/ns/gone2".into()],
            nonce: "42".into(),
        };
        let wire: Vec<u8> = out.frames().iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(wire[0], 0, "uncompressed");
        let len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
        assert_eq!(len, wire.len() - 5);
        let decoded = DeltaDiscoveryResponse::decode(&wire[5..]).expect("a valid DeltaDiscoveryResponse");
        let resource = |name: &str, version: &str, body: &[u8]| Resource {
            name: name.into(),
            version: version.into(),
            resource: Some(Any { type_url: out.type_url.into(), value: body.to_vec() }),
            ..Default::default()
        };
        let expected = DeltaDiscoveryResponse {
            type_url: out.type_url.into(),
            nonce: "42".into(),
            removed_resources: out.removed.clone(),
            resources: vec![
                resource("c/ns/a", "v1", b"\x08\x01"),
                resource("c/ns/b", "v2", &big),
                resource("e", "", b""),
            ],
            ..Default::default()
        };
        assert_eq!(decoded, expected);
        assert_eq!(out.resources[1].entry().body(), &big[..]);
    }

    #[test]
    fn small_entries_go_in_bounded_pieces_and_large_ones_as_they_are() {
        let small: Vec<_> = (0..300).map(|i| named(&format!("s{i}"), "v", &[1; 1000])).collect();
        let large = named("large", "v", &vec![2; PIECE_BYTES + 10]);
        let mut resources = small.clone();
        resources.insert(150, Arc::clone(&large));
        let out = Outgoing { type_url: "t", resources: resources.into(), removed: vec![], nonce: "1".into() };
        let frames = out.frames();
        assert!(frames
            .iter()
            .all(|f| f.len() <= PIECE_BYTES || f.as_ptr() == large.entry().bytes().as_ptr()));
        assert!(frames.iter().any(|f| f.as_ptr() == large.entry().bytes().as_ptr()), "not copied");
        assert!(frames.len() <= 8, "{} pieces for 300 KB", frames.len());
        let wire: Vec<u8> = frames.iter().flat_map(|b| b.iter().copied()).collect();
        let decoded = DeltaDiscoveryResponse::decode(&wire[5..]).expect("valid");
        assert_eq!(decoded.resources.len(), 301);
        assert_eq!(decoded.resources[150].name, "large");
    }
}
