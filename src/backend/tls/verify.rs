//! The certificate checks rustls lacks: libpq's `verify-ca` (the chain, any name),
//! `verify-full`'s common-name fallback, and `require` (encrypted, not authenticated).
//! Part of [`super`].

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use super::problem::show_name;

/// Checks the chain as [`WebPkiServerVerifier`] does but accepts any name (libpq
/// `verify-ca`), or a name in the common name where the alternative names have none
/// (libpq `verify-full`): webpki checks the chain (issuer, dates, purpose) before the
/// name, so a name error means the chain was good.
#[derive(Debug)]
pub(super) struct AnyName(pub(super) Arc<WebPkiServerVerifier>, pub(super) NameRule);

/// What [`AnyName`] accepts when the alternative names do not hold the host.
#[derive(Debug, PartialEq)]
pub(super) enum NameRule {
    Any,
    CommonName,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.1 == NameRule::Any => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected,
                presented,
            })) if common_name_applies(&expected, &presented)
                && subject_common_name(end_entity)
                    .is_some_and(|cn| common_name_matches(&cn, &show_name(&expected))) =>
            {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// libpq's rule: the CN counts when the alternative names (`presented`, as webpki
/// shows them) hold no DNS name and, for an IP address, no IP address.
fn common_name_applies(expected: &ServerName<'_>, presented: &[String]) -> bool {
    let has = |kind: &str| presented.iter().any(|n| n.starts_with(kind));
    let is_ip = matches!(expected, ServerName::IpAddress(_));
    let hidden = has("DnsName(") || (is_ip && has("IpAddress("));
    !hidden
}

/// `cn` names `host`: equal, ignoring case, or `*.rest` with `host` one label more
/// than `rest`.
fn common_name_matches(cn: &str, host: &str) -> bool {
    match cn.strip_prefix("*.") {
        Some(rest) => host
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail.eq_ignore_ascii_case(rest)),
        None => cn.eq_ignore_ascii_case(host),
    }
}

/// The last common name (2.5.4.3) of a DER certificate's subject, if it is text.
fn subject_common_name(der: &[u8]) -> Option<String> {
    let (_, certificate, _) = tlv(der)?;
    let (_, tbs, _) = tlv(certificate)?;
    let mut rest = tbs;
    // [0] version (optional), serial, signature, issuer, validity, then the subject.
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (_, mut rdns, _) = tlv(rest)?;
    let mut found = None;
    while !rdns.is_empty() {
        let (_, set, next) = tlv(rdns)?;
        rdns = next;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, next) = tlv(atvs)?;
            atvs = next;
            let (oid_tag, oid, value) = tlv(atv)?;
            let (value_tag, text, _) = tlv(value)?;
            // UTF8String, PrintableString, T61String, IA5String.
            if oid_tag == 0x06
                && oid == [0x55, 0x04, 0x03]
                && [0x0c, 0x13, 0x14, 0x16].contains(&value_tag)
            {
                found = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    found
}

/// One DER element: its tag, its contents and what follows it (`None` where the DER
/// is cut short or longer than 4 GiB).
pub(crate) fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// Accepts any server certificate (libpq's `sslmode=require`) but checks that the
/// handshake was signed with the key of the certificate presented.
#[derive(Debug)]
pub(super) struct EncryptOnly(pub(super) Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
