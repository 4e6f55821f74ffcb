//! `recorder.upload:` each closed capture shipped to S3-compatible object storage, deleted from
//! the node once stored.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, err, ConfigError};

/// `recorder.upload:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Upload {
    /// Whether closed captures are uploaded.
    pub enabled: bool,
    /// The service's URL, `http://` or `https://` ("": AWS S3 in `region`).
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The region the requests are signed for.
    pub region: String,
    /// What every key starts with (`mirror/`: keys under `mirror/`).
    pub prefix: String,
    /// The cluster's name in the keys.
    pub cluster: String,
    /// Requests as `bucket.endpoint/key` (virtual-hosted) rather than `endpoint/bucket/key`.
    pub virtual_hosted: bool,
    /// A directory holding the files `access_key_id` and `secret_access_key` (and, if any,
    /// `session_token`): a Kubernetes Secret mounted as a volume, read again at each upload.
    /// "": the environment's `AWS_*` variables.
    pub credentials_dir: String,
    /// The wait after a failed attempt, doubling at each failure up to `retry_max`.
    #[serde(deserialize_with = "duration")]
    pub retry_min: Duration,
    #[serde(deserialize_with = "duration")]
    pub retry_max: Duration,
    /// The longest one request may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
}

impl Default for Upload {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: String::new(),
            bucket: String::new(),
            region: "us-east-1".into(),
            prefix: String::new(),
            cluster: "default".into(),
            virtual_hosted: false,
            credentials_dir: String::new(),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            timeout: Duration::from_secs(120),
        }
    }
}

/// The files of `credentials_dir`.
pub const KEY_ID_FILE: &str = "access_key_id";
pub const SECRET_FILE: &str = "secret_access_key";
pub const TOKEN_FILE: &str = "session_token";

/// Whether `s` is a segment of a key as written: no `/` at its ends, no empty segment, no
/// `.` or `..`, printable ASCII.
fn valid_key_part(s: &str) -> bool {
    s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && s.bytes().all(|b| b.is_ascii_graphic())
}

impl Upload {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if !self.endpoint.is_empty() {
            let bad = |why: &str| {
                err(
                    "recorder.upload.endpoint",
                    format!(
                        "'{}' {why} (e.g. https://s3.eu-west-1.amazonaws.com, http://minio.storage:9000)",
                        self.endpoint
                    ),
                )
            };
            let url = reqwest::Url::parse(&self.endpoint).map_err(|e| bad(&format!("is not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(bad("is not an http:// or https:// URL"));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(bad("names no host"));
            }
            if url.path() != "/" || url.query().is_some() || !url.username().is_empty() {
                return Err(bad(
                    "must be the service's address only (the bucket goes in recorder.upload.bucket)",
                ));
            }
        }
        // S3's rules for a bucket's name: 3 to 63 lower-case letters, digits, dots and hyphens.
        let b = &self.bucket;
        if b.is_empty() {
            return Err(err("recorder.upload.bucket", "is required when recorder.upload.enabled is true"));
        }
        let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        if b.len() < 3
            || b.len() > 63
            || !b.bytes().all(|c| edge(c) || c == b'.' || c == b'-')
            || !edge(b.as_bytes()[0])
            || !edge(b.as_bytes()[b.len() - 1])
        {
            return Err(err(
                "recorder.upload.bucket",
                format!("'{b}' is not a bucket name (3 to 63 lower-case letters, digits, '.' and '-')"),
            ));
        }
        if self.region.is_empty() || !self.region.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
            return Err(err(
                "recorder.upload.region",
                format!("'{}' is not a region (e.g. us-east-1)", self.region),
            ));
        }
        let prefix = self.prefix.trim_end_matches('/');
        if !prefix.is_empty() && !valid_key_part(prefix) {
            return Err(err(
                "recorder.upload.prefix",
                format!(
                    "'{}' is not a key prefix (printable ASCII, no empty, '.' or '..' segment)",
                    self.prefix
                ),
            ));
        }
        if self.cluster.contains('/') || !valid_key_part(&self.cluster) {
            return Err(err(
                "recorder.upload.cluster",
                format!("'{}' is not a name for the keys (printable ASCII, no '/')", self.cluster),
            ));
        }
        if self.retry_min.is_zero() || self.retry_max < self.retry_min {
            return Err(err(
                "recorder.upload.retry_min",
                "must be more than 0 and at most recorder.upload.retry_max",
            ));
        }
        if self.timeout < Duration::from_secs(1) {
            return Err(err("recorder.upload.timeout", "must be at least 1s"));
        }
        Ok(())
    }

