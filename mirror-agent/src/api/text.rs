//! The views as text, the same in mirrorctl's tables and the agent's Kubernetes Events.

/// What triggered, as the tables show it: the status (`500`), `grpc 13 INTERNAL` (a gRPC
/// code, its name when gRPC names it), `reset` (`reset by server` when `by` is known),
/// `noresponse`. `kind` is a [`mirror_bpf::TriggerKind`] name (`None`: `status`).
pub fn trigger_text(kind: Option<&str>, status: u16, by: Option<&str>) -> String {
    match (kind.unwrap_or("status"), by) {
        ("status", _) => status.to_string(),
        ("grpc-status", _) => match mirror_bpf::rule::grpc::grpc_status_name(status) {
            Some(name) => format!("grpc {status} {name}"),
            None => format!("grpc {status}"),
        },
        ("reset", Some(by)) => format!("reset by {by}"),
        (kind, _) => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_are_named() {
        assert_eq!(trigger_text(None, 500, None), "500");
        assert_eq!(trigger_text(Some("status"), 503, Some("server")), "503");
        assert_eq!(trigger_text(Some("grpc-status"), 13, Some("server")), "grpc 13 INTERNAL");
        assert_eq!(trigger_text(Some("grpc-status"), 0, None), "grpc 0 OK");
        assert_eq!(trigger_text(Some("grpc-status"), 42, None), "grpc 42");
        assert_eq!(trigger_text(Some("reset"), 0, Some("client")), "reset by client");
        assert_eq!(trigger_text(Some("reset"), 0, None), "reset");
        assert_eq!(trigger_text(Some("noresponse"), 0, None), "noresponse");
    }
}
