//! What a reader that starts with the mirror (Wireshark) can decode of a triggered connection:
//! frames from the first copied segment that begins one, header blocks without the dynamic-table
//! entries inserted before.

use super::*;

/// One frame as a reader of the mirror sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenFrame {
    /// Type.
    pub kind: u8,
    /// Stream.
    pub stream: u32,
    /// A header block's first frame: its fields as a late reader decodes them (`<unknown>`
    /// and an empty value for what it cannot resolve).
    pub fields: Option<Fields>,
    /// DATA: the lengths of the gRPC messages that begin in it, its payload read as gRPC's
    /// length-prefixed messages (meaningful on gRPC streams only).
    pub messages: Vec<u32>,
    /// DATA of a stream whose `content-type` this reader decoded as gRPC in this direction.
    pub grpc_known: bool,
}

/// What a reader of the mirror can make of one direction of a triggered connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateDirection {
    /// Sender.
    pub from: SocketAddr,
    /// Receiver.
    pub to: SocketAddr,
    /// Its first mirrored segment begins a frame, and a replayed segment ahead of it, if any,
    /// holds whole frames from a frame's start (else nothing is claimed of it).
    pub aligned: bool,
    /// Why not, when it is not.
    pub unaligned: Option<&'static str>,
    /// The segment replayed ahead of the copies in this direction, when there is one and it is
    /// read.
    pub replayed: Option<PacketId>,
    /// Frames from there on, by the packet that completes each (its id).
    pub frames: BTreeMap<PacketId, Vec<SeenFrame>>,
}

/// What a reader that starts at packet `from` (index in `trace`, the mirror's first packet of
/// `c`) can decode of each direction of `c`: frames from the direction's first segment at or
/// after `from` on, if that segment begins a frame; header blocks decoded without the
/// dynamic-table entries inserted before; gRPC messages in DATA frames of streams whose
/// `content-type` it decoded in that direction. `replayed` are segments the mirror carries
/// ahead of the copies (the request behind a trigger, as the mirror has it, maybe cut): the
/// reader reads their whole frames first. With `from` 0, what a reader of the whole connection
/// decodes.
pub fn late_view(c: &Conversation, trace: &Trace, from: usize, replayed: &[&Packet]) -> Vec<LateDirection> {
    c.directions()
        .map(|d| {
            let mut out = LateDirection {
                from: d.from,
                to: d.to,
                aligned: false,
                unaligned: None,
                replayed: None,
                frames: BTreeMap::new(),
            };
            let not = |why: &'static str| {
                let mut out = out.clone();
                out.unaligned = Some(why);
                out
            };
            let first = trace
                .packets
                .iter()
                .enumerate()
                .skip(from)
                .filter(|(_, p)| p.src == d.from && p.dst == d.to && !p.payload.is_empty())
                .find_map(|(i, _)| d.bytes.offset_of(i));
            // From the start: where the frames begin (after a preface or an upgrade).
            let start = if from == 0 { d.frames.first().map(|f| f.offset) } else { first };
            let Some(start) = start else { return not("no payload from there on") };
            let Some(k) = d.frames.iter().position(|f| f.offset == start) else {
                return not("its first segment from there on begins inside a frame");
            };
            // A replayed segment: the frames it holds whole, if it begins one and cuts none.
            let mut read: Vec<(usize, PacketId)> = Vec::new();
            if let Some(r) = replayed.iter().find(|r| r.src == d.from && r.dst == d.to) {
                let same = |p: &&Packet| {
                    (p.src, p.dst, p.seq, p.ack, p.flags) == (r.src, r.dst, r.seq, r.ack, r.flags)
                };
                let Some(o) = trace.packets.iter().position(|p| same(&p)).and_then(|i| d.bytes.offset_of(i))
                else {
                    return not("the replayed segment is not in the capture");
                };
                let (begin, end) = (if o == 0 { d.frames_at } else { o }, o + r.payload.len());
                let Some(j) = d.frames.iter().position(|f| f.offset == begin) else {
                    return not("the replayed segment begins inside a frame");
                };
                for (i, f) in
                    d.frames.iter().enumerate().skip(j).take_while(|(_, f)| f.offset < end.min(start))
                {
                    if f.offset + 9 + f.len > end {
                        return not("the replayed segment ends inside a frame");
                    }
                    read.push((i, r.id()));
                }
                out.replayed = Some(r.id());
            }
            read.extend(d.frames.iter().enumerate().skip(k).map(|(i, f)| (i, trace.packets[f.packet].id())));
            out.aligned = true;
            let mut decoder = LateDecoder::new(from != 0);
            let mut grpc_streams: BTreeSet<u32> = BTreeSet::new();
            let blocks: BTreeMap<usize, &Block> = d.blocks.iter().map(|b| (b.frame, b)).collect();
            for (i, id) in read {
                let f = &d.frames[i];
                let fields = blocks.get(&i).map(|b| {
                    let fields = decoder.decode(&b.encoded);
                    let grpc =
                        fields.iter().any(|(n, v)| n == "content-type" && v.starts_with("application/grpc"));
                    if grpc {
                        grpc_streams.insert(b.stream);
                    }
                    fields
                });
                let data = f.kind == frame::DATA;
                let seen = SeenFrame {
                    kind: f.kind,
                    stream: f.stream,
                    fields,
                    messages: if data { grpc_messages(&f.data) } else { Vec::new() },
                    grpc_known: data && grpc_streams.contains(&f.stream),
                };
                out.frames.entry(id).or_default().push(seen);
            }
            out
        })
        .collect()
}

