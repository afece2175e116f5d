//! Throw-away certificates for the unit tests, made with the `openssl` command.

/// Runs `openssl ARGS` in `dir`.
pub(crate) fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`NAME.pem`) and a server certificate it signed (`NAME-server.pem`,
/// `.key`) for `san`, as EC keys (quick to make).
pub(crate) fn ca_and_server(dir: &std::path::Path, name: &str, san: &str) {
    let ca_key = format!("{name}.key");
    let ca = format!("{name}.pem");
    let subject = format!("/CN=test CA {name}");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
    args.extend(EC);
    args.extend(["-keyout", &ca_key, "-out", &ca]);
    openssl(dir, &args);
    issue(
        dir,
        name,
        &format!("{name}-server"),
        "test server",
        &format!("subjectAltName={san}"),
    );
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// `FILE.pem` and `FILE.key`, from CA `ca` (made by [`ca_and_server`]), with the
/// subject `/CN=CN` and the extension line `ext` (`""` for none).
pub(crate) fn issue(dir: &std::path::Path, ca: &str, file: &str, cn: &str, ext: &str) {
    let (key, csr, pem) = (
        format!("{file}.key"),
        format!("{file}.csr"),
        format!("{file}.pem"),
    );
    let ext_file = format!("{file}.ext");
    std::fs::write(dir.join(&ext_file), format!("{ext}\n")).unwrap();
    let subject = format!("/CN={cn}");
    let mut args = vec!["req", "-subj", &subject];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr]);
    openssl(dir, &args);
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    let mut args = vec![
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_pem,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        &pem,
    ];
    if !ext.is_empty() {
        args.extend(["-extfile", &ext_file]);
    }
    openssl(dir, &args);
}