    /// Whether there are credentials to sign with: the files of `credentials_dir`, or else the
    /// environment's (`env` reads a variable): a key pair, a web identity (EKS's IRSA), or a
    /// container's credentials endpoint (EKS Pod Identity, ECS).
    pub fn check_credentials(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if !self.credentials_dir.is_empty() {
            let dir = Path::new(&self.credentials_dir);
            for f in [KEY_ID_FILE, SECRET_FILE] {
                let path = dir.join(f);
                match std::fs::read_to_string(&path) {
                    Ok(s) if !s.trim().is_empty() => {}
                    Ok(_) => {
                        return Err(err(
                            "recorder.upload.credentials_dir",
                            format!("{} is empty", path.display()),
                        ))
                    }
                    Err(e) => {
                        return Err(err(
                            "recorder.upload.credentials_dir",
                            format!(
                                "{}: {e} (a Secret with keys {KEY_ID_FILE} and {SECRET_FILE}, mounted here)",
                                path.display()
                            ),
                        ))
                    }
                }
            }
            return Ok(());
        }
        let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
        match (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
            (true, true) => return Ok(()),
            (true, false) => {
                return Err(err(
                    "recorder.upload",
                    "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not",
                ))
            }
            (false, true) => {
                return Err(err(
                    "recorder.upload",
                    "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not",
                ))
            }
            (false, false) => {}
        }
        if (set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN"))
            || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
            || set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        {
            return Ok(());
        }
        Err(err(
            "recorder.upload",
            "no credentials: set recorder.upload.credentials_dir (a mounted Secret), or AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY in the environment (or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_refused;
    use super::super::Config;

    const ON: &str = "recorder:\n  upload:\n    enabled: true\n    bucket: captures\n";

    #[test]
    fn bad_uploads_are_refused_naming_the_setting() {
        let ok = Config::parse(&format!("{ON}    endpoint: http://127.0.0.1:9000\n")).unwrap();
        assert!(ok.recorder.upload.enabled);
        // Off: nothing asked.
        Config::parse("recorder:\n  upload:\n    bucket: \"\"\n").unwrap();
        let with = |extra: &str| format!("{ON}{extra}");
        assert_refused(&[
            ("recorder:\n  upload:\n    enabled: true\n", "recorder.upload.bucket", "is required"),
            (&with("    endpoint: s3.example\n"), "recorder.upload.endpoint", "is not a URL"),
            (&with("    endpoint: ftp://s3.example\n"), "recorder.upload.endpoint", "http:// or https://"),
            (&with("    endpoint: http://s3.example/captures\n"), "recorder.upload.endpoint", "address only"),
            (
                "recorder:\n  upload:\n    enabled: true\n    bucket: My_Bucket\n",
                "recorder.upload.bucket",
                "not a bucket",
            ),
            (&with("    region: \"\"\n"), "recorder.upload.region", "not a region"),
            (&with("    prefix: a//b\n"), "recorder.upload.prefix", "not a key prefix"),
            (&with("    cluster: a/b\n"), "recorder.upload.cluster", "no '/'"),
            (&with("    retry_min: 0s\n"), "recorder.upload.retry_min", "more than 0"),
            (&with("    retry_max: soon\n"), "recorder.upload.retry_max", "not a duration"),
            (&with("    secret: x\n"), "recorder.upload.secret", "unknown field"),
        ]);
    }

    #[test]
    fn credentials_come_from_files_or_the_environment() {
        let cfg = Config::parse(ON).unwrap().recorder.upload;
        let none = |_: &str| None;
        let e = cfg.check_credentials(&none).unwrap_err();
        assert_eq!(e.path, "recorder.upload");
        assert!(e.reason.contains("no credentials"), "{e}");
        let pair = |k: &str| k.starts_with("AWS_").then(|| "x".to_string());
        cfg.check_credentials(&pair).unwrap();
        let half = |k: &str| (k == "AWS_ACCESS_KEY_ID").then(|| "x".to_string());
        assert!(cfg.check_credentials(&half).unwrap_err().reason.contains("AWS_SECRET_ACCESS_KEY is not"));
        // A mounted Secret: both files, read at load.
        let dir = tempfile::tempdir().unwrap();
        let files = super::Upload { credentials_dir: dir.path().display().to_string(), ..cfg.clone() };
        let e = files.check_credentials(&pair).unwrap_err();
        assert_eq!(e.path, "recorder.upload.credentials_dir");
        assert!(e.reason.contains("access_key_id"), "{e}");
        std::fs::write(dir.path().join("access_key_id"), "AKID\n").unwrap();
        std::fs::write(dir.path().join("secret_access_key"), "").unwrap();
        assert!(files.check_credentials(&none).unwrap_err().reason.contains("is empty"));
        std::fs::write(dir.path().join("secret_access_key"), "s3cr3t").unwrap();
        files.check_credentials(&none).unwrap();
    }
}
