//! Trigger events: read from the data path's ring buffer as they come (see [`Events::wait`]),
//! the request behind a noresponse mark replayed at once ([`Replayer`]), completed with what
//! user space knows (the interface's name, the connection's other tuple across NAT, the
//! rule's text, the wall-clock time, Community IDs), logged, and handed to the
//! [`EventLog`] (the API's ring and `events.output`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use mirror_bpf::flow::{monotonic_ns, NatTuples};
use mirror_bpf::{Datapath, EventRing, FlowKey, Side, TriggerEvent, TriggerKind};

use super::attached::AttachedLinks;
use super::replay::{ReplayCounts, Replayer};
use crate::community_id;
use crate::event_log::EventLog;
use crate::views::{DropView, EventView, RequestView, TupleView};

/// The ring buffer of trigger events and what its callback has read.
pub(super) struct Events {
    ring: EventRing<'static>,
    rx: mpsc::Receiver<TriggerEvent>,
    log: Arc<EventLog>,
    replayer: Replayer,
}

impl Events {
    /// Opens the data path's ring buffer; events go to `log`. `budget`: whether a node-wide
    /// budget of copies is set.
    pub(super) fn open(dp: &Datapath<'static>, log: Arc<EventLog>, budget: bool) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let ring = dp.events(move |e| {
            let _ = tx.send(e);
        })?;
        Ok(Self { ring, rx, log, replayer: Replayer::new(budget) })
    }

    /// Waits at most `timeout` for an event in the ring buffer or for `wake` (an eventfd) to be
    /// readable, whichever comes first; reads `wake` back to zero.
    pub(super) fn wait(&self, wake: &impl AsRawFd, timeout: Duration) {
        let mut fds = [
            libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.ring.epoll_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of the length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n > 0 && fds[0].revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: an eventfd is read 8 bytes at a time, into `v`.
            unsafe { libc::read(wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
    }

    /// Replays go to the sink `ifindex` (0: none), whose egress runs the replay program.
    pub(super) fn set_replay_sink(&mut self, ifindex: u32) {
        self.replayer.set_sink(ifindex);
    }

    /// What the agent replayed.
    pub(super) fn replays(&self) -> ReplayCounts {
        self.replayer.counts()
    }

    /// Reads what the ring buffer holds, replays the request behind each noresponse mark, logs
    /// each trigger and records it.
    pub(super) fn drain(&mut self, dp: &Datapath<'_>, attached: &AttachedLinks) {
        if let Err(e) = self.ring.consume() {
            tracing::warn!(error = %e, "reading trigger events");
        }
        while let Ok(e) = self.rx.try_recv() {
            // First: the replay (or a drop's copy) is due now.
            let copied = self.replayer.on_event(&e);
            let mut ev = complete(&e, dp, attached);
            if let (Some(d), Some(view)) = (&e.dropped, &mut ev.drop) {
                view.copied_ms = copied.map(ms);
                tracing::info!(
                    rule = e.rule_id,
                    reason = %d.reason_name(),
                    location = %view.location,
                    server = %ev.server_side.server,
                    client = %ev.client_side.client,
                    interface = %ev.interface,
                    copied_ms = view.copied_ms,
                    community_id = %ev.client_side.community_id,
                    "drop: the kernel dropped a pod's packet; flow mirrored"
                );
                self.log.push(ev);
                continue;
            }
            tracing::info!(
                rule = e.rule_id,
                kind = %e.kind,
                by = e.by.map_or("-", |b| b.name()),
                status = e.status,
                grpc_status = e.grpc_status_name(),
                rcode = e.rcode_name(),
                proto = e.proto.map_or("-", |p| p.name()),
                stream = e.stream,
                authority = e.authority.as_deref(),
                server = %ev.server_side.server,
                client = %ev.client_side.client,
                method = e.method.as_deref().unwrap_or("-"),
                target = e.target.as_deref().unwrap_or("-"),
                qname = e.dns.as_ref().map(|q| q.qname.as_str()),
                qtype = e.dns.as_ref().map(|q| q.qtype),
                dns_id = e.dns.as_ref().map(|q| q.id),
                request_missing = e.request_state.missing(),
                response_ms = ev.response_ms,
                after_request_ms = ev.after_request_ms,
                interface = %ev.interface,
                nat = ev.nat.then(|| format!("{} -> {}", ev.client_side.server, ev.server_side.server)),
                community_id = %ev.client_side.community_id,
                "trigger: flow mirrored"
            );
            self.log.push(ev);
        }
    }
}

fn tuple((client, server): (SocketAddr, SocketAddr), proto: u8) -> TupleView {
    TupleView {
        client: client.to_string(),
        server: server.to_string(),
        community_id: community_id::v1(client, server, proto),
    }
}

/// Milliseconds, rounded to the microsecond.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Whether a trigger of `kind` ends its request's answer (a status line, gRPC trailers, a DNS
/// response): its time is the response's.
fn answered(kind: TriggerKind) -> bool {
    matches!(kind, TriggerKind::Status | TriggerKind::Grpc | TriggerKind::Dns)
}

/// The DNS fields of an event (`None`s for the other protocols): rcode and its name, question
/// name, type and its name, message id.
fn dns_fields(e: &TriggerEvent, view: &mut EventView) {
    if e.kind == TriggerKind::Dns {
        view.rcode = Some(e.status);
        view.rcode_name = e.rcode_name().map(Into::into);
    }
    if let Some(q) = &e.dns {
        view.qname = (!q.qname.is_empty()).then(|| q.qname.clone());
        view.qtype = (q.qtype != 0).then_some(q.qtype);
        view.qtype_name = mirror_bpf::rule::dns::qtype_name(q.qtype).map(Into::into);
        view.id = Some(q.id);
    }
}

/// The tuples of a connection whose packet the kernel dropped after translating it: `seen`,
/// the packet as the kernel held it (client, server), and `other`, conntrack's other key of the
/// connection. When `other` holds the client, it is the tuple the client sent (to a Service's
/// address, before the DNAT), and the packet's is the server's.
fn drop_nat_tuples(seen: (SocketAddr, SocketAddr), other: &FlowKey) -> Option<NatTuples> {
    let (client, _) = seen;
    let service = if other.lo == client {
        other.hi
    } else if other.hi == client {
        other.lo
    } else {
        return None;
    };
    Some(NatTuples { client_side: (client, service), server_side: seen })
}

/// The event as the API shows it (`seq` is set by the log).
fn complete(e: &TriggerEvent, dp: &Datapath<'_>, attached: &AttachedLinks) -> EventView {
    let proto = e.key.proto;
    // (sender, receiver) of the packet that triggered (of the request, for noresponse), then
    // (client, server) of the tuple it was seen under: the server sends a response.
    let sent = if e.reverse { (e.key.hi, e.key.lo) } else { (e.key.lo, e.key.hi) };
    let by_client =
        matches!(e.kind, TriggerKind::NoResponse | TriggerKind::Drop) || e.by == Some(Side::Client);
    let seen = if by_client { sent } else { (sent.1, sent.0) };
    let nat = match &e.nat {
        Some(other) => dp
            .nat_tuples(&e.key)
            .unwrap_or_else(|err| {
                tracing::debug!(error = %err, "reading the NAT tuples of a trigger");
                None
            })
            // A dropped connection's first packet: conntrack never confirmed it, so the
            // classifier has not recorded its tuples; the drop program sent conntrack's other.
            .or_else(|| (e.kind == TriggerKind::Drop).then(|| drop_nat_tuples(seen, other)).flatten()),
        None => None,
    };
    let (client_side, server_side) = match nat {
        Some(t) => (t.client_side, t.server_side),
        None => (seen, seen),
    };
    let age = Duration::from_nanos(monotonic_ns().saturating_sub(e.ts_ns));
    let when = SystemTime::now().checked_sub(age).unwrap_or_else(SystemTime::now);
    let mut view = EventView {
        seq: 0,
        time: chrono::DateTime::<chrono::Utc>::from(when)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        interface: attached.get(e.ifindex).map(|a| a.name.clone()).unwrap_or_default(),
        pod: None,
        labels: BTreeMap::new(),
        ifindex: e.ifindex,
        hook: if e.egress { "egress" } else { "ingress" }.into(),
        client_side: tuple(client_side, proto),
        server_side: tuple(server_side, proto),
        nat: nat.is_some(),
        rule_id: e.rule_id,
        rule: dp
            .rule_slots()
            .into_iter()
            .find(|(id, _, _)| *id == e.rule_id)
            .map(|(_, _, r)| r.to_string())
            .unwrap_or_default(),
        kind: e.kind.name().into(),
        by: e.by.map(|b| b.name().into()),
        status: e.status,
        status_name: e.grpc_status_name().map(Into::into),
        proto: e.proto.map(|p| p.name().into()),
        stream: e.stream,
        authority: e.authority.clone(),
        method: e.method.clone(),
        target: e.target.clone(),
        response_ms: if answered(e.kind) { e.request_to_response.map(ms) } else { None },
        after_request_ms: if answered(e.kind) { None } else { e.request_to_response.map(ms) },
        request_missing: e.request_state.missing().map(Into::into),
        request: e.request.as_ref().and_then(|r| {
            let payload = r.payload()?;
            let headers = r.frame.len() - payload.len();
            Some(RequestView {
                // A DNS message is binary: its question is in the event's own fields.
                text: if e.dns.is_some() {
                    String::new()
                } else {
                    String::from_utf8_lossy(payload).into_owned()
                },
                bytes: payload.len(),
                cut: r.wire_len as usize > r.frame.len(),
                before_ms: ms(Duration::from_nanos(e.ts_ns.saturating_sub(r.ts_ns))),
                replayed: headers > 0 && dp.settings().is_ok_and(|s| s.replay_ifindex != 0),
            })
        }),
        ..EventView::default()
    };
    dns_fields(e, &mut view);
    view.drop = e.dropped.as_ref().map(|d| DropView {
        reason: d.reason_name(),
        location: crate::kallsyms::name(d.location),
        bytes: d.frame.len(),
        wire_bytes: d.wire_len,
        copied_ms: None,
    });
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirror_bpf::{DnsQuestion, FlowKey, HttpProto, RequestState};

    fn dns_event(status: u16, qtype: u16) -> TriggerEvent {
        TriggerEvent {
            kind: TriggerKind::Dns,
            by: Some(Side::Server),
            key: FlowKey {
                lo: "198.18.0.2:40000".parse().unwrap(),
                hi: "198.18.0.3:53".parse().unwrap(),
                proto: 17,
            },
            nat: None,
            ts_ns: 1,
            rule_id: 2,
            status,
            ifindex: 3,
            egress: false,
            reverse: true,
            proto: Some(HttpProto::Dns),
            stream: None,
            authority: None,
            method: None,
            target: None,
            dns: Some(DnsQuestion { id: 0x1a2b, qtype, qname: "web.shop.svc.cluster.local".into() }),
            request_to_response: Some(Duration::from_micros(1200)),
            request_state: RequestState::Named,
            request: None,
            dropped: None,
        }
    }

    #[test]
    fn a_drop_after_a_services_dnat_has_both_tuples() {
        let seen: (SocketAddr, SocketAddr) =
            ("198.18.1.2:40000".parse().unwrap(), "198.18.2.2:80".parse().unwrap());
        let original = FlowKey::new(seen.0, "198.19.0.10:80".parse().unwrap(), 6);
        let t = drop_nat_tuples(seen, &original).expect("translated");
        assert_eq!(t.client_side, (seen.0, "198.19.0.10:80".parse().unwrap()));
        assert_eq!(t.server_side, seen);
        // Conntrack's other key without the client (masqueraded): not said.
        let masqueraded = FlowKey::new("198.18.0.1:5000".parse().unwrap(), seen.1, 6);
        assert!(drop_nat_tuples(seen, &masqueraded).is_none());
    }

    #[test]
    fn dns_events_name_their_question_and_rcode() {
        let mut v = EventView::default();
        dns_fields(&dns_event(3, 28), &mut v);
        assert_eq!((v.rcode, v.rcode_name.as_deref()), (Some(3), Some("NXDOMAIN")));
        assert_eq!(
            (v.qname.as_deref(), v.qtype, v.qtype_name.as_deref()),
            (Some("web.shop.svc.cluster.local"), Some(28), Some("AAAA"))
        );
        assert_eq!(v.id, Some(0x1a2b));
        let mut v = EventView::default();
        dns_fields(&dns_event(14, 99), &mut v);
        assert_eq!((v.rcode, v.rcode_name, v.qtype, v.qtype_name), (Some(14), None, Some(99), None));
        assert!(answered(TriggerKind::Dns), "its time is the answer's");
        // Other kinds carry none of them.
        let http = TriggerEvent {
            kind: TriggerKind::Status,
            dns: None,
            proto: Some(HttpProto::Http1),
            ..dns_event(500, 1)
        };
        let mut v = EventView::default();
        dns_fields(&http, &mut v);
        assert_eq!(v, EventView::default());
    }
}
