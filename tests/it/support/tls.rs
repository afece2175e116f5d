//! Throw-away TLS material for servers of the tests: a CA, a server certificate for
//! 127.0.0.1 and a client certificate, made with the `openssl` command.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tempfile::TempDir;

/// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made with
/// the `openssl` command in a temporary directory.
pub struct TlsFiles {
    dir: TempDir,
    /// Whether the server demands a client certificate.
    pub require_client_cert: bool,
}

impl TlsFiles {
    /// Generates the files (a second or so of key generation).
    pub fn generate(require_client_cert: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockrun-tls-")
            .tempdir()
            .expect("create tls dir");
        let d = dir.path();
        let ca = "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2";
        openssl(d, ca, Some("CA"));
        fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for who in ["server", "client"] {
            let request = format!("req -newkey rsa:2048 -nodes -keyout {who}.key -out {who}.csr");
            openssl(d, &request, Some(who));
            openssl(
                d,
                &format!(
                    "x509 -req -in {who}.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                     -out {who}.pem -days 2 -extfile {who}.ext"
                ),
                None,
            );
        }
        TlsFiles {
            dir,
            require_client_cert,
        }
    }

    /// The path of one of the files: `ca.pem`, `server.pem`, `server.key`, `client.pem`,
    /// `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(super) fn server_args(&self, tls_port: u16) -> Vec<String> {
        let p = |n: &str| self.path(n).to_string_lossy().into_owned();
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            p("server.pem"),
            "--tls-key-file".into(),
            p("server.key"),
            "--tls-ca-cert-file".into(),
            p("ca.pem"),
            "--tls-auth-clients".into(),
            if self.require_client_cert {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

/// Runs `openssl ARGS` (words without spaces in them) in `dir`, with the subject
/// `/CN=lockrun test SUBJECT` when one is given.
fn openssl(dir: &Path, args: &str, subject: Option<&str>) {
    let mut cmd = Command::new("openssl");
    cmd.args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null());
    if let Some(subject) = subject {
        cmd.args(["-subj", &format!("/CN=lockrun test {subject}")]);
    }
    let out = cmd.output().expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