/// The lengths of the gRPC messages (5-byte prefix: flag, length) that a DATA payload holds,
/// read from its start.
fn grpc_messages(data: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 5 <= data.len() {
        let len = u32::from_be_bytes(data[off + 1..off + 5].try_into().unwrap());
        out.push(len);
        off += 5 + len as usize;
    }
    out
}

/// An HPACK decoder that may have joined late: a reference to a dynamic-table entry it did not
/// see decodes to an unknown name and an empty value, and an entry inserted with an unknown
/// name keeps it unknown (Wireshark's way). Strings and the static table are `loona-hpack`'s.
pub(super) struct LateDecoder {
    /// Newest first: (name, value), `None` where unknown.
    table: VecDeque<(Option<String>, Option<String>)>,
    size: usize,
    max: usize,
    late: bool,
}

/// A field a late reader cannot name.
pub const UNKNOWN: &str = "<unknown>";

impl LateDecoder {
    pub(super) fn new(late: bool) -> LateDecoder {
        LateDecoder { table: VecDeque::new(), size: 0, max: 4096, late }
    }

    fn entry(&self, index: usize) -> (Option<String>, Option<String>) {
        if (1..=61).contains(&index) {
            let (n, v) = static_entry(index);
            return (Some(n), Some(v));
        }
        match self.table.get(index.wrapping_sub(62)) {
            Some(e) => e.clone(),
            None if self.late => (None, None),
            None => panic!("HPACK index {index} beyond a table seen from the start"),
        }
    }

    fn insert(&mut self, e: (Option<String>, Option<String>)) {
        let size = |e: &(Option<String>, Option<String>)| {
            e.0.as_deref().unwrap_or(UNKNOWN).len() + e.1.as_deref().unwrap_or("").len() + 32
        };
        self.size += size(&e);
        self.table.push_front(e);
        self.evict(size);
    }

    fn evict(&mut self, size: impl Fn(&(Option<String>, Option<String>)) -> usize) {
        while self.size > self.max {
            let Some(old) = self.table.pop_back() else { break };
            self.size -= size(&old);
        }
    }

    /// The block's fields, `<unknown>`/empty where unresolved; a malformed block yields the
    /// fields before the fault.
    pub(super) fn decode(&mut self, block: &[u8]) -> Fields {
        let mut out = Vec::new();
        let mut off = 0;
        while off < block.len() {
            let b = block[off];
            let (field, insert) = if b & 0x80 != 0 {
                let Some((index, n)) = integer(&block[off..], 7) else { break };
                off += n;
                (self.entry(index), false)
            } else if b & 0xe0 == 0x20 {
                let Some((max, n)) = integer(&block[off..], 5) else { break };
                off += n;
                self.max = max;
                self.evict(|e| {
                    e.0.as_deref().unwrap_or(UNKNOWN).len() + e.1.as_deref().unwrap_or("").len() + 32
                });
                continue;
            } else {
                let (prefix, insert) = if b & 0x40 != 0 { (6, true) } else { (4, false) };
                let Some((index, n)) = integer(&block[off..], prefix) else { break };
                off += n;
                let name = if index == 0 {
                    let Some((s, n)) = string(&block[off..]) else { break };
                    off += n;
                    Some(s)
                } else {
                    self.entry(index).0
                };
                let Some((value, n)) = string(&block[off..]) else { break };
                off += n;
                ((name, Some(value)), insert)
            };
            out.push((
                field.0.clone().unwrap_or_else(|| UNKNOWN.to_string()),
                field.1.clone().unwrap_or_default(),
            ));
            if insert {
                self.insert(field);
            }
        }
        out
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541, 5.1): value and bytes taken.
fn integer(buf: &[u8], n: u8) -> Option<(usize, usize)> {
    let mask = (1usize << n) - 1;
    let mut value = usize::from(*buf.first()?) & mask;
    if value < mask {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (i, b) in buf.iter().enumerate().skip(1) {
        value = value.checked_add(usize::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    None
}

/// An HPACK string literal (Huffman-coded or raw): the text and bytes taken.
fn string(buf: &[u8]) -> Option<(String, usize)> {
    let huffman = *buf.first()? & 0x80 != 0;
    let (len, n) = integer(buf, 7)?;
    let raw = buf.get(n..n + len)?;
    let bytes: Cow<[u8]> =
        if huffman { Cow::Owned(HuffmanDecoder::new().decode(raw).ok()?) } else { Cow::Borrowed(raw) };
    Some((String::from_utf8_lossy(&bytes).into_owned(), n + len))
}

/// Entry `index` (1 to 61) of HPACK's static table, as `loona-hpack` has it.
fn static_entry(index: usize) -> (String, String) {
    let fields = Decoder::new().decode(&[0x80 | index as u8]).expect("a static table entry");
    text(fields.into_iter().next().expect("one field"))
}
