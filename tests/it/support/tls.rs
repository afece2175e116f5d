//! Throw-away TLS material for servers of the tests: a CA, a server certificate for
//! 127.0.0.1 and a client certificate, made with the `openssl` command.

use std::fs;
use std::os::unix::fs::PermissionsExt;
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

/// A throw-away CA of a test's own that issues server and client certificates for any
/// name, valid now or expired (EC P-256 keys: quick to make), with the `openssl`
/// command (and `faketime` for an expired one) in a temporary directory.
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// A CA whose subject is `/CN=lockrun test CA NAME` (give each CA its own name: a
    /// verifier looks a certificate's issuer up by name).
    pub fn new(name: &str) -> TestCa {
        let dir = tempfile::Builder::new()
            .prefix("lockrun-ca-")
            .tempdir()
            .expect("create CA dir");
        openssl(
            dir.path(),
            &format!("req -x509 {EC} -keyout ca.key -out ca.pem -days 2"),
            Some(&format!("CA {name}")),
        );
        TestCa { dir }
    }

    /// The CA's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Issues a certificate with the subject `/CN=CN` and the extension line `ext` (say
    /// `subjectAltName=IP:127.0.0.1`), valid for two days, or (with `expired`) for a
    /// day in 2020; returns its certificate and key (mode 0600, as libpq wants), named
    /// after `file`.
    pub fn issue(&self, file: &str, cn: &str, ext: &str, expired: bool) -> (PathBuf, PathBuf) {
        self.issue_signed(file, cn, ext, expired, "sha256")
    }

    /// [`TestCa::issue`], signed with the digest `digest` (`sha256`, `sha384`, ...).
    pub fn issue_signed(
        &self,
        file: &str,
        cn: &str,
        ext: &str,
        expired: bool,
        digest: &str,
    ) -> (PathBuf, PathBuf) {
        let d = self.dir.path();
        fs::write(d.join(format!("{file}.ext")), format!("{ext}\n")).unwrap();
        let mut req = Command::new("openssl");
        req.args(format!("req {EC} -keyout {file}.key -out {file}.csr").split_whitespace())
            .args(["-subj", &format!("/CN={cn}")])
            .current_dir(d)
            .stdin(Stdio::null());
        succeed(req, "openssl req");
        let sign = format!(
            "x509 -req -in {file}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out \
             {file}.pem -days {} -extfile {file}.ext -{digest}",
            if expired { 1 } else { 2 }
        );
        let mut x509 = if expired {
            let mut c = Command::new("faketime");
            c.args(["2020-01-01 00:00:00", "openssl"]);
            c
        } else {
            Command::new("openssl")
        };
        x509.args(sign.split_whitespace())
            .current_dir(d)
            .stdin(Stdio::null());
        succeed(x509, "openssl x509 -req");
        let key = d.join(format!("{file}.key"));
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        (d.join(format!("{file}.pem")), key)
    }
}

/// An EC P-256 key, unencrypted, for `openssl req`.
const EC: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

fn succeed(mut cmd: Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
