//! The few tc netlink requests libbpf does not make: listing the filters of a clsact hook
//! (to leave a qdisc that others use) and the classic cls_bpf + act_mirred filter.
//! Synchronous: one request, read to the ack or the end of the dump.

use std::io;

use netlink_packet_core::{
    DefaultNla, Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption, TcActionType,
    TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcMirror, TcMirrorActionType,
    TcOption,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// ETH_P_ALL in network order, as tc's "protocol all".
const PROTO_ALL_BE: u16 = 0x0003u16.to_be();
/// Netlink attribute of the actions of a bpf filter.
const TCA_BPF_ACT: u16 = 1;

/// A filter on a clsact hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilterId {
    pub prio: u16,
    pub handle: u32,
    pub kind: String,
}

/// The parent handle of a clsact hook.
pub(crate) fn clsact_parent(egress: bool) -> TcHandle {
    TcHandle { major: 0xFFFF, minor: if egress { TcHandle::MIN_EGRESS } else { TcHandle::MIN_INGRESS } }
}

fn request(msg: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;

    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    nl.finalize();
    let mut buf = vec![0u8; nl.header.length as usize];
    nl.serialize(&mut buf);
    sock.send(&buf, 0)?;

    let mut replies = Vec::new();
    let mut rx = Vec::with_capacity(64 * 1024);
    loop {
        rx.clear();
        sock.recv(&mut rx, 0)?;
        let mut off = 0;
        while off < rx.len() {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[off..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(replies), // the ack
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    };
                }
                NetlinkPayload::InnerMessage(m) => replies.push(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

fn tc_message(ifindex: u32, parent: TcHandle, prio: u16, handle: u32) -> TcMessage {
    let mut msg = TcMessage::default();
    msg.header = TcHeader {
        family: AddressFamily::Unspec,
        index: ifindex as i32,
        handle: TcHandle { major: (handle >> 16) as u16, minor: handle as u16 },
        parent,
        info: (u32::from(prio) << 16) | u32::from(PROTO_ALL_BE),
    };
    msg
}

/// The filters on one clsact hook (empty when there is no clsact qdisc).
pub(crate) fn filters(ifindex: u32, egress: bool) -> io::Result<Vec<FilterId>> {
    let mut msg = tc_message(ifindex, clsact_parent(egress), 0, 0);
    msg.header.info = 0;
    let replies = match request(RouteNetlinkMessage::GetTrafficFilter(msg), NLM_F_DUMP) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::ENOENT) => {
            return Ok(Vec::new())
        }
        r => r?,
    };
    let mut out: Vec<FilterId> = Vec::new();
    for m in replies {
        let RouteNetlinkMessage::NewTrafficFilter(f) = m else { continue };
        let kind = f
            .attributes
            .iter()
            .find_map(|a| if let TcAttribute::Kind(k) = a { Some(k.clone()) } else { None })
            .unwrap_or_default();
        let handle = (u32::from(f.header.handle.major) << 16) | u32::from(f.header.handle.minor);
        let id = FilterId { prio: (f.header.info >> 16) as u16, handle, kind };
        // The dump lists each tcf_proto once with handle 0, then each of its filters.
        if handle != 0 && !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// A classic (not direct-action) bpf filter with "action mirred egress mirror dev X continue".
pub(crate) struct MirredFilter<'a> {
    pub ifindex: u32,
    pub egress: bool,
    pub prio: u16,
    pub handle: u32,
    pub prog_fd: i32,
    pub prog_name: &'a str,
    pub mirror_ifindex: u32,
}

/// Adds (or, with `replace`, swaps in place) a [`MirredFilter`].
pub(crate) fn add_mirred_filter(f: &MirredFilter<'_>, replace: bool) -> io::Result<()> {
    let MirredFilter { ifindex, egress, prio, handle, prog_fd, prog_name, mirror_ifindex } = *f;
    let mut generic = TcActionGeneric::default();
    // "continue": after the copy, classification goes on to the next filter.
    generic.action = TcActionType::Unspec;
    let mut parms = TcMirror::default();
    parms.generic = generic;
    parms.eaction = TcMirrorActionType::EgressMirror;
    parms.ifindex = mirror_ifindex;
    let mut action = TcAction::default();
    action.tab = 1;
    action.attributes = vec![
        TcActionAttribute::Kind("mirred".into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(parms))]),
    ];
    let actions = [action];
    let mut act_buf = vec![0u8; actions.as_slice().buffer_len()];
    actions.as_slice().emit(&mut act_buf);

    let mut msg = tc_message(ifindex, clsact_parent(egress), prio, handle);
    msg.attributes = vec![
        TcAttribute::Kind("bpf".into()),
        TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(prog_fd as u32)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(prog_name.into())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::empty())),
            TcOption::Bpf(TcFilterBpfOption::Other(DefaultNla::new(TCA_BPF_ACT, act_buf))),
        ]),
    ];
    let flags = if replace {
        NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    } else {
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    };
    request(RouteNetlinkMessage::NewTrafficFilter(msg), flags).map(drop)
}

/// Deletes the filter (prio, handle) of a clsact hook.
pub(crate) fn del_filter(ifindex: u32, egress: bool, prio: u16, handle: u32) -> io::Result<()> {
    let mut msg = tc_message(ifindex, clsact_parent(egress), prio, handle);
    msg.attributes = vec![TcAttribute::Kind("bpf".into())];
    request(RouteNetlinkMessage::DelTrafficFilter(msg), NLM_F_ACK).map(drop)
}
